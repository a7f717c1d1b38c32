"""The distributed tensor on CUDA, one rank (NOTE [GPU check] in tools/gpu/check.sh).

Runs each user-facing path of the dtensor package on a 1-rank NCCL mesh of CUDA tensors and says
for each whether it ran, whether every local piece lives on the mesh's device, and whether the
result equals the same computation on plain CUDA tensors. Then times per-call costs (dtensor,
plain, and PyTorch's own torch.distributed.tensor in the same run) and prints one JSON line per
op with a "bench" key. Ends with "probe: N passed, N failed". Without a GPU it says so and exits 0
(nothing to check), so the script can be tried on a CPU machine for syntax and imports.
"""

import json
import os
import socket
import statistics
import sys
import time
import traceback

import torch


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RESULTS = []


def check(name):
    def wrap(fn):
        try:
            msg = fn()
            RESULTS.append((name, True, msg or ""))
            print(f"PASS {name} {msg or ''}", flush=True)
        except Exception as e:  # noqa: BLE001 - the probe reports every failure
            RESULTS.append((name, False, f"{type(e).__name__}: {e}"))
            print(f"FAIL {name}: {type(e).__name__}: {str(e)[:400]}", flush=True)
            traceback.print_exc(limit=3)
        return fn
    return wrap


def on_cuda(t, what):
    local = t.to_local() if hasattr(t, "placements") else t
    if local.device.type != "cuda":
        raise AssertionError(f"{what}: local piece on {local.device}, mesh is cuda")


def close(a, b, what, atol=1e-5):
    a = a.full_tensor() if hasattr(a, "placements") else a
    if a.device != b.device:
        raise AssertionError(f"{what}: result on {a.device}, expected {b.device}")
    if not torch.allclose(a, b, atol=atol, rtol=1e-5):
        raise AssertionError(f"{what}: max diff {(a - b).abs().max().item()}")


def per_call_us(fn, calls=2000, reps=5):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(times)


def main():
    if not torch.cuda.is_available():
        print("probe: no GPU here; nothing to check (0 passed, 0 failed)")
        return 0
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    import dtensor
    from dtensor import DTensor, Replicate, Shard, distribute_tensor, init_device_mesh
    torch.cuda.set_device(0)
    mesh = init_device_mesh("cuda", (1,))
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    a = torch.randn(8, 16, device=dev)
    b = torch.randn(16, 4, device=dev)

    @check("from_local ops (add mm sum relu full_tensor redistribute)")
    def _():
        da = DTensor.from_local(a, mesh, [Shard(0)])
        db = DTensor.from_local(b, mesh, [Replicate()])
        close(da + da, a + a, "add")
        close(torch.mm(da, db), a @ b, "mm")
        close(da.sum(), a.sum(), "sum")
        close(torch.relu(da), torch.relu(a), "relu")
        r = da.redistribute(mesh, [Replicate()])
        on_cuda(r, "redistribute")
        close(r, a, "redistribute")

    @check("from_local run_check")
    def _():
        d = DTensor.from_local(a, mesh, [Replicate()], run_check=True)
        on_cuda(d, "from_local(run_check)")

    @check("distribute_tensor")
    def _():
        for pl in ([Shard(0)], [Shard(1)], [Replicate()]):
            d = distribute_tensor(a, mesh, pl)
            on_cuda(d, f"distribute_tensor {pl}")
            close(d, a, f"distribute_tensor {pl}")

    @check("factories on the mesh's device")
    def _():
        for name in ("empty", "zeros", "ones", "rand", "randn"):
            d = getattr(dtensor, name)(8, 8, device_mesh=mesh, placements=[Shard(0)])
            on_cuda(d, f"dtensor.{name}")
        on_cuda(dtensor.full((8, 8), 2.0, device_mesh=mesh, placements=[Shard(0)]), "full")

    @check("parallelize_module colwise + rowwise, forward and backward")
    def _():
        from dtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
        torch.manual_seed(1)
        ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                  torch.nn.Linear(32, 16)).to(dev)
        import copy
        tp = parallelize_module(copy.deepcopy(ref), mesh,
                                {"0": ColwiseParallel(), "2": RowwiseParallel()})
        x = torch.randn(4, 16, device=dev)
        out, out_ref = tp(x), ref(x)
        close(out, out_ref, "TP forward")
        out.sum().backward()
        out_ref.sum().backward()
        close(tp[0].weight.grad, ref[0].weight.grad, "TP weight grad")

    @check("loss_parallel")
    def _():
        from dtensor.parallel import loss_parallel
        logits = torch.randn(4, 10, device=dev, requires_grad=True)
        target = torch.randint(0, 10, (4,), device=dev)
        d = distribute_tensor(logits.detach(), mesh, [Shard(1)]).requires_grad_()
        with loss_parallel():
            loss = torch.nn.functional.cross_entropy(d, target)
            loss.backward()
        ref = torch.nn.functional.cross_entropy(logits, target)
        close(loss, ref, "loss")

    @check("mesh device type: Python and C++ agree, on the current device")
    def _():
        if mesh.device_type != "cuda" or mesh._mesh.device_type != "cuda":
            raise AssertionError(f"python {mesh.device_type}, C++ {mesh._mesh.device_type}")
        if mesh._mesh.local_device() != f"cuda:{torch.cuda.current_device()}":
            raise AssertionError(f"C++ local device {mesh._mesh.local_device()}")
        return repr(mesh._mesh)

    @check("distribute_tensor of a CPU tensor (moved to the mesh's device)")
    def _():
        for src_data_rank in (0, None):
            d = distribute_tensor(a.cpu(), mesh, [Shard(0)], src_data_rank=src_data_rank)
            on_cuda(d, f"distribute_tensor(cpu, src_data_rank={src_data_rank})")
            close(d, a, "distribute_tensor(cpu)")

    @check("from_local of a CPU piece (moved; its gradient flows back to the CPU)")
    def _():
        cpu = a.cpu().requires_grad_()
        d = DTensor.from_local(cpu, mesh, [Shard(0)], run_check=True)
        on_cuda(d, "from_local(cpu piece)")
        (d * 3).sum().backward()
        if cpu.grad is None or cpu.grad.device.type != "cpu":
            raise AssertionError(f"grad {None if cpu.grad is None else cpu.grad.device}")

    @check("*_like, new_*, random ops and dropout on the mesh's device")
    def _():
        d = DTensor.from_local(a, mesh, [Shard(0)])
        for name, t in (("zeros_like", torch.zeros_like(d)), ("ones_like", torch.ones_like(d)),
                        ("new_zeros", d.new_zeros(3)), ("rand_like", torch.rand_like(d)),
                        ("randn_like", torch.randn_like(d)), ("uniform_", d.clone().uniform_()),
                        ("dropout", torch.nn.functional.dropout(d, 0.5))):
            on_cuda(t, name)
        dtensor.manual_seed(3)
        r = dtensor.rand(8, 4, device_mesh=mesh, placements=[Shard(0)])
        # NOTE [random on a CUDA mesh]: one CUDA device's values (the GPU's generator).
        torch.manual_seed(3)
        close(r, torch.rand(8, 4, device=dev), "rand (one CUDA device's values)")

    @check("replicate fallback (histc) on the mesh's device")
    def _():
        d = DTensor.from_local(a, mesh, [Shard(0)])
        h = torch.histc(d, bins=5)
        on_cuda(h, "histc")
        close(h, torch.histc(a, bins=5), "histc")

    @check("parallelize_module of a CPU module, SequenceParallel, embedding")
    def _():
        import copy
        from dtensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                      parallelize_module)
        torch.manual_seed(2)
        ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                  torch.nn.Linear(32, 16), torch.nn.LayerNorm(16)).to(dev)
        tp = parallelize_module(copy.deepcopy(ref).cpu(), mesh,
                                {"0": ColwiseParallel(), "2": RowwiseParallel(),
                                 "3": SequenceParallel()})
        for name, p in tp.named_parameters():
            on_cuda(p, f"parameter {name}")
        x = torch.randn(4, 16, device=dev)
        out, out_ref = tp(x), ref(x)
        close(out, out_ref, "TP forward")
        out.sum().backward()
        out_ref.sum().backward()
        for (name, p), p_ref in zip(tp.named_parameters(), ref.parameters()):
            on_cuda(p.grad, f"grad {name}")
            close(p.grad, p_ref.grad, f"grad {name}", atol=1e-4)
        emb = torch.nn.Embedding(10, 8).to(dev)
        tp_emb = parallelize_module(copy.deepcopy(emb), mesh, RowwiseParallel())
        idx = torch.randint(0, 10, (3, 5), device=dev)
        close(tp_emb(idx), emb(idx), "embedding")

    @check("loss_parallel backward")
    def _():
        from dtensor.parallel import loss_parallel
        logits = torch.randn(4, 10, device=dev, requires_grad=True)
        target = torch.randint(0, 10, (4,), device=dev)
        d = distribute_tensor(logits.detach(), mesh, [Shard(1)]).requires_grad_()
        with loss_parallel():
            torch.nn.functional.cross_entropy(d, target).backward()
        torch.nn.functional.cross_entropy(logits, target).backward()
        on_cuda(d.grad, "loss_parallel grad")
        close(d.grad, logits.grad, "loss_parallel grad")

    @check("checkpoint save, then load into a CUDA mesh")
    def _():
        import tempfile

        import dtensor.checkpoint as dcp
        with tempfile.TemporaryDirectory() as tmp:
            dcp.save({"w": distribute_tensor(a, mesh, [Shard(0)]), "step": 3},
                     checkpoint_id=f"{tmp}/ck")
            state = {"w": dtensor.zeros(8, 16, device_mesh=mesh, placements=[Replicate()]),
                     "step": 0}
            dcp.load(state, checkpoint_id=f"{tmp}/ck")
        on_cuda(state["w"], "checkpoint.load")
        close(state["w"], a, "checkpoint.load")

    # Per-call costs: dtensor vs plain, and PyTorch's DTensor on the same device in this run.
    da = DTensor.from_local(a, mesh, [Shard(0)])
    db = DTensor.from_local(b, mesh, [Replicate()])
    ops = {"add": (lambda x, y: x + x), "mm": (lambda x, y: torch.mm(x, y)),
           "sum": (lambda x, y: x.sum()), "relu": (lambda x, y: torch.relu(x)),
           "view": (lambda x, y: x.view(-1)), "t": (lambda x, y: x.t())}
    pt = None
    try:
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor as PTDTensor
        from torch.distributed.tensor import Replicate as PR
        from torch.distributed.tensor import Shard as PS
        if not dist.is_initialized():
            dist.init_process_group("nccl", rank=0, world_size=1,
                                    init_method=f"tcp://127.0.0.1:{free_port()}")
        from torch.distributed.device_mesh import init_device_mesh as pt_mesh
        pm = pt_mesh("cuda", (1,))
        pt = (PTDTensor.from_local(a, pm, [PS(0)]), PTDTensor.from_local(b, pm, [PR()]))
    except Exception as e:  # noqa: BLE001
        print(f"PyTorch DTensor unavailable: {e}")
    for name, fn in ops.items():
        d_us = per_call_us(lambda: fn(da, db))
        p_us = per_call_us(lambda: fn(a, b))
        row = {"bench": "python_cuda", "op": name, "dtensor_us": round(d_us, 2),
               "local_us": round(p_us, 2), "ratio": round(d_us / p_us, 3)}
        if pt is not None:
            t_us = per_call_us(lambda: fn(*pt))
            row.update(pytorch_us=round(t_us, 2), ratio_to_pytorch=round(d_us / t_us, 3))
        print(json.dumps(row), flush=True)

    failed = [r for r in RESULTS if not r[1]]
    print(f"probe: {len(RESULTS) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
