"""./x bench pp: pipeline schedules on the engine against one process and PyTorch's own
torch.distributed.pipelining, in one run.

    ./x bench pp [--ranks 4] [--schedules gpipe,1f1b,interleaved_1f1b,zero_bubble]
                 [--microbatches 8] [--layers 16] [--dim 512] [--rows 32] [--steps 6]
                 [--repeats 3] [--only cross_mesh]

A model of --layers Linear(dim, dim) + Tanh blocks, split into equal stages: one stage per rank
for gpipe and 1f1b, two per rank for the interleaved schedules (stage k on rank k mod ranks), a
mean-squared-error loss on the last stage, SGD. Each step runs --microbatches microbatches of
--rows rows. Every side runs in processes of its own, from the same weights on the same data:
  engine       dtensor.pipelining on the engine (its shm backend between the ranks)
  pytorch      torch.distributed.pipelining, the same stages and schedule, on a Gloo group
  one_process  the unsplit model on the whole batch (the reference: every side ends with its
               loss after --steps steps, checked; a wrong answer is no benchmark)

Per side and schedule: ms per step (median of the steps after the first; the job run --repeats
times, interleaved with the other sides', the median run reported), the peak CPU tensor memory
of a step (NOTE [CPU memory meter]; the largest over the ranks). For the engine also, per rank
from its schedule's timeline (NOTE [pipeline schedules]): the bubble, the fraction of the step
the rank does not compute (the step's time less its actions' time, plus its actions' time spent
waiting in receives), against the schedule's theory (p-1)/(v*m + p-1) for p ranks, v stages per
rank and m microbatches (zero-bubble's theory is lower; the interleaved figure is printed as its
bound); and the bytes each boundary's sender sent per step forward (activations) against the
activations' size (microbatch rows x dim x 4 bytes x m). --only cross_mesh runs the first part
alone: the cross-mesh redistribute against a bare all_to_all_single of the same bytes
(--cross-mib, --cross-iters, --cross-windows).

On this 2-core VM, p > 2 ranks share two cores: a rank computing in the steady state, where every
rank computes, runs slower than in warm-up and cool-down, where some wait, so the measured bubble
sits below the theory. --ranks 2 gives each rank a core.

One JSON line per side and schedule:
  {"bench":"pp","side":"engine","schedule":"1f1b","ranks":4,"stages":4,"microbatches":8,
   "ms_per_step":..,"ratio_time_to_pytorch":..,"ratio_time_to_one":..,"bubble":..,
   "bubble_theory":..,"bytes_per_boundary":..,"activation_bytes":..,"peak_tensor_bytes":..}
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import free_port, run_job  # noqa: E402

SCHEDULES = {  # name -> (class name in both libraries, stages per rank)
    "gpipe": ("ScheduleGPipe", 1),
    "1f1b": ("Schedule1F1B", 1),
    "looped_bfs": ("ScheduleLoopedBFS", 2),
    "interleaved_1f1b": ("ScheduleInterleaved1F1B", 2),
    "zero_bubble": ("ScheduleInterleavedZeroBubble", 2),
}


def blocks(args):
    import torch
    from torch import nn

    torch.manual_seed(0)
    return [nn.Sequential(nn.Linear(args.dim, args.dim), nn.Tanh()) for _ in range(args.layers)]


def stage_module(all_blocks, stage, n_stages):
    from torch import nn

    per = len(all_blocks) // n_stages
    return nn.Sequential(*all_blocks[stage * per:(stage + 1) * per])


def data(args):
    import torch

    g = torch.Generator().manual_seed(1)
    rows = args.rows * args.microbatches
    return [(torch.randn(rows, args.dim, generator=g), torch.randn(rows, args.dim, generator=g))
            for _ in range(args.steps)]


def mse(out, target):
    return (out - target).pow(2).mean()


def reset_peak():
    from dtensor import _C
    _C.reset_cpu_peak_bytes()


def one_process(args):
    import torch
    from dtensor import _C

    model = torch.nn.Sequential(*blocks(args))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    times, loss = [], None
    for i, (x, y) in enumerate(data(args)):
        if i == 1:
            reset_peak()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = mse(model(x), y)
        loss.backward()
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
    return {"ms_per_step": statistics.median(times[1:] or times), "loss": loss.item(),
            "peak_tensor_bytes": _C.cpu_peak_bytes()}


def pipelined(args, rank, world):
    """This rank's stages under the schedule; its figures (and the loss on the last stage)."""
    import torch

    cls_name, per_rank = SCHEDULES[args.schedule]
    n_stages = world * per_rank
    engine = args.side == "engine"
    if engine:
        import dtensor
        from dtensor import _C, pipelining as lib
        group = dtensor.init_device_mesh("cpu", (world,), mesh_dim_names=("pp",))
    else:
        import torch.distributed as dist
        from torch.distributed import pipelining as lib
        from dtensor import _C
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.anchor_port}",
                                rank=rank, world_size=world)
        group = None
    all_blocks = blocks(args)
    mine = [s for s in range(n_stages) if s % world == rank]
    parts = [stage_module(all_blocks, s, n_stages) for s in mine]
    del all_blocks
    kw = {"group": group} if engine else {}
    stages = [lib.PipelineStage(p, s, n_stages, torch.device("cpu"), **kw)
              for p, s in zip(parts, mine)]
    cls = getattr(lib, cls_name)
    schedule = cls(stages[0] if per_rank == 1 else stages, args.microbatches, loss_fn=mse)
    params = [p for part in parts for p in part.parameters()]
    opt = torch.optim.SGD(params, lr=0.05)
    first, last = 0 in mine, n_stages - 1 in mine
    times, bubbles, loss, sent = [], [], None, 0
    for i, (x, y) in enumerate(data(args)):
        if i == 1:
            reset_peak()
        t0 = time.perf_counter()
        opt.zero_grad()
        losses = []
        schedule.step(*((x,) if first else ()), target=y if last else None, losses=losses)
        opt.step()
        step = time.perf_counter() - t0
        times.append(step * 1e3)
        if last:
            loss = torch.stack(losses).mean().item()
        if engine:
            busy = sum(end - start for _, _, _, start, end in schedule.timeline)
            busy -= sum(st.recv_wait_s for st in stages)
            bubbles.append(1.0 - busy / step)
            sent = sum(st.bytes_sent["f"] for st in stages if not st.is_last)
    peak = _C.cpu_peak_bytes()
    if not engine:
        dist.barrier()
        dist.destroy_process_group()
    row = {"rank": rank, "ms_per_step": statistics.median(times[1:] or times),
           "peak_tensor_bytes": peak, "loss": loss}
    if engine:
        row["bubble"] = statistics.median(bubbles[1:] or bubbles)
        row["bytes_forward"] = sent
        row["boundaries"] = sum(1 for s in mine if s != n_stages - 1)
    return row


def cross_mesh(args, rank):
    """The stage transfer's mechanism alone (NOTE [cross-mesh redistribute]): a redistribute
    between disjoint meshes against a bare all_to_all_single of the same bytes between the same
    ranks. Cases: R on [0] -> R on [1] (one point-to-point message) and S(0) on [0, 1] -> S(1) on
    [2, 3] (each source sends a quarter to each destination: every destination box once)."""
    import torch
    import dtensor
    from dtensor import DTensor, DeviceMesh, Replicate, Shard
    from dtensor import _functional_collectives as fc

    dtensor.init_device_mesh("cpu", (4,))
    rows = []
    for mib in args.cross_mib:
        n = int(mib * 2**20) // 4
        shape = (1024, n // 1024)
        for name, src, dst, sp, dp in (("R[0]->R[1]", [0], [1], [Replicate()], [Replicate()]),
                                       ("S0[0,1]->S1[2,3]", [0, 1], [2, 3], [Shard(0)],
                                        [Shard(1)])):
            a, b = DeviceMesh("cpu", src), DeviceMesh("cpu", dst)
            whole = torch.randn(shape, generator=torch.Generator().manual_seed(0))
            if rank in src:
                piece = whole.chunk(len(src), 0)[src.index(rank)] if sp[0].is_shard() else whole
                x = DTensor.from_local(piece.contiguous(), a, sp)
            else:
                x = DTensor.from_local(torch.empty(0), a, sp, shape=shape,
                                       stride=(shape[1], 1))
            # The bare exchange: on the same ranks (the redistribute's group is both meshes'
            # ranks), each sender sends, as one contiguous buffer, what the plan sends from it
            # to each receiver.
            members = sorted(set(src) | set(dst))
            share = whole.numel() // (len(src) * len(dst))
            ins = [share if rank in src and r in dst else 0 for r in members]
            outs = [share if rank in dst and r in src else 0 for r in members]
            buf = torch.randn(sum(ins))

            def move():
                y = x.redistribute(b, dp)
                return y.to_local()

            def bare():
                if rank not in members:
                    return None
                return fc.all_to_all_single(buf, outs, ins, group=members)

            got = move()
            if rank in dst:  # the destination pieces are one device's
                want = whole.chunk(len(dst), 1)[dst.index(rank)] if dp[0].is_shard() else whole
                assert torch.equal(got, want), name
            times = {}
            for label, fn in (("redistribute", move), ("bare", bare)) * args.cross_windows:
                fn()
                t0 = time.perf_counter()
                for _ in range(args.cross_iters):
                    fn()
                times.setdefault(label, []).append((time.perf_counter() - t0) / args.cross_iters)
            rows.append({"case": name, "bytes": whole.numel() * 4,
                         "us_redistribute": [t * 1e6 for t in times["redistribute"]],
                         "us_bare": [t * 1e6 for t in times["bare"]]})
    return {"rank": rank, "cross": rows}


def side_main(args):
    from dtensor import _C

    _C.install_cpu_memory_meter()  # NOTE [CPU memory meter]: every side, before any tensor
    import torch

    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.side == "cross_mesh":
        row = cross_mesh(args, rank)
    elif args.side == "one_process":
        row = one_process(args)
    else:
        row = pipelined(args, rank, world)
    row["rank"] = rank
    print(json.dumps({"bench_rank": row}, separators=(",", ":")), flush=True)
    return 0


def launch(args, argv, side, schedule, world):
    """One job of `world` processes running `side`; returns its ranks' rows or an error text."""
    cmd = [sys.executable, os.path.abspath(__file__), "--side", side, "--schedule", schedule,
           "--anchor-port", str(free_port())] + argv
    codes, texts = run_job(cmd, world, timeout=600)
    rows = [json.loads(x)["bench_rank"] for text in texts for x in text.splitlines()
            if x.startswith('{"bench_rank"')]
    if any(codes) or len(rows) != world:
        why = "\n".join(texts).strip().splitlines()
        return f"exit codes {codes}: " + " | ".join(why[-4:])[:500]
    return rows


def summarize(rows):
    """One row for the job: the slowest rank's step time, the last stage's loss, the largest
    peak; for the engine the bubble averaged over the ranks and the bytes per boundary."""
    out = {"ms_per_step": max(r["ms_per_step"] for r in rows),
           "peak_tensor_bytes": max(r["peak_tensor_bytes"] for r in rows),
           "loss": next(r["loss"] for r in rows if r["loss"] is not None)}
    if "bubble" in rows[0]:
        out["bubble"] = round(statistics.mean(r["bubble"] for r in rows), 4)
        out["bubble_per_rank"] = [round(r["bubble"], 4) for r in sorted(rows,
                                                                         key=lambda r: r["rank"])]
        boundaries = sum(r["boundaries"] for r in rows)
        out["bytes_per_boundary"] = sum(r["bytes_forward"] for r in rows) // max(1, boundaries)
    return out


def median_run(runs):
    errors = [r for r in runs if isinstance(r, str)]
    if errors:
        return {"error": errors[0]}
    rows = sorted((summarize(r) for r in runs), key=lambda r: r["ms_per_step"])
    row = dict(rows[(len(rows) - 1) // 2])
    row["ms_per_step_runs"] = [round(r["ms_per_step"], 3) for r in rows]
    return row


def report_cross_mesh(args, argv):
    """Runs the cross-mesh measurement on 4 processes; prints its table and JSON lines. The
    sides run in --cross-windows interleaved windows of --cross-iters calls (NOTE [ratios per
    window]: on a shared 2-core VM four spinning ranks make windows vary several-fold); a window's
    time is its slowest rank's (the ranks run each window in lockstep), the ratio is the median of
    the windows' ratios, the times the medians of the windows'."""
    rows = launch(args, argv, "cross_mesh", "none", 4)
    if isinstance(rows, str):
        print(f"cross-mesh redistribute did not run: {rows}")
        return False
    print("\ncross-mesh redistribute against a bare all_to_all_single of the same bytes "
          "(4 processes, shm)")
    print(f"{'case':<18} {'MiB':>6} {'redistribute us':>16} {'bare us':>9} {'ratio':>6}"
          f"   (medians of {args.cross_windows} windows of {args.cross_iters} calls)")
    for i, case in enumerate(rows[0]["cross"]):
        def slowest(side):  # per window, the slowest rank's time
            return [max(ts) for ts in zip(*(r["cross"][i][side] for r in rows))]

        reds, bares = slowest("us_redistribute"), slowest("us_bare")
        red, bare = statistics.median(reds), statistics.median(bares)
        ratio = statistics.median(r / b for r, b in zip(reds, bares))
        row = {"bench": "pp", "side": "cross_mesh", "case": case["case"], "bytes": case["bytes"],
               "us_redistribute": round(red, 1), "us_bare": round(bare, 1),
               "ratio_to_bare": round(ratio, 4), "windows": len(reds),
               "best_us_redistribute": round(min(reds), 1), "best_us_bare": round(min(bares), 1)}
        print(f"{case['case']:<18} {case['bytes'] / 2**20:>6.1f} {red:>16.1f} {bare:>9.1f} "
              f"{ratio:>5.2f}x")
        print(json.dumps(row, separators=(",", ":")))
    return True


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--schedules", default="gpipe,1f1b,interleaved_1f1b,zero_bubble")
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--rows", type=int, default=32, help="rows per microbatch")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cross-mib", default="1,16",
                   help="tensor sizes (MiB) of the cross-mesh redistribute measurement")
    p.add_argument("--cross-iters", type=int, default=10, help="calls per cross-mesh window")
    p.add_argument("--cross-windows", type=int, default=15,
                   help="interleaved timing windows per side of a cross-mesh case")
    p.add_argument("--only", choices=("cross_mesh",),
                   help="run only this part (cross_mesh: the cross-mesh redistribute alone)")
    p.add_argument("--side", choices=("engine", "pytorch", "one_process", "cross_mesh"),
                   help=argparse.SUPPRESS)
    p.add_argument("--schedule", default="1f1b", help=argparse.SUPPRESS)
    p.add_argument("--anchor-port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.cross_mib = [float(v) for v in args.cross_mib.split(",") if v]
    if args.side is not None:
        return side_main(args)
    if not report_cross_mesh(args, argv):
        return 1
    if args.only == "cross_mesh":
        return 0
    schedules = [s for s in args.schedules.split(",") if s]
    for s in schedules:
        if s not in SCHEDULES:
            raise SystemExit(f"./x bench pp: unknown schedule {s!r} (one of {list(SCHEDULES)})")
        if args.layers % (args.ranks * SCHEDULES[s][1]):
            raise SystemExit(f"./x bench pp: --layers {args.layers} does not split into "
                             f"{args.ranks * SCHEDULES[s][1]} equal stages for {s}")
    jobs = [("one_process", "none")] + [(side, s) for s in schedules
                                        for side in ("engine", "pytorch")]
    runs = {job: [] for job in jobs}
    for _ in range(max(1, args.repeats)):
        for side, s in jobs:
            runs[(side, s)].append(launch(args, argv, side, s,
                                          1 if side == "one_process" else args.ranks))
    one = median_run(runs[("one_process", "none")])
    if "error" in one:
        print(f"one process did not run: {one['error']}")
        return 1
    m, p = args.microbatches, args.ranks
    act = args.rows * args.dim * 4 * m
    print(f"\n{p} ranks, {args.layers} x Linear({args.dim}, {args.dim}) + Tanh, {m} microbatches "
          f"of {args.rows} rows, SGD, {args.steps} steps; one process: "
          f"{one['ms_per_step']:.2f} ms/step")
    print(f"{'schedule':<17} {'side':<8} {'ms/step':>8} {'vs PyTorch':>10} {'vs one':>7} "
          f"{'bubble':>7} {'theory':>7} {'sent/boundary':>14} {'÷ activations':>13} "
          f"{'peak tensors':>12}")
    good, nan = True, float("nan")
    for s in schedules:
        v = SCHEDULES[s][1]
        theory = (p - 1) / (v * m + p - 1)
        got = {side: median_run(runs[(side, s)]) for side in ("engine", "pytorch")}
        for side in ("engine", "pytorch"):
            r = got[side]
            row = {"bench": "pp", "side": side, "schedule": s, "ranks": p, "stages": p * v,
                   "microbatches": m}
            if "error" in r:
                row["error"] = r["error"]
                print(f"{s:<17} {side:<8} did not run: {r['error']}")
                print(json.dumps(row, separators=(",", ":")))
                good = good and side == "pytorch"  # PyTorch's side may fail, ours not
                continue
            row.update(r)
            row["equal_to_one_process"] = abs(r["loss"] - one["loss"]) <= \
                1e-5 * max(1.0, abs(one["loss"]))
            good = good and row["equal_to_one_process"]
            row["ratio_time_to_one"] = round(r["ms_per_step"] / one["ms_per_step"], 4)
            if "error" not in got["pytorch"]:
                row["ratio_time_to_pytorch"] = round(
                    r["ms_per_step"] / got["pytorch"]["ms_per_step"], 4)
            if side == "engine":
                row["bubble_theory"] = round(theory, 4)
                row["activation_bytes"] = act
                row["ratio_sent_to_activations"] = round(r["bytes_per_boundary"] / act, 4)
            verdict = "" if row["equal_to_one_process"] else "  WRONG: not one process's loss"
            print(f"{s:<17} {side:<8} {r['ms_per_step']:>8.2f} "
                  f"{row.get('ratio_time_to_pytorch', nan):>9.2f}x "
                  f"{row['ratio_time_to_one']:>6.2f}x {r.get('bubble', nan):>7.3f} "
                  f"{row.get('bubble_theory', nan):>7.3f} "
                  f"{r.get('bytes_per_boundary', 0) / 2**10:>11.1f}Ki "
                  f"{row.get('ratio_sent_to_activations', nan):>12.3f}x "
                  f"{r['peak_tensor_bytes'] / 2**20:>10.2f}Mi{verdict}")
            print(json.dumps(row, separators=(",", ":")))
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
