"""The op_db sweep: torch's own operator database against the engine.

For every OpInfo of ``torch.testing._internal.common_methods_invocations.op_db`` that supports
float32 on CPU, take its first samples, make every tensor argument a distributed tensor under a
set of layouts ("modes"), run the op forward (and backward where the OpInfo supports autograd) on
ranks as threads, and compare with one device: values, shape, dtype, and the distributed
tensor's own metadata (its local piece's shape and dtype for its placements).

Modes (1-D mesh of 4 ranks unless named; of WORLD_SIZE ranks with --ranks-as processes):
  R        every tensor argument Replicate
  S<d>     the first tensor argument(s) (``sample.input``; each element of a list) Shard(d) on
           every dim d it has (uneven sizes included: op_db's sizes are 5, 10, ...), the others
           Replicate
  all-S0   every tensor argument with a dim Shard(0)
  2d       mesh (2,2): the first tensor argument [Shard(0), Shard(last dim)] (first sample only)

Outcomes per OpInfo, worst first:
  wrong    a result differs from one device's (values, shape, dtype or layout metadata): never allowed
  hang     a collective timed out, or ranks disagreed (some raised, others did not): never allowed
  error    the engine raised a clear error (no rule, ...): allowed only when listed in
           op_db_expected_failures.py, with its reason
  pass     every mode and sample matched

In-place variants (``x.add_(y)``, sweep_inplace_one) run the same modes and compare the written
self (never a wrong answer; errors only when listed in INPLACE_EXPECTED_FAILURES); so do torch's
foreach OpInfos (``torch._foreach_*`` and their in-place forms, sweep_foreach), which must pass.

Used by op_db_test.py (the project test) and as a script:
  ./x run python/tests/op_db/sweep.py [--ops NAME,...] [--samples 2] [--verbose]
                                      [--time-budget S] [--device cuda]
  python3 python/tests/op_db/sweep.py --ranks-as processes [--world 2] [--backend shm]
                                      [--device cuda] [--ops ...]
                                      (a process per rank: NOTE [sweep with processes])

NOTE [sweep on CUDA]: `--device cuda` (the GPU check, tools/gpu/check.sh) sweeps the OpInfos that
support float32 on CUDA with samples made on "cuda", on a 1-rank NCCL mesh of this process
(use_cuda: NCCL refuses two ranks on one GPU, so no ranks as threads): every mode runs in the
calling thread on that mesh, and modes that need more ranks (the 2-D ones) are skipped, so the
1-D modes' Shard(d) holds the whole tensor. What it checks is the engine on CUDA tensors: the
sharding rules and the fallback on them, every local piece on one device's device, values against
the same op on plain CUDA tensors. Random ops are compared by value too: on a CUDA mesh they
draw from the GPU's generator as one device does (NOTE [random on a CUDA mesh]). The sweep turns on
torch's deterministic algorithms (warn_only) on CUDA, in the reference and the engine alike: some
CUDA kernels accumulate with atomics, and some leave parts of their outputs unwritten (the
efficient attention's key gradient for keys past cu_seqlens_k), where one device's value is
whatever the allocator held; with the flag ATen fills fresh memory with NaN, which compares equal,
and those kernels pick their deterministic variants. Without a GPU it says "no GPU" and exits 0
(0 OpInfos).

NOTE [sweep with processes]: `--ranks-as processes` makes every rank its own process, on a mesh
of WORLD_SIZE ranks built on the launcher's backend (shm between CPU processes; cuda_ipc for
processes sharing one GPU with `--device cuda`, where NCCL refuses two ranks on one GPU). Run
without a launcher (no RANK in the environment), the script starts itself under tools/launch.py
(`-n --world`, default 2; `--backend`, default shm or cuda_ipc; PYTHONHASHSEED fixed, the full
sweep's seed passed down) and prints rank 0's lines without the launcher's prefix; under
`./x run -n N` or `./x launch -n N -- python3 sweep.py --ranks-as processes` each process is a
rank. Every rank runs the same OpInfos, samples and modes in the same order (same seed: rank 0's,
agreed at the start); the modes that run are those whose mesh has WORLD_SIZE ranks (on 2 ranks the
1-D modes R, S<d>, all-S0 on (2,); the 2-D ones are skipped, as on the 1-rank CUDA mesh). Each
rank compares its own results with one device as the thread mode does (the same run_mode, _check).
How outcomes are combined: after every mode, each rank's outcome (passed, a Failure, or the
exception's type and message) is all-gathered through the engine itself (_exchange: a fixed-size
uint8 CPU tensor of JSON on the mesh's group, under the collective purpose "op_db sweep outcome"),
and every rank classifies the gathered list with the thread mode's rules (_classify), so all ranks
reach the same outcome and stay in step; rank 0 prints. Why in-band, not per-rank files: when
ranks diverge (one raised, another went on into a collective), the peer's pending collective
meets this rank's exchange, the engine's call check fails both at once (their purposes differ:
"ranks disagree", the group goes on), the exchange is retried and pairs with the peer's own; the
divergence is then reported as `hang` (never `error`: it could be listed) within milliseconds,
and the next mode starts in step. Files would leave the peer waiting out the collective timeout,
which breaks the group for good. Each mode also gets a mesh of its own (fresh dim names), so a
divergence's uneven program digests (NOTE [program digest]) never reach the next mode. A group
that did break (a rank stuck outside collectives, or dead) cannot be mended within the job: the
sweep stops there, says so in the summary and exits 1 (the launcher then ends every rank). Rank
0's time-budget decision and any rank's CUDA failure are agreed the same way after every OpInfo,
with the OpInfo's index and name, so ranks out of step stop with a message instead of mixing.

The sweep's parts, each building on those before it: sweep_seeding.py (seeds, torch's op_db),
sweep_modes.py (where it runs, the layouts), sweep_ranks.py (running on ranks, the outcome
exchange), sweep_check.py (one mode against one device), sweep_inplace.py (in-place and foreach);
this module holds the entry points (sweep_one, sweep_full_one, sweep_inplace_one) and the
command line, and is the one namespace importers use (sweep.NAME).
"""

import argparse
import os
import subprocess
import sys
import time

os.environ.setdefault("DTENSOR_COLLECTIVE_TIMEOUT_MS", "20000")

import torch  # noqa: E402

# This folder's modules (the sweep's parts, expected_failures, fuzz_cases).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep_seeding  # noqa: E402  (first: torch's op_db, imported with sys.argv set aside)
from torch.utils._pytree import tree_flatten  # noqa: E402

import dtensor  # noqa: E402
from dtensor import DTensor  # noqa: E402,F401  (sweep.DTensor)

# The other parts, each building on those before it. Names imported from the parts and not used
# here are sweep's own for its importers (sweep.NAME: op_db_test, op_db_procs_test, fuzz_ops).
import sweep_modes  # noqa: E402
import sweep_ranks  # noqa: E402
import sweep_check  # noqa: E402
import sweep_inplace  # noqa: E402
from sweep_seeding import SEED, _op_seed, op_db, run_seed, seed_all  # noqa: E402,F401
from sweep_modes import (Mode, _Target, _is_tensor, _runnable, full_modes_for,  # noqa: E402,F401
                         modes_for, use_cuda, use_processes)
from sweep_ranks import Failure, _agreed  # noqa: E402,F401
from sweep_check import (ATOL, ONE_DEVICE_DROPS_GRAD, RTOL, SCALE_TOL,  # noqa: E402,F401
                         UNDEFINED_OUTPUTS, UNDEFINED_VALUES, Outcome, _check, _expected,
                         opinfo_name, run_mode)
from sweep_inplace import (ForeachCase, _sweep_inplace, foreach_cases,  # noqa: E402,F401
                           run_inplace_mode, sweep_foreach)


def float32_opinfos(device="cpu"):
    return [op for op in op_db if torch.float32 in op.supported_dtypes(device)]


def sweep_one(op, samples=3):
    """Returns (outcome, detail) for one OpInfo; fallback_ops() then names the ATen ops it ran by
    the replicate fallback."""
    dtensor.debug.reset_fallback_counts()
    return _sweep_one(op, samples)


def fallback_ops():
    """The ATen ops the last sweep_one ran by the replicate fallback (none: native rules only)."""
    return sorted(dtensor.debug.fallback_counts())


def _sweep_one(op, samples, full=False, seed=SEED, deadline=None):
    """The default tier: the first `samples` samples (fixed seed) in modes_for's layouts. The full
    sweep (full=True): every sample drawn with `seed`, in full_modes_for's layouts; stops early
    (outcome as far as it went, "(stopped at the time budget)" noted) past `deadline`."""
    backward = op.supports_autograd
    seed_all(seed)
    try:
        sample_list = list(op.sample_inputs(_Target.device, torch.float32,
                                            requires_grad=backward))
    except Exception as e:  # noqa: BLE001
        return "skip", f"sample_inputs raised {type(e).__name__}: {e}"
    if not full:
        sample_list = sample_list[:samples]
    out = Outcome()
    compare_values = op.name not in UNDEFINED_VALUES
    where = f"seed {seed} " if full else ""
    _op_seed[0] = seed
    try:
        for si, sample in enumerate(sample_list):
            if not any(_is_tensor(t) for t in
                       tree_flatten((sample.input, sample.args, sample.kwargs))[0]):
                continue  # a factory call: nothing to distribute
            try:
                want, want_grads = _expected(op, sample, backward)
            except Exception:  # noqa: BLE001  (one device refuses this sample too)
                continue
            modes = full_modes_for(sample) if full else modes_for(sample, si == 0)
            for mode in _runnable(modes):
                if deadline is not None and _agreed(
                        ["deadline", opinfo_name(op), si, mode.name],
                        time.monotonic() > deadline)[0]:
                    kind, detail = out.result()
                    return kind, (detail + " " if detail else "") + (
                        f"(stopped at the time budget in {where}sample {si})")
                if out.attempt(f"{where}sample {si} mode {mode.name}",
                               lambda: sweep_check.run_mode(op, sample, mode, want, want_grads,
                                                            compare_values)):
                    return out.result()
    finally:
        _op_seed[0] = SEED
    return out.result()


def sweep_full_one(op, seed, budget_s=None):
    """(outcome, detail) of the full sweep for one OpInfo (every sample, every tensor argument
    sharded in turn on every dim, 1-D and 2-D meshes), samples drawn with `seed`; fallback_ops()
    then names what ran by the replicate fallback."""
    dtensor.debug.reset_fallback_counts()
    deadline = None if budget_s is None else time.monotonic() + budget_s
    return _sweep_one(op, 0, full=True, seed=seed, deadline=deadline)


def sweep_inplace_one(op, samples=3):
    """(outcome, detail) of an OpInfo's in-place variant (``x.add_``): the written self must hold
    one device's values in every mode; "skip" when the OpInfo has none."""
    if op.inplace_variant is None:
        return "skip", "no in-place variant"
    torch.manual_seed(SEED)
    try:
        sample_list = list(op.sample_inputs(_Target.device, torch.float32,
                                            requires_grad=False))[:samples]
    except Exception as e:  # noqa: BLE001
        return "skip", f"sample_inputs raised {type(e).__name__}: {e}"
    return _sweep_inplace(op.inplace_variant, sample_list, op.name not in UNDEFINED_VALUES)


def _no_gpu(on):
    print("no GPU: torch.cuda.is_available() is False, nothing to sweep on cuda", flush=True)
    print(f"summary: {{}} in 0s{on} (0 OpInfos: no GPU)", flush=True)


def _launched():
    """Whether a launcher started this process as a rank (torchrun's variables)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _launch_self(a, argv):
    """This script on `--world` processes under tools/launch.py (NOTE [sweep with processes]);
    prints rank 0's lines without the launcher's "[rank 0] " prefix (the others' with it) and
    returns the launcher's exit status."""
    on = f" on {a.world} {a.device} processes"
    if a.device == "cuda" and not torch.cuda.is_available():
        _no_gpu(on)
        return 0
    here = os.path.dirname(os.path.abspath(__file__))
    launcher = os.environ.get("LAUNCH_PY") or os.path.join(here, "..", "..", "..", "tools",
                                                           "launch.py")
    backend = a.backend or ("cuda_ipc" if a.device == "cuda" else "shm")
    if a.full and a.seed is None:
        argv = argv + ["--seed", str(run_seed())]
    cmd = [sys.executable, launcher, "-n", str(a.world), "--backend", backend, "--",
           sys.executable, os.path.abspath(__file__)] + argv
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
               PYTHONHASHSEED="0")  # exec'd ranks draw op_db's samples alike
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace")
    try:
        for line in proc.stdout:
            print(line[len("[rank 0] "):] if line.startswith("[rank 0] ") else line, end="",
                  flush=True)
        return proc.wait()
    finally:
        if proc.poll() is None:  # interrupted here: the launcher stops its ranks
            proc.terminate()
            proc.wait()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", default="")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--full", action="store_true",
                        help="the full sweep: every sample, every argument, 1-D and 2-D meshes")
    parser.add_argument("--seed", type=int, default=None,
                        help="the full sweep's seed (default $DTENSOR_SWEEP_SEED or a fresh one)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: samples on the GPU, a 1-rank mesh of this process "
                             "(NOTE [sweep on CUDA]), or with --ranks-as processes ranks "
                             "sharing the GPU")
    parser.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                        help="start no OpInfo after this many seconds (the summary says so)")
    parser.add_argument("--ranks-as", choices=("threads", "processes"), default="threads",
                        help="processes: each rank its own process (NOTE [sweep with processes])")
    parser.add_argument("--world", type=int, default=None,
                        help="processes: the number of ranks (default: the launcher's "
                             "WORLD_SIZE; started here without a launcher: 2)")
    parser.add_argument("--backend", default=None,
                        help="processes started here: the launcher's backend (default shm, "
                             "cuda_ipc with --device cuda)")
    a = parser.parse_args()
    procs = a.ranks_as == "processes"
    if not procs and (a.world is not None or a.backend is not None):
        parser.error("--world and --backend go with --ranks-as processes")
    if procs and not _launched():
        a.world = a.world or 2
        if a.world < 1:
            parser.error("--world must be at least 1")
        return _launch_self(a, sys.argv[1:])
    seed = a.seed if a.seed is not None else run_seed()
    on = ""
    say = print  # rank 0 prints (every rank reaches the same outcomes)
    if procs:
        world = int(os.environ["WORLD_SIZE"])
        if a.world is not None and a.world != world:
            print(f"--world {a.world}, but the launcher started {world} ranks", file=sys.stderr)
            return 2
        on = f" on {world} {a.device} processes"
        if not use_processes(a.device):
            if os.environ.get("RANK") == "0":
                _no_gpu(on)
            return 0
        from dtensor import _functional_collectives as funcol
        backend = funcol.context().backend
        if a.backend is not None and a.backend != backend:
            print(f"--backend {a.backend}, but the ranks run on {backend}", file=sys.stderr)
            return 2
        on += f" ({backend})"
        if _Target.root.get_rank() != 0:
            say = lambda *args, **kwargs: None  # noqa: E731
        seed = _agreed("seed", seed)[0]  # rank 0's
        where = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
        say(f"sweep on {where}: {world} processes on {backend}, the modes of a {world}-rank mesh "
            f"(NOTE [sweep with processes])", flush=True)
    elif a.device == "cuda":
        on = " on cuda"
        if not use_cuda():
            _no_gpu(on)
            return 0
        print(f"sweep on {torch.cuda.get_device_name()}: a 1-rank mesh of this process, the 1-D "
              f"modes (NOTE [sweep on CUDA])", flush=True)
    if a.full:
        say(f"full sweep, seed {seed} (replay: --seed {seed})", flush=True)
    wanted = set(a.ops.split(",")) if a.ops else None
    counts = {}
    t0 = time.time()
    ops = [op for op in float32_opinfos(a.device)
           if not wanted or opinfo_name(op) in wanted or op.name in wanted]
    stopped = ""
    for i, op in enumerate(ops):
        name = opinfo_name(op)
        if not procs and a.time_budget is not None and time.time() - t0 > a.time_budget:
            stopped = (f"; stopped at the time budget ({a.time_budget:g}s): {len(ops) - i} of "
                       f"{len(ops)} OpInfos not started")
            break
        t1 = time.time()
        outcome, detail = sweep_full_one(op, seed) if a.full else sweep_one(op, a.samples)
        cuda_failed = ""
        if a.device == "cuda":
            try:  # an asynchronous CUDA error (a device-side assert) breaks every later op
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                cuda_failed = str(e).strip().splitlines()[0]
        over = False
        if procs:  # every rank at this OpInfo, with one outcome; rank 0's clock decides
            over = a.time_budget is not None and time.time() - t0 > a.time_budget
            got = _agreed(["OpInfo", i, name], [outcome, cuda_failed, over])
            if len({g[0] for g in got}) > 1:
                outcome, detail = "hang", "ranks disagree on the outcome: " + ", ".join(
                    f"rank {r} {g[0]}" for r, g in enumerate(got))
            cuda_failed = next((f"rank {r}: {g[1]}" if len(got) > 1 else g[1]
                                for r, g in enumerate(got) if g[1]), "")
            over = got[0][2]
        fallbacks = fallback_ops()
        if outcome == "pass" and not fallbacks:
            outcome = "native"  # passed on native rules alone
        counts[outcome] = counts.get(outcome, 0) + 1
        via = f" (fallback: {','.join(fallbacks)})" if fallbacks else ""
        say(f"{outcome:6s} {name:45s} {time.time() - t1:6.2f}s {detail[:300]}{via}", flush=True)
        if cuda_failed:
            stopped = (f"; CUDA failed after {name}: {cuda_failed}; "
                       f"{len(ops) - i - 1} OpInfos not started")
            break
        if procs and _Target.broken:
            stopped = (f"; stopped after {name}, the ranks cannot go on together: "
                       f"{_Target.broken[:300]}; {len(ops) - i - 1} OpInfos not started")
            break
        if over and i + 1 < len(ops):
            stopped = (f"; stopped at the time budget ({a.time_budget:g}s): {len(ops) - i - 1} "
                       f"of {len(ops)} OpInfos not started")
            break
    say(f"summary: {counts} in {time.time() - t0:.0f}s{on} (native: passed with no op run by the "
        f"replicate fallback){stopped}", flush=True)
    return 1 if procs and _Target.broken else 0


if __name__ == "__main__":
    sys.exit(main())
