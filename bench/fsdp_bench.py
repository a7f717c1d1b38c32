"""./x bench fsdp: FSDP training steps against replicated data parallelism, one process and
PyTorch's own FSDP2, in one run.

    ./x bench fsdp [--ranks 2,4] [--layers 8] [--dim 512] [--batch 16] [--steps 10] [--plot]

A model of --layers Linear(dim, dim) + ReLU blocks trained with AdamW, --batch rows per rank.
For each world size, one job of that many processes (the engine on its shm backend) runs, in
turn and each from the same weights:
  fsdp       dtensor.fsdp.fully_shard on every block, then the root (reshard after forward)
  replicated the model on every rank; one all_reduce of the flattened gradients per step (DDP's
             algorithm, through the engine's functional collectives)
  pytorch    torch.distributed.fsdp.fully_shard, the same calls, on a Gloo group of the same
             processes
and rank 0 runs one process on the whole batch (the ranks' rows together). Every side must end
with the one process's loss (checked; a wrong answer is no benchmark).

Per side: ms per step (median of the steps after the first), the training state each rank holds
(parameters, gradients, AdamW's moments: bytes of its local pieces), the peak resident memory the
steps added (VmHWM after resetting it, /proc/self/clear_refs), and the bytes each rank sends per
step by the algorithm (ring all-gather and reduce-scatter send (W-1)/W of the full tensor,
all-reduce twice that). One JSON line per side and world size:
  {"bench":"fsdp","side":"fsdp","ranks":2,"ms_per_step":..,"state_bytes":..,"peak_rss_bytes":..,
   "comm_bytes":..,"ratio_state_to_one":..,"ratio_time_to_pytorch":..}
"""

import argparse
import copy
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def model(args):
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.dim, args.dim), nn.ReLU()]
    return nn.Sequential(*layers)


def batches(args, world):
    import torch

    g = torch.Generator().manual_seed(1)
    return [(torch.randn(world * args.batch, args.dim, generator=g),
             torch.randn(world * args.batch, args.dim, generator=g)) for _ in range(args.steps)]


def _is_dtensor(t):
    """The engine's distributed tensors and PyTorch's (both have to_local)."""
    from dtensor import DTensor
    return isinstance(t, DTensor) or type(t).__name__ == "DTensor"


def state_bytes(m, opt):
    import torch

    def nbytes(t):
        t = t.to_local() if _is_dtensor(t) else t
        return t.numel() * t.element_size()

    total = 0
    for p in m.parameters():
        total += nbytes(p) + (nbytes(p.grad) if p.grad is not None else 0)
        for v in opt.state.get(p, {}).values():
            if torch.is_tensor(v) and v.dim() > 0:
                total += nbytes(v)
    return total


def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def run_side(name, m, opt, data, rank, world, args, before_step=None):
    """Trains on this rank's rows; returns (ms per step, last loss mean over ranks, state, peak)."""
    import torch

    rows = slice(rank * args.batch, (rank + 1) * args.batch)
    times, loss = [], None
    reset_peak()
    base = peak_rss()
    for x, y in data:
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = (m(x[rows]) - y[rows]).pow(2).mean()
        loss.backward()
        if before_step is not None:
            before_step()
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
    peak = peak_rss() - base
    return statistics.median(times[1:] or times), loss.detach(), state_bytes(m, opt), peak


def comm_bytes(side, param_bytes, world, groups_regathered=True):
    share = (world - 1) / world
    if side == "replicated":
        return int(2 * param_bytes * share)
    gathers = 2 if groups_regathered else 1  # forward, and again for backward after resharding
    return int((gathers + 1) * param_bytes * share)  # + one reduce-scatter of the gradients


def rank_main(args):
    import torch
    import torch.distributed as dist

    import dtensor
    from dtensor import _functional_collectives as fc
    from dtensor.fsdp import fully_shard

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    mesh = dtensor.init_device_mesh("cpu", (world,))
    base = model(args)
    data = batches(args, world)
    param_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
    results = {}

    def mean_loss(loss):
        t = loss.reshape(1).double()
        return fc.all_reduce(t, "sum", group=mesh).wait().item() / world

    # The engine's FSDP.
    m = copy.deepcopy(base)
    for layer in m:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(m, mesh=mesh)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    ms, loss, state, peak = run_side("fsdp", m, opt, data, rank, world, args)
    results["fsdp"] = (ms, mean_loss(loss), state, peak, comm_bytes("fsdp", param_bytes, world))
    del m, opt

    # Replicated data parallelism: one all_reduce of the flattened gradients (DDP's algorithm).
    m = copy.deepcopy(base)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)

    def all_reduce_grads():
        grads = [p.grad for p in m.parameters()]
        flat = fc.all_reduce(torch.cat([g.reshape(-1) for g in grads]), "sum",
                             group=mesh).wait() / world
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    ms, loss, state, peak = run_side("replicated", m, opt, data, rank, world, args,
                                     all_reduce_grads)
    results["replicated"] = (ms, mean_loss(loss), state, peak,
                             comm_bytes("replicated", param_bytes, world))
    del m, opt

    # PyTorch's FSDP2 on a Gloo group of the same processes.
    pt_error = None
    try:
        from torch.distributed.device_mesh import init_device_mesh as pt_mesh
        from torch.distributed.fsdp import fully_shard as pt_fully_shard

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.anchor_port}",
                                rank=rank, world_size=world)
        pmesh = pt_mesh("cpu", (world,))
        m = copy.deepcopy(base)
        for layer in m:
            if isinstance(layer, torch.nn.Linear):
                pt_fully_shard(layer, mesh=pmesh)
        pt_fully_shard(m, mesh=pmesh)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        ms, loss, state, peak = run_side("pytorch", m, opt, data, rank, world, args)
        t = loss.reshape(1).double()
        dist.all_reduce(t)
        results["pytorch"] = (ms, t.item() / world, state, peak,
                              comm_bytes("pytorch", param_bytes, world))
        dist.barrier()
        dist.destroy_process_group()
    except Exception as e:  # reported, never hidden: the row says why it is missing
        pt_error = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"

    if rank != 0:
        return 0
    # One process on the whole batch.
    m = copy.deepcopy(base)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    one_args = copy.copy(args)
    one_args.batch = args.batch * world
    ms, loss, state, peak = run_side("one", m, opt, data, 0, 1, one_args)
    results["one process"] = (ms, loss.item(), state, peak, 0)
    one_loss, one_state = loss.item(), state

    failed = False
    print(f"\n{world} ranks: {args.layers} x Linear({args.dim}, {args.dim}), "
          f"{param_bytes / 2**20:.1f} MiB of parameters, {args.batch} rows per rank, AdamW, "
          f"{args.steps} steps")
    print(f"{'side':<12} {'ms/step':>8} {'state/rank':>11} {'vs one':>7} {'peak RSS +':>11} "
          f"{'sent/step':>10} {'final loss':>11}")
    pt_ms = results["pytorch"][0] if "pytorch" in results else None
    for side, (ms, loss, state, peak, sent) in results.items():
        ok = abs(loss - one_loss) <= 1e-4 * max(1.0, abs(one_loss))
        failed |= not ok
        print(f"{side:<12} {ms:>8.2f} {state / 2**20:>9.2f}Mi {state / one_state:>6.2f}x "
              f"{peak / 2**20:>9.1f}Mi {sent / 2**20:>8.2f}Mi {loss:>11.6f}"
              f"{'' if ok else '  WRONG: differs from one process'}")
        row = {"bench": "fsdp", "side": side.replace(" ", "_"), "ranks": world,
               "ms_per_step": round(ms, 3), "state_bytes": state, "peak_rss_bytes": peak,
               "comm_bytes": sent, "ratio_state_to_one": round(state / one_state, 4),
               "loss": loss, "equal_to_one_process": ok}
        if pt_ms is not None:
            row["ratio_time_to_pytorch"] = round(ms / pt_ms, 4)
        print(json.dumps(row, separators=(",", ":")))
    if pt_error is not None:
        print(f"pytorch: PyTorch's FSDP2 did not run here: {pt_error}")
        print(json.dumps({"bench": "fsdp", "side": "pytorch", "ranks": world,
                          "error": pt_error}, separators=(",", ":")))
    return 1 if failed else 0


def launch(args, argv, world):
    port, anchor = free_port(), free_port()
    procs = []
    with tempfile.TemporaryFile() as others:
        for rank in range(world):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--anchor-port", str(anchor)] + argv,
                env=env, stdout=None if rank == 0 else others,
                stderr=None if rank == 0 else subprocess.STDOUT))
        codes = [p.wait() for p in procs]
        if any(codes):
            others.seek(0)
            sys.stderr.write(others.read().decode(errors="replace"))
            sys.stderr.write(f"fsdp bench: exit codes {codes}\n")
            return 1
    return 0


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--anchor-port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if "RANK" in os.environ:
        return rank_main(args)
    rc = 0
    for world in [int(w) for w in args.ranks.split(",") if w]:
        rc = launch(args, argv, world) or rc
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
