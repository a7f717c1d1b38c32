"""A differential fuzzer for ops: random OpInfo x sample x placements x mesh shape, each
compared with one device by the sweep's machinery (sweep.run_mode: values, shapes, dtypes, each
rank's piece, gradients).

Every case is drawn from one integer seed (the run's seed plus the case's number), so a case is
replayed exactly by its seed: ``./x fuzz ops --replay SEED``. A run goes on for ``--time``
seconds (default 60) and prints one line per failure (kind, OpInfo, sample, mesh, placements,
seed) and a summary: "fuzz ops: N cases, N passed, N skipped, N wrong, N hang, N error". Wrong
answers and hangs make the exit status 1. Errors (the engine refused a case one device accepts)
are printed with their seeds but do not fail the run: the engine may refuse what it cannot do,
with a clear error; the sweep's expected_failures.py lists OpInfos by name and cannot list one
sample. Every wrong answer or hang found becomes a sweep case: its seed goes into FUZZ_CASES in
fuzz_cases.py, which op_db_test.py replays in every run.

  ./x fuzz ops [--time SECONDS] [--seed S] [--replay SEED[,SEED...]] [--ops NAME,...]
"""

import argparse
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep  # noqa: E402
from expected_failures import EXPECTED_FAILURES  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

import torch  # noqa: E402
from dtensor import Replicate, Shard  # noqa: E402

# Mesh shapes a case runs on (ranks as threads): even and uneven splits, 1-D and 2-D.
MESH_SHAPES = [(2,), (3,), (4,), (2, 2), (1, 3), (3, 2)]
# OpInfos with no tensor to distribute or that no mode can run.
_OPS = sweep.float32_opinfos()


def _placements(rng, t, mesh_shape):
    """Random placements of `t` on a mesh: per mesh dim Replicate or Shard of a random dim."""
    out = []
    for _ in mesh_shape:
        if t.dim() == 0 or rng.random() < 0.3:
            out.append(Replicate())
        else:
            out.append(Shard(rng.randrange(t.dim())))
    return out


class Case:
    """One fuzz case, all of it drawn from `seed`."""

    def __init__(self, seed, ops=None):
        rng = random.Random(seed)
        pool = [op for op in _OPS if ops is None or sweep.opinfo_name(op) in ops or op.name in ops]
        self.seed = seed
        self.op = pool[rng.randrange(len(pool))]
        self.name = sweep.opinfo_name(self.op)
        self.sample_seed = rng.randrange(2**31)
        self.sample_pick = rng.random()
        self.mesh_shape = MESH_SHAPES[rng.randrange(len(MESH_SHAPES))]
        self.rng = rng

    def run(self):
        """(kind, detail): kind is "pass", "skip", "wrong", "hang" or "error"."""
        op = self.op
        backward = op.supports_autograd and self.rng.random() < 0.5
        sweep.seed_all(self.sample_seed)
        try:
            samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=backward))
        except Exception as e:  # noqa: BLE001
            return "skip", f"sample_inputs raised {e}"
        samples = [s for s in samples
                   if any(sweep._is_tensor(t) for t in
                          tree_flatten((s.input, s.args, s.kwargs))[0])]
        if not samples:
            return "skip", "no sample with a tensor"
        si = int(self.sample_pick * len(samples))
        sample = samples[si]
        leaves = tree_flatten((sample.input, sample.args, sample.kwargs))[0]
        placements = {k: _placements(self.rng, t, self.mesh_shape)
                      for k, t in enumerate(leaves) if sweep._is_tensor(t)}
        text = ", ".join(f"arg{k}: {[str(p) for p in pl]}" for k, pl in placements.items())
        self.where = (f"{self.name} sample {si} of {len(samples)} mesh {self.mesh_shape} "
                      f"{'fwd+bwd' if backward else 'fwd'} [{text}] seed {self.seed}")
        mode = sweep.Mode("fuzz", self.mesh_shape, None, None,
                          lambda i, t: placements.get(i))
        sweep._op_seed[0] = self.sample_seed
        try:
            want, want_grads = sweep._expected(op, sample, backward)
        except Exception:  # noqa: BLE001  (one device refuses the sample too)
            return "skip", "one device refuses the sample"
        try:
            sweep.run_mode(op, sample, mode, want, want_grads,
                           op.name not in sweep.UNDEFINED_VALUES)
        except sweep.Failure as f:
            return f.kind, str(f)
        finally:
            sweep._op_seed[0] = sweep.SEED
        return "pass", ""


def run_case(seed, ops=None):
    case = Case(seed, ops)
    kind, detail = case.run()
    return case, kind, detail


def main(argv=None):
    p = argparse.ArgumentParser(prog="./x fuzz ops", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--time", type=float, default=60.0, help="seconds to run (default 60)")
    p.add_argument("--seed", type=int, default=None, help="the run's seed (default: fresh)")
    p.add_argument("--replay", default="", help="replay these case seeds (comma separated)")
    p.add_argument("--ops", default="", help="only these OpInfos (comma separated)")
    a = p.parse_args(argv)
    ops = set(a.ops.split(",")) if a.ops else None
    if a.replay:
        seeds = [int(x) for x in a.replay.split(",")]
    else:
        base = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "little")
        print(f"fuzz ops: run seed {base} (case seeds {base} upwards), {a.time:.0f} s",
              flush=True)
        seeds = None
    counts = {"pass": 0, "skip": 0, "wrong": 0, "hang": 0, "error": 0, "listed": 0}
    bad = 0
    t_end = time.monotonic() + a.time
    k = 0
    while True:
        if seeds is not None:
            if k >= len(seeds):
                break
            seed = seeds[k]
        else:
            if time.monotonic() > t_end:
                break
            seed = base * 1_000_003 + k
        k += 1
        case, kind, detail = run_case(seed, ops)
        if kind == "error" and case.name in EXPECTED_FAILURES:
            counts["listed"] += 1
            continue
        counts[kind] += 1
        if kind in ("wrong", "hang", "error"):
            bad += kind != "error"
            print(f"fuzz ops: {kind}: {case.where}: {detail[:400]}", flush=True)
            print(f"  replay: ./x fuzz ops --replay {seed}", flush=True)
        elif seeds is not None:
            print(f"fuzz ops: {kind}: {getattr(case, 'where', case.name)} {detail[:200]}",
                  flush=True)
    total = sum(counts.values())
    print(f"fuzz ops: {total} cases, {counts['pass']} passed, {counts['skip']} skipped, "
          f"{counts['wrong']} wrong, {counts['hang']} hang, {counts['error']} error "
          f"({counts['listed']} listed errors)", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
