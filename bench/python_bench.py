"""./x bench python: what torch ops on distributed tensors cost from Python, against the same op
on the local pieces (dt.to_local()).

Mesh (2). Ranks are 2 processes by default (--mode procs: this script starts itself twice with
torchrun's variables, backend shm; rank 0 times and prints, rank 1 runs the same loops, silently
unless it fails), or 2 threads of one process (--mode threads: dtensor.run_threads; both ranks
then share the GIL, which the per-op numbers include). Intra-op threads: 1 per rank.

  add          [8] S(0) + [8] S(0)                     vs  local [4] + [4]
  mm           torch.mm([16,16] S(0), [16,16] R)       vs  local mm([8,16], [16,16])
  linear_step  nn.Linear(256, 256), weight S(0), bias S(0) (ColwiseParallel-like), input
               [B,256] replicated: zero_grad, loss = out.sum(), backward, SGD step
               vs  the same step on nn.Linear(256, 128) (the local shard's size), input [B,256]

add and mm need no communication (checked: no collective inside their loops) and are timed on a
propagation-cache hit (warmed up first; checked: no cache miss inside the timed loops). Times:
median over --reps of per-call averages of N calls each (the Python loop is on both sides),
garbage collector off inside the loops (as timeit does), dtensor and local loops interleaved.
One JSON object per op:
  {"bench":"python","op":"add","dtensor_us":...,"local_us":...,"ratio":...}
and the matmul FLOPs of one linear_step on rank 0 next to the whole step in one process
(dtensor.debug.FlopCounterMode; NOTE [compute in the cost model]: ratio 1 is 1/2 per rank):
  {"bench":"python","op":"linear_step_flops","ranks":2,"single_flops":...,"per_rank_flops":...,
   "ratio":...}

Then PyTorch's own DTensor side by side (bench/pytorch_anchor.py: per call on a 1-rank mesh, and
the TP linear step on 2 processes; --no-anchor skips it, --device cuda runs only its per-call
rows, on the GPU).

Then (procs mode; --c10d-ranks, default 2 and 4 processes) torch.distributed.all_reduce of float32
tensors of --c10d-sizes bytes on the engine's torch.distributed backend ("dtensor", NOTE [dtensor
c10d backend]) and on a gloo group of the same processes, interleaved in one run, medians of 5
loops: {"bench":"python","op":"c10d_all_reduce","ranks":2,"bytes":...,"dtensor_us":...,
"gloo_us":...,"ratio_to_gloo":...}
"""

import argparse
import copy
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import free_port, launch_self, per_call_us  # noqa: E402

ADD_RATIO_TARGET = 2.0  # dt + dt on a cache hit: at most 2x t + t


def parse_args(argv):
    p = argparse.ArgumentParser(prog="./x bench python", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["procs", "threads"], default="procs",
                   help="ranks as 2 processes (default) or 2 threads of this process")
    p.add_argument("--reps", type=int, default=9, help="repetitions (median reported)")
    p.add_argument("--add-calls", type=int, default=20000, help="calls per add loop")
    p.add_argument("--mm-calls", type=int, default=10000, help="calls per mm loop")
    p.add_argument("--step-calls", type=int, default=300, help="steps per linear_step loop")
    p.add_argument("--batch", type=int, default=32, help="linear_step input rows")
    p.add_argument("--backend", default=None,
                   help="procs mode: collectives backend (default $DTENSOR_BACKEND or shm)")
    p.add_argument("--c10d-ranks", default="2,4",
                   help="procs mode: rank counts of the torch.distributed all_reduce rows "
                        "(backend dtensor next to gloo); empty: skip them")
    p.add_argument("--c10d-sizes", default="4096,65536,1048576,33554432,67108864",
                   help="all_reduce sizes in bytes (float32)")
    p.add_argument("--no-anchor", action="store_true",
                   help="skip PyTorch's DTensor side by side (bench/pytorch_anchor.py)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cuda: only the per-call rows against PyTorch's DTensor, on the GPU")
    p.add_argument("--anchor-calls", type=int, default=5000, help="calls per per-call loop")
    p.add_argument("--anchor-steps", type=int, default=100, help="steps per tp_linear_step loop")
    return p.parse_args(argv)


# --- timed loops (the same function runs the dtensor and the local side) ------------------------

def loop_add(x, y, n):
    for _ in range(n):
        x + y


def loop_mm(x, y, n):
    mm = __import__("torch").mm
    for _ in range(n):
        mm(x, y)


def loop_step(model, x, opt, n):
    for _ in range(n):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()


MATMUL_OPS = {"mm", "addmm", "bmm", "baddbmm", "mv", "addmv", "dot", "addbmm", "addr"}


def matmul_flops(counter):
    """The matmul family's FLOPs in a dtensor.debug.FlopCounterMode."""
    return sum(n for op, n in counter.get_flop_counts()["Global"].items()
               if op.__name__.split(".")[-1] in MATMUL_OPS)


# --- one rank -----------------------------------------------------------------------------------

def body(rank, args):
    import torch
    from torch import nn

    import dtensor
    from dtensor import Replicate, Shard, distribute_tensor, init_device_mesh
    from dtensor import _functional_collectives as funcol
    from dtensor.debug import CommDebugMode, FlopCounterMode, propagation_cache_stats

    mesh = init_device_mesh("cpu", (2,))

    def barrier():
        funcol.all_reduce(torch.zeros(1), "sum", mesh)

    def dist(t, placements):
        return distribute_tensor(t, mesh, placements, src_data_rank=None)

    torch.manual_seed(0)  # the same data on every rank (src_data_rank=None keeps each piece)
    cases = []

    a, b = dist(torch.randn(8), [Shard(0)]), dist(torch.randn(8), [Shard(0)])
    la, lb = a.to_local(), b.to_local()
    torch.testing.assert_close((a + b).to_local(), la + lb)
    cases.append(("add", args.add_calls, lambda n: loop_add(a, b, n), lambda n: loop_add(la, lb, n),
                  True))

    m1, m2 = dist(torch.randn(16, 16), [Shard(0)]), dist(torch.randn(16, 16), [Replicate()])
    lm1, lm2 = m1.to_local(), m2.to_local()
    torch.testing.assert_close(torch.mm(m1, m2).to_local(), torch.mm(lm1, lm2))
    cases.append(("mm", args.mm_calls, lambda n: loop_mm(m1, m2, n),
                  lambda n: loop_mm(lm1, lm2, n), True))

    ref = nn.Linear(256, 256)
    dmod = nn.Linear(256, 256)
    dmod.weight = nn.Parameter(dist(ref.weight.detach().clone(), [Shard(0)]))
    dmod.bias = nn.Parameter(dist(ref.bias.detach().clone(), [Shard(0)]))
    x = dist(torch.randn(args.batch, 256), [Replicate()])
    lmod = nn.Linear(256, 128)
    with torch.no_grad():
        lmod.weight.copy_(dmod.weight.to_local())
        lmod.bias.copy_(dmod.bias.to_local())
    lx = x.to_local()
    dopt = torch.optim.SGD(dmod.parameters(), lr=1e-4)
    lopt = torch.optim.SGD(lmod.parameters(), lr=1e-4)
    # Counts are read right after each with-block: dtensor.debug.CommDebugMode's counter goes on
    # counting while the object lives.
    with CommDebugMode() as comm, FlopCounterMode(display=False) as dflops:
        loop_step(dmod, x, dopt, 1)
    step_comms = (comm.get_total_counts(), comm.get_comm_counts())
    # The same step of the whole nn.Linear(256, 256) in one process, FLOPs counted alike (NOTE
    # [compute in the cost model]: each rank should run 1/2 of its matmul FLOPs).
    whole = copy.deepcopy(ref)
    with FlopCounterMode(display=False) as sflops:
        loop_step(whole, x.to_local(), torch.optim.SGD(whole.parameters(), lr=1e-4), 1)
    step_flops = (matmul_flops(sflops), matmul_flops(dflops))
    loop_step(lmod, lx, lopt, 1)
    # Same math on this rank's piece: the distributed step must update it as the local one does.
    torch.testing.assert_close(dmod.weight.to_local(), lmod.weight.detach())
    torch.testing.assert_close(dmod.bias.to_local(), lmod.bias.detach())
    cases.append(("linear_step", args.step_calls, lambda n: loop_step(dmod, x, dopt, n),
                  lambda n: loop_step(lmod, lx, lopt, n), False))

    results = []
    for name, calls, dfn, lfn, hit_only in cases:
        warm = max(1, calls // 10)
        barrier()
        with CommDebugMode() as comm:
            dfn(warm)
        ncomm = comm.get_total_counts()
        if hit_only and ncomm != 0:
            raise RuntimeError(f"{name}: {ncomm} collectives in the loop (this case must need "
                               f"none): {comm.get_comm_counts()}")
        lfn(warm)
        misses = 0
        dts, lts = [], []
        for _ in range(args.reps):
            barrier()
            before = propagation_cache_stats()["misses"]
            dts.append(per_call_us(dfn, calls))
            misses += propagation_cache_stats()["misses"] - before
            barrier()
            lts.append(per_call_us(lfn, calls))
        if hit_only and misses != 0:
            raise RuntimeError(f"{name}: {misses} propagation-cache misses in the timed loops")
        d, lo = statistics.median(dts), statistics.median(lts)
        results.append(dict(op=name, calls=calls, dtensor_us=d, local_us=lo, ratio=d / lo,
                            misses=misses, spread=(min(dts), max(dts), min(lts), max(lts))))
    barrier()
    if rank != 0:
        return None

    mode = "2 threads of one process (dtensor.run_threads)"
    if args.mode == "procs":
        mode = f"2 processes ({os.environ.get('DTENSOR_BACKEND') or 'shm'})"
    print(f"python bench: mesh (2), ranks: {mode}; rank 0 times, rank 1 runs the same loops; "
          f"torch {torch.__version__}, intra-op threads {torch.get_num_threads()}, "
          f"median of {args.reps} reps")
    print(f"linear_step collectives per step (rank 0): {step_comms[0]} {step_comms[1]}")
    print(f"linear_step matmul FLOPs per step: one process {step_flops[0]}, rank 0 "
          f"{step_flops[1]} ({step_flops[1] / (step_flops[0] / 2):.2f} x one process's / 2)")
    print()
    hdr = (f"{'op':<12} {'calls':>6} {'dtensor_us':>11} {'local_us':>9} {'ratio':>7}   "
           f"{'dtensor min..max':>17} {'local min..max':>17}")
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        dmin, dmax, lmin, lmax = r["spread"]
        print(f"{r['op']:<12} {r['calls']:>6} {r['dtensor_us']:>11.3f} {r['local_us']:>9.3f} "
              f"{r['ratio']:>6.2f}x   {dmin:>8.3f}..{dmax:<8.3f} {lmin:>8.3f}..{lmax:<8.3f}")
    print("(add, mm: propagation-cache hits, no collectives in the loops; times in us per call)")
    print()
    add = next(r for r in results if r["op"] == "add")
    verdict = "met" if add["ratio"] <= ADD_RATIO_TARGET else "NOT met"
    print(f"target: dt + dt (cache hit) <= {ADD_RATIO_TARGET:g}x t + t: measured "
          f"{add['ratio']:.2f}x / target {ADD_RATIO_TARGET:.2f}x ({verdict}; "
          f"{add['dtensor_us']:.3f} us vs {add['local_us']:.3f} us)")
    for r in results:
        print(json.dumps({"bench": "python", "op": r["op"],
                          "dtensor_us": round(r["dtensor_us"], 4),
                          "local_us": round(r["local_us"], 4),
                          "ratio": round(r["ratio"], 4)}, separators=(",", ":")))
    print(json.dumps({"bench": "python", "op": "linear_step_flops", "ranks": 2,
                      "single_flops": step_flops[0], "per_rank_flops": step_flops[1],
                      "ratio": round(step_flops[1] / (step_flops[0] / 2), 4)},
                     separators=(",", ":")))
    sys.stdout.flush()
    return None


# --- torch.distributed.all_reduce: backend "dtensor" next to gloo ------------------------------

def c10d_body(rank, args):
    """One rank: the default group on backend "dtensor" and a gloo group over the same ranks, the
    same all_reduce on each, interleaved; rank 0 prints one JSON line per size."""
    import torch
    import torch.distributed as dist

    import dtensor  # noqa: F401  (registers the backend)

    dist.init_process_group(backend="dtensor")
    gloo = dist.new_group(backend="gloo")
    n = dist.get_world_size()
    for nbytes in [int(b) for b in args.c10d_sizes.split(",")]:
        t = torch.ones(nbytes // 4)
        calls = max(3, min(200, (8 << 20) // nbytes))
        times = {"dtensor": [], "gloo": []}
        for group in (None, gloo):  # warm-up
            dist.all_reduce(t, group=group)
        for _ in range(5):
            for name, group in (("dtensor", None), ("gloo", gloo)):
                dist.barrier(group=gloo)
                t0 = time.perf_counter()
                for _ in range(calls):
                    dist.all_reduce(t, group=group)
                times[name].append((time.perf_counter() - t0) / calls * 1e6)
        if rank == 0:
            d, g = statistics.median(times["dtensor"]), statistics.median(times["gloo"])
            print(json.dumps({"bench": "python", "op": "c10d_all_reduce", "ranks": n,
                              "bytes": nbytes, "dtensor_us": round(d, 1), "gloo_us": round(g, 1),
                              "ratio_to_gloo": round(g / d, 2)}), flush=True)
    dist.destroy_process_group()


# --- entry points -------------------------------------------------------------------------------

def main(argv):
    args = parse_args(argv)
    if args.mode == "threads":
        import torch

        import dtensor

        torch.set_num_threads(1)
        dtensor.run_threads(2, lambda rank: body(rank, args))
        return 0
    if "RANK" not in os.environ:
        rc = 0
        if args.device == "cpu":
            rc = launch_self(argv, args, __file__)
            for n in [int(x) for x in args.c10d_ranks.split(",") if x]:
                rc = rc or launch_self(argv, args, __file__, n, {"DTENSOR_BENCH_C10D": "1"})
        if not args.no_anchor:
            # PyTorch's DTensor in the same run (bench/pytorch_anchor.py).
            anchors = [("per_call", 1)] + ([("tp_linear_step", 2)] if args.device == "cpu" else [])
            for what, n in anchors:
                rc = rc or launch_self(argv, args, __file__, n, {"DTENSOR_BENCH_ANCHOR": what,
                                                       "DTENSOR_ANCHOR_PORT": str(free_port())})
        return rc
    import torch

    torch.set_num_threads(1)
    anchor = os.environ.get("DTENSOR_BENCH_ANCHOR")
    if anchor:
        import pytorch_anchor

        getattr(pytorch_anchor, anchor)(args)
    elif os.environ.get("DTENSOR_BENCH_C10D") == "1":
        c10d_body(int(os.environ["RANK"]), args)
    else:
        body(int(os.environ["RANK"]), args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
