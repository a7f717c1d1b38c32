"""Jobs that meet across real processes: two jobs on one port, launched or started by hand without
a token, and a late intruder, never run as one; each rank ends with one device's result or a clear
error within its timeouts, and /dev/shm holds nothing of ours afterwards.
"""

import os
import re
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # fault_helpers.py, beside this file
# shm_is_left_clean: the /dev/shm leak fixture, autouse, so every case here runs under it.
from fault_helpers import (BACKENDS, PRELUDE, lines_of, shm_is_left_clean, start,  # noqa: E402,F401
                           write_script)


# ---- job identity: two jobs on one port never mix ----

def test_two_jobs_on_one_port_never_mix(tmp_path):
    body = """
        F.init_from_env()
        time.sleep(1.5)
        for i in range(5):
            got = F.all_reduce(torch.full((4,), float(RANK + 1))).tolist()
            if got != [WORLD * (WORLD + 1) / 2] * 4:
                print("WRONG", got)
        print("ok")
    """
    port = __import__("socket").socket()
    port.bind(("127.0.0.1", 0))
    p_num = port.getsockname()[1]
    port.close()
    a = start(tmp_path, body, n=4, port=p_num, name="a", timeout_ms=8000)
    time.sleep(0.2)
    b = start(tmp_path, body, n=4, port=p_num, name="b", timeout_ms=8000)
    out_a, _ = a.communicate(timeout=90)
    out_b, _ = b.communicate(timeout=90)
    assert "WRONG" not in out_a + out_b
    ok = [sum(l.endswith(" ok") for l in out.splitlines()) for out in (out_a, out_b)]
    assert ok.count(4) <= 1, (out_a, out_b)
    for out, code, n_ok in ((out_a, a.returncode, ok[0]), (out_b, b.returncode, ok[1])):
        if n_ok == 4:
            assert code == 0
            continue
        assert code != 0
        for r in range(4):
            # A rank the launcher killed (-9) after another rank failed says nothing itself (on
            # torch 2.x it may still be retrying its store connection then); the launcher's
            # line names the rank that failed first, and that rank's error must be clear.
            if f"rank {r} exited with -9" in out and "failed; killing the ranks" in out:
                continue
            if not any(l == "ok" for l in lines_of(out, r)):
                text = "\n".join(lines_of(out, r))
                assert re.search(r"two jobs|cannot host the rendezvous store|rendezvous|"
                                 r"did not arrive|broken", text), out


# Jobs started from the environment alone: a hand-written launcher, no launch token, no
# scheduler job id. Both jobs run this script; each of its ranks prints "<job> ok" or its error.
HAND_LAUNCHER = r"""
import os, subprocess, sys
n, port, body = int(sys.argv[1]), sys.argv[2], sys.argv[3]
procs = []
for r in range(n):
    env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r),
               LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    for k in ("DTENSOR_JOB_TOKEN", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        env.pop(k, None)
    procs.append(subprocess.Popen([sys.executable, body], env=env))
code = max(p.wait() for p in procs)
print(f"{os.environ['JOB']} end {__import__('time').time():.3f}", flush=True)
sys.exit(code)
"""

HAND_BODY = PRELUDE + """
import dtensor._functional_collectives as F
JOB, ITERS = os.environ["JOB"], int(os.environ["ITERS"])
if os.environ.get("PRINT_READY"):  # imports done (NOTE [timed from ready])
    print(f"{JOB}{RANK} ready {time.time():.3f}", flush=True)
try:
    F.init_from_env()
    STOP = os.environ.get("STOP_FILE", "")
    for i in range(ITERS):
        # Rank 0 says when to stop (the test creates STOP_FILE): all ranks stop together.
        stop = float(RANK == 0 and bool(STOP) and os.path.exists(STOP))
        got = F.all_reduce(torch.tensor([float(RANK + 1)] * 4 + [stop])).tolist()
        if got[:4] != [WORLD * (WORLD + 1) / 2] * 4:
            print(f"{JOB}{RANK} WRONG {got}", flush=True)
            sys.exit(3)
        if got[4]:
            break
    print(f"{JOB}{RANK} ok", flush=True)
except Exception as e:
    print(f"{JOB}{RANK} ERROR " + str(e).replace(chr(10), " "), flush=True)
    sys.exit(1)
"""


def start_by_hand(tmp_path, job, port, backend, iters, timeout_ms, stop_file=""):
    launcher, body = tmp_path / "hand_launcher.py", tmp_path / "hand_body.py"
    write_script(launcher, HAND_LAUNCHER)
    write_script(body, HAND_BODY)
    e = dict(os.environ, PYTHONSAFEPATH="1", PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
             DTENSOR_BACKEND=backend, DTENSOR_COLLECTIVE_TIMEOUT_MS=str(timeout_ms), JOB=job,
             ITERS=str(iters), STOP_FILE=str(stop_file), PRINT_READY="1")
    return subprocess.Popen([sys.executable, str(launcher), "4", str(port), str(body)], env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def free_port():
    s = __import__("socket").socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def assert_ends_in_time(out, job, timeout_s):
    """NOTE [timed from ready]: a job's ranks end within two store timeouts of the moment the last
    of them finished importing (a rank waits at most one timeout to reach or host the store and
    one to see the whole job arrive), plus 12 s for rendezvous, 50 all_reduces and exit on a
    loaded machine. Timed from the ranks' own "ready" lines, not from the launch, so the bound
    does not depend on how long 8 processes take to import torch while other tests share the
    cores: the cases run beside the rest of the suite (they ran alone, last, for 2 minutes)."""
    ready = [float(l.split()[-1]) for l in out.splitlines()
             if l.startswith(job) and " ready " in l]
    end = [float(l.split()[-1]) for l in out.splitlines() if l.startswith(f"{job} end ")]
    assert len(ready) == 4 and len(end) == 1, out
    took = end[0] - max(ready)
    assert took < 2 * timeout_s + 12.0, f"job {job} ended {took:.1f} s after its ranks were " \
        f"ready (a hang would take the store's timeout again, or forever):\n{out}"


def assert_whole_or_refused(out, job):
    """Every rank of `job` finished ("ok") or none did, each of the others with a clear error."""
    mine = [l for l in out.splitlines()
            if l.startswith(job) and " ready " not in l and not l.startswith(f"{job} end ")]
    assert not [l for l in mine if " WRONG " in l], out
    ok = [l for l in mine if l.endswith(" ok")]
    assert len(ok) in (0, 4), out
    if not ok:
        assert len(mine) == 4, out
        for l in mine:
            assert re.search(r"two jobs|two launches|cannot host the rendezvous store|"
                             r"cannot reach the rendezvous store|left the rendezvous|"
                             r"did not join the rendezvous store", l), out
    return len(ok) == 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_jobs_without_a_token_started_together_never_form_one(tmp_path, backend):
    """Two 4-rank jobs from two hand-written launchers, one MASTER_PORT, the same instant: ranks
    of both must never run as one job (seen: A's ranks 0-2 with B's rank 3, "got 4006.0"). Ranks
    on one host share their launcher (NOTE [job identity])."""
    for attempt in range(3):
        port = free_port()
        a = start_by_hand(tmp_path, "A", port, backend, 50, 6000)
        b = start_by_hand(tmp_path, "B", port, backend, 50, 6000)
        out_a, _ = a.communicate(timeout=90)
        out_b, _ = b.communicate(timeout=90)
        for job, out in (("A", out_a), ("B", out_b)):
            assert_ends_in_time(out, job, 6.0)
        whole = [assert_whole_or_refused(out_a + out_b, j) for j in ("A", "B")]
        assert whole.count(True) <= 1, out_a + out_b


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_running_job_without_a_token_goes_on_when_another_joins_its_store(tmp_path, backend):
    """Job A runs; job B, started later on A's MASTER_PORT, is refused on every rank within its
    timeout, and A finishes with correct sums (seen with c10d: A hung until killed)."""
    port, stop = free_port(), tmp_path / "stop"
    a = start_by_hand(tmp_path, "A", port, backend, 10**7, 6000, stop_file=stop)
    time.sleep(4.0)
    b = start_by_hand(tmp_path, "B", port, backend, 50, 6000)
    out_b, _ = b.communicate(timeout=90)
    assert_ends_in_time(out_b, "B", 6.0)
    assert a.poll() is None, "job A ended before job B tried its store"
    stop.write_text("")
    out_a, _ = a.communicate(timeout=60)
    assert assert_whole_or_refused(out_a, "A"), out_a + out_b
    assert not assert_whole_or_refused(out_b, "B"), out_a + out_b
    assert a.returncode == 0 and b.returncode != 0


def start_rank(tmp_path, job, rank, port, backend, token):
    """One rank of a 4-rank job started by the test itself, with launch token `token`."""
    body = write_script(tmp_path / "hand_body.py", HAND_BODY)
    e = dict(os.environ, PYTHONSAFEPATH="1", PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
             DTENSOR_BACKEND=backend, DTENSOR_COLLECTIVE_TIMEOUT_MS="20000", JOB=job, ITERS="20",
             STOP_FILE="", RANK=str(rank), WORLD_SIZE="4", LOCAL_RANK=str(rank),
             LOCAL_WORLD_SIZE="4", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
             DTENSOR_JOB_TOKEN=token)
    for k in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        e.pop(k, None)
    return subprocess.Popen([sys.executable, str(body)], env=e, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)


def wait_for_arrivals(store, rank, count, procs):
    deadline = time.monotonic() + 60
    while store.add(f"dtensor/0/arrivals/{rank}", 0) < count:
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
            [p.communicate()[0] for p in procs if p.poll() is not None]
        time.sleep(0.05)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_late_intruder_is_refused_alone_and_the_job_runs(tmp_path, backend):
    """Ranks 0-2 of job B have joined; a process of job A (another launch token) arrives as rank 2,
    then B's rank 3 comes. The intruder is refused and B runs whole (seen in CI: the intruder
    marked the store, B's rank 3 refused to start after B's ranks 0-2 had passed their check,
    and they waited for it until the collective timeout with an error that named no intruder)."""
    from torch.distributed import TCPStore
    port = free_port()
    b = [start_rank(tmp_path, "B", r, port, backend, "tokB") for r in range(3)]
    store = None
    deadline = time.monotonic() + 60
    while store is None:
        try:
            store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5))
        except Exception:
            assert time.monotonic() < deadline and b[0].poll() is None, b[0].communicate()[0]
            time.sleep(0.2)
    for r in range(3):
        wait_for_arrivals(store, r, 1, b)
    a = start_rank(tmp_path, "A", 2, port, backend, "tokA")
    out_a, _ = a.communicate(timeout=60)
    assert a.returncode != 0 and re.search(r"A2 ERROR .*two jobs", out_a), out_a
    b.append(start_rank(tmp_path, "B", 3, port, backend, "tokB"))
    outs = [p.communicate(timeout=60)[0] for p in b]
    assert [o.strip() for o in outs] == [f"B{r} ok" for r in range(4)], outs
    assert all(p.returncode == 0 for p in b)


def test_a_script_rewritten_while_ranks_start_is_never_read_truncated(tmp_path):
    """start_rank rewrites hand_body.py for each rank while the ranks started before it read it
    (CI: a rank read it empty, ran nothing and exited 0). A reader racing rewrites sees it whole."""
    path = write_script(tmp_path / "hand_body.py", HAND_BODY)
    seen, done = set(), threading.Event()

    def read():
        while not done.is_set():
            seen.add(path.read_text())

    reader = threading.Thread(target=read)
    reader.start()
    for _ in range(3000):
        write_script(path, HAND_BODY)
    done.set()
    reader.join()
    assert seen == {HAND_BODY}, sorted(len(s) for s in seen)
