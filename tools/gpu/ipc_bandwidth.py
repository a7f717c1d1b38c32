"""Bus bandwidth of the cuda_ipc backend (NOTE [cuda_ipc backend]) with the ranks sharing one GPU,
against that GPU's device-to-device copy bandwidth measured in the same run (the target:
all_gather and reduce_scatter busbw >= 0.7x the copy at 64 MiB). Run by tools/gpu/check.sh:
    python3 tools/launch.py -n 2 -- python3 tools/gpu/ipc_bandwidth.py
One JSON line per measurement on rank 0 ("bench" key). busbw follows nccl-tests: all_gather
output bytes x (n-1)/n / time, reduce_scatter input bytes x (n-1)/n / time. The copy's bandwidth
counts the bytes copied once (nccl-tests' convention for a copy), measured on rank 0 while the
other ranks wait at a barrier."""

import json
import os
import time

import torch

from dtensor import _functional_collectives as funcol
from dtensor.device_mesh import default_backend

MIB = 1 << 20


def timed(fn, reps):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


def main():
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local % torch.cuda.device_count())
    backend = default_backend("cuda")
    funcol.init_from_env(backend)
    n, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    reps = int(os.environ.get("IPC_BENCH_REPS", "10"))
    out_bytes = 64 * MIB
    copy_gbs = None
    if rank == 0:
        src = torch.empty(out_bytes // 4, device="cuda")
        dst = torch.empty_like(src)
        t = timed(lambda: dst.copy_(src), reps)
        copy_gbs = out_bytes / t / 1e9
        print(json.dumps({"bench": "cuda_ipc", "what": "device copy", "bytes": out_bytes,
                          "us": round(t * 1e6, 1), "gbs": round(copy_gbs, 1)}), flush=True)
    funcol.all_reduce(torch.zeros(1, device="cuda"))  # the ranks meet (calls wait by default)
    shard = torch.ones(out_bytes // 4 // n, device="cuda")
    full = torch.ones(out_bytes // 4, device="cuda")
    rows = []
    for name, fn, want in (("all_gather", lambda: funcol.all_gather_into_tensor(shard, 0), 1.0),
                           ("reduce_scatter", lambda: funcol.reduce_scatter_tensor(full, "sum", 0),
                            float(n))):
        funcol.all_reduce(torch.zeros(1, device="cuda"))
        got = fn()  # a wrong answer is no benchmark
        assert bool((got == want).all()), f"{name}: a wrong result on rank {rank}"
        t = timed(fn, reps)
        busbw = out_bytes * (n - 1) / n / t / 1e9
        rows.append((name, t, busbw))
    if rank == 0:
        for name, t, busbw in rows:
            print(json.dumps({"bench": "cuda_ipc", "what": name, "backend": backend, "ranks": n,
                              "bytes": out_bytes, "us": round(t * 1e6, 1),
                              "busbw_gbs": round(busbw, 1),
                              "ratio_to_copy": round(busbw / copy_gbs, 3)}), flush=True)


if __name__ == "__main__":
    main()
