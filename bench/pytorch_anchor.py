"""PyTorch's own DTensor beside the engine, in the same processes of one run:
./x bench python runs these after its own rows (python_bench.py --no-anchor skips them).

per_call (a 1-process job, mesh (1)): add, mm, sum, view, t, relu on DTensor.from_local pieces
  ([8,16] S(0), mm with a [16,4] R: small, so the per-call cost shows), the engine's dtensor against torch.distributed.tensor on
  the same device and the plain tensors; interleaved loops, medians of --reps.
  {"bench":"python","op":"add","mesh":1,"device":"cpu","dtensor_us":..,"local_us":..,"ratio":..,
   "pytorch_us":..,"ratio_to_pytorch":..}
tp_linear_step (a 2-process job, mesh (2)): nn.Linear(256, 256) under parallelize_module with
  ColwiseParallel, input [--batch, 256]; zero_grad, forward, local output's sum, backward, SGD
  step. The engine on its shm backend, PyTorch on a Gloo group of the same processes (the
  engine's package and PyTorch's, each with its own parallelize_module). Both start from the
  same weights and must end with the same ones (checked).
  {"bench":"python","op":"tp_linear_step","ranks":2,"dtensor_us":..,"pytorch_us":..,
   "ratio_to_pytorch":..}
"""

import json
import os
import statistics

from bench_util import per_call_us

OPS = {
    "add": lambda x, y: x + x,
    "mm": lambda x, y: x.mm(y),
    "sum": lambda x, y: x.sum(),
    "view": lambda x, y: x.view(-1),
    "t": lambda x, y: x.t(),
    "relu": lambda x, y: x.relu(),
}


def _pytorch_group(device):
    """torch.distributed's default group over this job's processes (its own TCP port: the
    engine's rendezvous owns MASTER_PORT)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(
            "nccl" if device == "cuda" else "gloo",
            init_method=f"tcp://127.0.0.1:{os.environ['DTENSOR_ANCHOR_PORT']}",
            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))


def _close_group():
    """Ends torch.distributed's group on every rank together (a rank that exits with Gloo's
    threads still running aborts: "terminate called without an active exception")."""
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


def _loop(fn, x, y):
    def run(n):
        for _ in range(n):
            fn(x, y)
    return run


def _sync(device):
    import torch
    if device == "cuda":
        torch.cuda.synchronize()


def per_call(args):
    import torch
    from torch.distributed.device_mesh import init_device_mesh as pt_mesh
    from torch.distributed.tensor import DTensor as PTDTensor
    from torch.distributed.tensor import Replicate as PR
    from torch.distributed.tensor import Shard as PS

    from dtensor import DTensor, Replicate, Shard, init_device_mesh

    device = args.device
    _pytorch_group(device)
    mesh, pmesh = init_device_mesh(device, (1,)), pt_mesh(device, (1,))
    torch.manual_seed(0)
    # tools/gpu/cuda_probe.py's shapes: small, so the rows show the per-call cost, not the math.
    a = torch.randn(8, 16, device=device)
    b = torch.randn(16, 4, device=device)
    sides = {
        "dtensor": (DTensor.from_local(a, mesh, [Shard(0)]),
                    DTensor.from_local(b, mesh, [Replicate()])),
        "pytorch": (PTDTensor.from_local(a, pmesh, [PS(0)]),
                    PTDTensor.from_local(b, pmesh, [PR()])),
        "local": (a, b),
    }
    rows = []
    for name, fn in OPS.items():
        # Both distributed tensors must give the plain result (a wrong answer is no benchmark).
        want = fn(a, b)
        for side in ("dtensor", "pytorch"):
            got = fn(*sides[side])
            torch.testing.assert_close(got.full_tensor(), want, msg=f"{side} {name}")
        loops = {side: _loop(fn, *xy) for side, xy in sides.items()}
        for run in loops.values():
            run(args.anchor_calls // 10)
        # NOTE [ratios per window]: this machine's speed drifts by up to 2x within seconds (a
        # shared VM), so the three sides run in short interleaved windows and each ratio is the
        # median of the ratios taken window by window, never a ratio of medians taken at
        # different times.
        times = {side: [] for side in loops}
        for _ in range(args.reps * 3):
            for side, run in loops.items():
                _sync(device)
                times[side].append(per_call_us(run, max(1, args.anchor_calls // 3)))
        med = {side: statistics.median(ts) for side, ts in times.items()}

        def ratio(num, den):
            return statistics.median(n / d for n, d in zip(times[num], times[den]))

        rows.append({"bench": "python", "op": name, "mesh": 1, "device": device,
                     "dtensor_us": round(med["dtensor"], 3), "local_us": round(med["local"], 3),
                     "ratio": round(ratio("dtensor", "local"), 3),
                     "pytorch_us": round(med["pytorch"], 3),
                     "ratio_to_pytorch": round(ratio("dtensor", "pytorch"), 3)})
    _close_group()
    print(f"per call on a 1-rank {device} mesh, {args.reps * 3} interleaved windows of "
          f"{max(1, args.anchor_calls // 3)} calls, ratios per window (median); torch "
          f"{torch.__version__}")
    print(f"{'op':<6} {'dtensor_us':>10} {'pytorch_us':>10} {'local_us':>9} {'vs local':>9} "
          f"{'vs PyTorch':>10}")
    for r in rows:
        print(f"{r['op']:<6} {r['dtensor_us']:>10.2f} {r['pytorch_us']:>10.2f} "
              f"{r['local_us']:>9.2f} {r['ratio']:>8.2f}x {r['ratio_to_pytorch']:>9.2f}x")
    for r in rows:
        print(json.dumps(r, separators=(",", ":")))


def tp_linear_step(args):
    import torch
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh as pt_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel as PTColwise
    from torch.distributed.tensor.parallel import parallelize_module as pt_parallelize

    from dtensor import init_device_mesh
    from dtensor.parallel import ColwiseParallel, parallelize_module

    rank = int(os.environ["RANK"])
    _pytorch_group("cpu")
    mesh, pmesh = init_device_mesh("cpu", (2,)), pt_mesh("cpu", (2,))
    torch.manual_seed(0)
    ref = nn.Linear(256, 256)
    x = torch.randn(args.batch, 256)
    models = {
        "dtensor": parallelize_module(_copy(ref), mesh, ColwiseParallel()),
        "pytorch": pt_parallelize(_copy(ref), pmesh, PTColwise()),
    }
    opts = {k: torch.optim.SGD(m.parameters(), lr=1e-3) for k, m in models.items()}

    def loop(side):
        model, opt = models[side], opts[side]

        def run(n):
            for _ in range(n):
                opt.zero_grad()
                model(x).sum().backward()  # ColwiseParallel hands back the local output
                opt.step()
        return run

    loops = {side: loop(side) for side in models}
    for run in loops.values():
        run(3)
    times = {side: [] for side in loops}
    for _ in range(args.reps * 3):  # NOTE [ratios per window]
        for side, run in loops.items():
            times[side].append(per_call_us(run, max(1, args.anchor_steps // 3)))
    # The same number of steps on both: the same weights (the engine's step is PyTorch's step).
    w = {side: m.weight.full_tensor() for side, m in models.items()}
    torch.testing.assert_close(w["dtensor"], w["pytorch"], msg="tp_linear_step weights")
    _close_group()
    if rank != 0:
        return
    d, p = statistics.median(times["dtensor"]), statistics.median(times["pytorch"])
    r = statistics.median(a / b for a, b in zip(times["dtensor"], times["pytorch"]))
    print(f"tp_linear_step (nn.Linear(256, 256), ColwiseParallel, batch {args.batch}, 2 "
          f"processes; engine on shm, PyTorch on Gloo): dtensor {d:.1f} us, PyTorch {p:.1f} us, "
          f"{r:.3f}x (median of the per-window ratios)")
    print(json.dumps({"bench": "python", "op": "tp_linear_step", "ranks": 2,
                      "dtensor_us": round(d, 2), "pytorch_us": round(p, 2),
                      "ratio_to_pytorch": round(r, 4)}, separators=(",", ":")))


def _copy(module):
    import copy
    return copy.deepcopy(module)
