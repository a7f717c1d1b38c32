"""./x bench fsdp: FSDP training steps against replicated data parallelism, one process and
PyTorch's own FSDP2, in one run.

    ./x bench fsdp [--ranks 2,4] [--layers 8] [--dim 512] [--batch 16] [--steps 10]
                   [--repeats 3] [--plot]

A model of --layers Linear(dim, dim) + ReLU blocks trained with AdamW, --batch rows per rank.
For each data-parallel size, every side runs in processes of its own (so each one's peak memory is
its own), from the same weights on the same data:
  fsdp         dtensor.fsdp.fully_shard on every block, then the root (reshard after forward),
               the engine on its shm backend
  replicated   the model on every rank; one all_reduce of the flattened gradients per step (DDP's
               algorithm, through the engine's functional collectives)
  pytorch      torch.distributed.fsdp.fully_shard, the same calls, on a Gloo group
  one_process  one process on the whole batch (the ranks' rows together)
Every side must end with the one process's loss (checked; a wrong answer is no benchmark).

Each side's job runs --repeats times, the sides interleaved (fsdp, replicated, pytorch, one process,
fsdp, ...), and the run with the median time is reported with every run's time
("ms_per_step_runs"): on this shared 2-core VM one job's time varies by up to 1.5x, and a slow
spell should not fall on one side only.
Per side: ms per step (median of the steps after the first), the training state each rank holds
(parameters, gradients, AdamW's moments: bytes of its local pieces), the peak resident memory the
training steps added on top of the built model (VmHWM after resetting it with /proc/self/clear_refs;
the largest over the ranks), the peak CPU tensor memory of a step (NOTE [CPU memory meter]: every
live tensor, from the second step on, the batches left out, the engine FSDP's symmetric flat
buffers added; the largest over the ranks) against the bound, 1.1 x (parameters +
gradients + optimizer state) / N + the largest group unsharded ("ratio_peak_to_bound"), and the
bytes each rank sends per step by the algorithm (ring all-gather and reduce-scatter send (W-1)/W
of the full tensor, all-reduce twice that). One JSON line per side and world size:
  {"bench":"fsdp","side":"fsdp","ranks":2,"ms_per_step":..,"state_bytes":..,"peak_rss_bytes":..,
   "peak_tensor_bytes":..,"memory_bound_bytes":..,"ratio_peak_to_bound":..,
   "comm_bytes":..,"ratio_state_to_one":..,"ratio_time_to_pytorch":..}
"""

import argparse
import copy
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import free_port, run_job  # noqa: E402


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


def run_side(m, opt, data, rank, args, before_step=None):
    """Trains on this rank's rows; returns (ms per step, its last loss, state bytes, peak RSS
    added, peak CPU tensor bytes of a step). The tensor peak (NOTE [CPU memory meter]) is taken
    from the second step on (the optimizer's state exists then, as in every later step) and
    leaves out the batches, which the bench makes up front for every step."""
    import torch

    from dtensor import _C

    rows = slice(rank * args.batch, (rank + 1) * args.batch)
    data_bytes = sum(t.numel() * t.element_size() for xy in data for t in xy)
    times, loss = [], None
    reset_peak()
    base = peak_rss()
    for i, (x, y) in enumerate(data):
        if i == min(1, len(data) - 1):
            _C.reset_cpu_peak_bytes()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = (m(x[rows]) - y[rows]).pow(2).mean()
        loss.backward()
        if before_step is not None:
            before_step()
        opt.step()
        times.append((time.perf_counter() - t0) * 1e3)
    peak = peak_rss() - base
    tensor_peak = _C.cpu_peak_bytes() - data_bytes
    return (statistics.median(times[1:] or times), loss.detach(), state_bytes(m, opt), peak,
            tensor_peak)


def fsdp_symmetric_bytes():
    """The engine's FSDP flat buffers in symmetric memory (not from the CPU allocator, so not
    in the meter): the all-gather inputs' pool (every one is back in it between steps) and the
    shared reduce-scatter scratch."""
    from dtensor.fsdp import _param_group

    bufs = list(_param_group._SHARED_SCRATCH.values())
    for free in _param_group._GATHER_POOL.values():
        bufs += free
    return sum(b.numel() * b.element_size() for b in bufs)


def largest_group_bytes(base):
    """The largest fully_shard group unsharded: one block's Linear (the root holds none)."""
    from torch import nn

    return max(sum(p.numel() * p.element_size() for p in layer.parameters())
               for layer in base if isinstance(layer, nn.Linear))


def comm_bytes(side, param_bytes, world):
    share = (world - 1) / world
    if side == "replicated":
        return int(2 * param_bytes * share)
    # FSDP resharding after forward: all-gathers in forward and again in backward, one
    # reduce-scatter of the gradients.
    return int(3 * param_bytes * share)


def side_main(args):
    """One side in this job's processes; rank 0 prints one JSON line with its figures."""
    import torch
    import torch.distributed as dist

    import dtensor
    from dtensor import _C
    from dtensor import _functional_collectives as fc

    _C.install_cpu_memory_meter()  # NOTE [CPU memory meter]: every side, before any tensor
    torch.set_num_threads(1)
    side = args.side
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    base = model(args)
    data = batches(args, args.dp)
    param_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
    group_bytes = largest_group_bytes(base)
    m = copy.deepcopy(base)
    del base  # the model's one copy per rank is m (FSDP shards it)
    before_step, pt = None, side == "pytorch"
    if side == "one_process":  # the whole batch (every data-parallel rank's rows) in one process
        run_args = copy.copy(args)
        run_args.batch = args.batch * args.dp
    else:
        run_args = args
    if side == "fsdp":
        from dtensor.fsdp import fully_shard

        mesh = dtensor.init_device_mesh("cpu", (world,))
        for layer in m:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(m, mesh=mesh)
    elif side == "replicated":  # DDP's algorithm: one all_reduce of the flattened gradients
        mesh = dtensor.init_device_mesh("cpu", (world,))

        def before_step():
            grads = [p.grad for p in m.parameters()]
            flat = fc.all_reduce(torch.cat([g.reshape(-1) for g in grads]), "sum",
                                 group=mesh).wait() / world
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
    elif pt:  # PyTorch's FSDP2 on a Gloo group of these processes
        from torch.distributed.device_mesh import init_device_mesh as pt_mesh
        from torch.distributed.fsdp import fully_shard as pt_fully_shard

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.anchor_port}",
                                rank=rank, world_size=world)
        pmesh = pt_mesh("cpu", (world,))
        for layer in m:
            if isinstance(layer, torch.nn.Linear):
                pt_fully_shard(layer, mesh=pmesh)
        pt_fully_shard(m, mesh=pmesh)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    ms, loss, state, peak, tensor_peak = run_side(m, opt, data, rank, run_args, before_step)
    if side == "fsdp":
        tensor_peak += fsdp_symmetric_bytes()
    loss = loss.reshape(1).double()
    if pt:
        dist.all_reduce(loss)
        dist.barrier()
        dist.destroy_process_group()
    elif side != "one_process":
        loss = fc.all_reduce(loss, "sum", group=mesh).wait()
    peaks, tensor_peaks = [peak], [tensor_peak]
    if side != "one_process" and not pt:  # the largest peaks over the ranks
        both = fc.all_gather_tensor(torch.tensor([[float(peak), float(tensor_peak)]]), 0,
                                    group=mesh).wait()
        peaks, tensor_peaks = both[:, 0].tolist(), both[:, 1].tolist()
    if rank == 0:
        sent = 0 if side == "one_process" else comm_bytes(side, param_bytes, world)
        print(json.dumps({"bench": "fsdp", "side": side, "ranks": args.dp,
                          "ms_per_step": round(ms, 3), "state_bytes": state,
                          "peak_rss_bytes": int(max(peaks)),
                          "peak_tensor_bytes": int(max(tensor_peaks)), "comm_bytes": sent,
                          "loss": loss.item() / world, "param_bytes": param_bytes,
                          "largest_group_bytes": group_bytes},
                         separators=(",", ":")), flush=True)
    return 0


SIDES = ("fsdp", "replicated", "pytorch", "one_process")


def launch(args, argv, side, world, dp):
    """One job of `world` processes running `side`; returns rank 0's JSON row (or an error)."""
    cmd = [sys.executable, os.path.abspath(__file__), "--side", side, "--dp", str(dp),
           "--anchor-port", str(free_port())] + argv
    codes, texts = run_job(cmd, world)
    rows = [json.loads(x) for x in texts[0].splitlines() if x.startswith('{"bench"')]
    if any(codes) or not rows:
        why = "\n".join(texts).strip().splitlines()
        return {"bench": "fsdp", "side": side, "ranks": dp,
                "error": f"exit codes {codes}: " + " | ".join(why[-3:])[:400]}
    return rows[0]


def _median_run(rows):
    """The run with the median time (an error if any run failed), with every run's time."""
    failed = [r for r in rows if "error" in r]
    if failed:
        return failed[0]
    rows = sorted(rows, key=lambda r: r["ms_per_step"])
    row = dict(rows[(len(rows) - 1) // 2])
    row["ms_per_step_runs"] = [r["ms_per_step"] for r in rows]
    return row


def report(rows, args, dp):
    """The table and the JSON lines of one data-parallel size; False when a side is wrong."""
    ok_rows = {r["side"]: r for r in rows if "error" not in r}
    one = ok_rows.get("one_process")
    pt = ok_rows.get("pytorch")
    params = next(iter(ok_rows.values()))["param_bytes"] if ok_rows else 0
    print(f"\n{dp} ranks: {args.layers} x Linear({args.dim}, {args.dim}), "
          f"{params / 2**20:.1f} MiB of parameters, {args.batch} rows per rank, AdamW, "
          f"{args.steps} steps; each side in its own processes")
    print(f"{'side':<12} {'ms/step':>8} {'vs PyTorch':>10} {'state/rank':>11} {'vs one':>7} "
          f"{'peak RSS +':>11} {'peak tensors':>12} {'÷ bound':>7} {'sent/step':>10} "
          f"{'final loss':>11}")
    good = True
    for r in rows:
        if "error" in r:
            print(f"{r['side']:<12} did not run: {r['error']}")
            print(json.dumps(r, separators=(",", ":")))
            good = good and r["side"] == "pytorch"  # PyTorch's side may be missing, ours not
            continue
        r["equal_to_one_process"] = one is not None and \
            abs(r["loss"] - one["loss"]) <= 1e-4 * max(1.0, abs(one["loss"]))
        good = good and r["equal_to_one_process"]
        if one is not None:
            r["ratio_state_to_one"] = round(r["state_bytes"] / one["state_bytes"], 4)
            # The bound on the peak per rank: 1.1 x (parameters + gradients + optimizer
            # state) / N + the largest group unsharded.
            r["memory_bound_bytes"] = int(1.1 * one["state_bytes"] / dp + r["largest_group_bytes"])
            r["ratio_peak_to_bound"] = round(r["peak_tensor_bytes"] / r["memory_bound_bytes"], 4)
        if pt is not None:
            r["ratio_time_to_pytorch"] = round(r["ms_per_step"] / pt["ms_per_step"], 4)
        verdict = "" if r["equal_to_one_process"] else "  WRONG: not one process"
        nan = float("nan")
        print(f"{r['side'].replace('_', ' '):<12} {r['ms_per_step']:>8.2f} "
              f"{r.get('ratio_time_to_pytorch', nan):>9.2f}x "
              f"{r['state_bytes'] / 2**20:>9.2f}Mi {r.get('ratio_state_to_one', nan):>6.2f}x "
              f"{r['peak_rss_bytes'] / 2**20:>9.1f}Mi {r['peak_tensor_bytes'] / 2**20:>10.1f}Mi "
              f"{r.get('ratio_peak_to_bound', nan):>6.2f}x {r['comm_bytes'] / 2**20:>8.2f}Mi "
              f"{r['loss']:>11.6f}{verdict}")
        print(json.dumps(r, separators=(",", ":")))
    return good


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--dp", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--anchor-port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.side is not None:
        return side_main(args)
    good = True
    for dp in [int(w) for w in args.ranks.split(",") if w]:
        runs = {side: [] for side in SIDES}
        for _ in range(max(1, args.repeats)):
            for side in SIDES:
                runs[side].append(launch(args, argv, side, 1 if side == "one_process" else dp, dp))
        good = report([_median_run(runs[side]) for side in SIDES], args, dp) and good
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
