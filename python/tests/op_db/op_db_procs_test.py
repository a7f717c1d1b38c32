"""The op_db sweep with every rank its own process (NOTE [sweep with processes] in sweep.py).

2 processes on the shm backend sweep every float32 OpInfo of torch's op_db (about 30 s on this
2-core VM), each compared with one device in every mode of a 2-rank mesh: none may be wrong or
hang, the listed ones (expected_failures.py; among them `diagonal_scatter`; `trace` was the
example until it passed) must raise the same clear error on both ranks (an `error`, not a `hang`), all others must pass, and a fixed list of kinds (an
elementwise op, a matmul, a reduction, softmax, a view, a random op) must be among them. Then the same job with faults put into the harness shows that the combination across ranks
reports what it must: a wrong answer is `wrong`, a rank that raises while its peer is in a
collective is a `hang` found at once (and the next OpInfo runs in step), and a rank that dies stops
the sweep within the collective timeout instead of hanging it.
"""

import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from expected_failures import EXPECTED_FAILURES  # noqa: E402

SWEEP = os.path.join(HERE, "sweep.py")
OPS = ["add", "mm", "sum", "softmax", "view", "bernoulli", "diagonal_scatter"]
LISTED = "diagonal_scatter"  # in EXPECTED_FAILURES: its error must agree across processes
LINE = re.compile(r"^(native|pass|error|wrong|hang|skip)\s+(\S+)\s+([\d.]+)s\s?(.*)$")


def _env(**extra):
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), **extra)


def _launcher():
    return os.environ.get("LAUNCH_PY") or os.path.join(HERE, "..", "..", "..", "tools",
                                                       "launch.py")


def _outcomes(stdout, prefix=""):
    """{OpInfo name: (outcome, seconds, detail)} from the sweep's lines (rank 0's)."""
    found = {}
    for line in stdout.splitlines():
        if not line.startswith(prefix):
            continue
        m = LINE.match(line[len(prefix):])
        if m:
            found[m.group(2)] = (m.group(1), float(m.group(3)), m.group(4))
    return found


def test_two_processes_on_shm_match_one_device():
    assert LISTED in EXPECTED_FAILURES
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, SWEEP, "--ranks-as", "processes", "--world", "2",
                          "--backend", "shm"],
                         env=_env(), capture_output=True, text=True, timeout=400)
    took = time.monotonic() - t0
    text = out.stdout + out.stderr
    print(out.stdout)
    assert out.returncode == 0, text
    summary = [line for line in out.stdout.splitlines() if line.startswith("summary: ")]
    assert len(summary) == 1 and "on 2 cpu processes (shm)" in summary[0], text
    found = _outcomes(out.stdout)
    assert set(OPS) <= set(found), f"OpInfos not swept: {sorted(set(OPS) - set(found))}\n{text}"
    problems = []
    for name, (outcome, _, detail) in sorted(found.items()):
        if outcome in ("wrong", "hang", "skip"):
            problems.append(f"{name}: {outcome}: {detail}")
        elif outcome == "error" and name not in EXPECTED_FAILURES:
            problems.append(f"{name}: error and not in expected_failures.py: {detail}")
        elif outcome != "error" and name in EXPECTED_FAILURES:
            problems.append(f"{name}: {outcome}, but listed in expected_failures.py")
    assert not problems, "\n".join(problems) + "\n" + text
    counts = summary[0].split(" in ")[0]
    assert "'wrong'" not in counts and "'hang'" not in counts, summary[0]
    passed = sum(1 for outcome, _, _ in found.values() if outcome in ("native", "pass"))
    assert passed >= 0.95 * len(found) and len(found) >= 600, (passed, len(found), summary[0])
    print(f"took {took:.1f} s")



# Every sample (--full) of the OpInfos whose process sweeps once failed: the random *_like ops
# (device= drew twice) and meshgrid (ranks whose samples differed broke the mesh for good), on 4
# processes, every mode of a 4-rank mesh.
RANDOM_AND_MESHGRID = ["meshgrid", "rand_like", "randn_like", "randint_like"]


def test_every_sample_of_random_like_and_meshgrid_on_four_processes():
    out = subprocess.run([sys.executable, SWEEP, "--ranks-as", "processes", "--world", "4",
                          "--backend", "shm", "--full", "--ops", ",".join(RANDOM_AND_MESHGRID)],
                         env=_env(), capture_output=True, text=True, timeout=400)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    found = _outcomes(out.stdout)
    swept = {name.split(".")[0] for name in found}
    assert swept == set(RANDOM_AND_MESHGRID), (sorted(found), text)
    bad = {name: v for name, v in found.items() if v[0] not in ("native", "pass")}
    assert not bad, f"{bad}\n{text}"


# The harness with faults: `add`'s one-device reference is off by one on every rank (a wrong
# answer); on `mm` rank 1 raises before gathering a sharded output that rank 0 gathers (the ranks
# diverge); `view` runs normally after it; on `t` rank 1 dies while rank 0 gathers; `sum` is never
# started.
FAULTS = """
import os, sys
sys.path.insert(0, {here!r})
import sweep, sweep_check
_run_mode, _check = sweep_check.run_mode, sweep_check._check
current = [""]

def run_mode(op, *args, **kwargs):
    current[0] = sweep.opinfo_name(op)
    return _run_mode(op, *args, **kwargs)

def check(what, got, want, mesh, compare_values, rank):
    sharded = isinstance(got, sweep.DTensor) and any(not p.is_replicate() for p in got.placements)
    if current[0] == "add" and isinstance(want, sweep.torch.Tensor):
        want = want + 1
    if current[0] == "mm" and rank == 1 and sharded:
        raise sweep.Failure("wrong", "injected on rank 1 only")
    if current[0] == "t" and rank == 1 and sharded:
        os._exit(3)
    return _check(what, got, want, mesh, compare_values, rank)

sweep_check.run_mode, sweep_check._check = run_mode, check
sys.exit(sweep.main())
"""
TIMEOUT_MS = 15000  # a wait that ran into it would take this long


def test_faults_are_wrong_or_hang_on_every_rank_and_never_hang_the_sweep(tmp_path):
    script = tmp_path / "faults.py"
    script.write_text(FAULTS.format(here=HERE))
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, _launcher(), "-n", "2", "--backend", "shm", "--",
                          sys.executable, str(script), "--ranks-as", "processes",
                          "--ops", "add,mm,view,t,sum"],
                         env=_env(DTENSOR_COLLECTIVE_TIMEOUT_MS=str(TIMEOUT_MS),
                                  DTENSOR_LAUNCH_GRACE_S="30"),
                         capture_output=True, text=True, timeout=240)
    took = time.monotonic() - t0
    text = out.stdout + out.stderr
    print(text)
    found = _outcomes(out.stdout, prefix="[rank 0] ")
    assert found["add"][0] == "wrong" and "values differ" in found["add"][2], text
    assert found["mm"][0] == "hang" and "ranks diverged" in found["mm"][2], text
    assert found["mm"][1] < TIMEOUT_MS / 1000, f"no wait may time out: {found['mm'][1]} s\n{text}"
    assert found["view"][0] in ("native", "pass"), text
    assert found["t"][0] == "hang" and "did not arrive" in found["t"][2], text
    assert found["t"][1] < TIMEOUT_MS / 1000 + 10, text
    assert "sum" not in found, text
    summary = [line for line in out.stdout.splitlines() if line.startswith("[rank 0] summary: ")]
    assert len(summary) == 1 and "stopped after t" in summary[0], text
    assert "1 OpInfos not started" in summary[0], text
    assert out.returncode != 0, text  # the launcher: rank 1 died, rank 0 could not finish
    print(f"took {took:.1f} s")
