"""What the fault tests share (fault_test, rank_faults_test, shm_and_settings_test): the /dev/shm
leak fixture, autouse in every test file that imports it, and starting a job's ranks under the
launcher with a script body."""

import os
import struct
import subprocess
import sys
import textwrap
import threading
import time

import pytest

LAUNCH = os.environ["LAUNCH_PY"]
TOOLS = os.path.dirname(os.path.abspath(LAUNCH))
sys.path.insert(0, TOOLS)
import shm_clean  # noqa: E402

BACKENDS = ["shm", "c10d"]

PRELUDE = """
import os, sys, time, threading, json
import torch
import dtensor
import dtensor._functional_collectives as F
RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])
"""


def ours():
    return {n for n in os.listdir("/dev/shm") if n.startswith("dtensor-")}


@pytest.fixture(autouse=True)
def shm_is_left_clean():
    """No segment of this test's jobs stays in /dev/shm. Other tests run beside this one (their
    jobs' segments come and go in the same folder), so a new name counts only while its creator
    is dead or its header unfinished (this test's processes have all exited by now; a live
    creator is another job's), after giving segments of jobs that are ending 5 s to go."""
    before = ours()
    yield
    deadline = time.monotonic() + 5.0
    while True:
        left = {n for n in ours() - before if _creator_gone(n)}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, f"segments left in /dev/shm: {sorted(left)}"


def _creator_gone(name):
    """The segment's creator process is dead, or its header was never finished (shm_clean's
    reading of a segment header, NOTE [stale segments])."""
    try:
        with open(os.path.join("/dev/shm", name), "rb") as f:
            head = f.read(40)
    except OSError:
        return False  # gone meanwhile
    if len(head) < 40:
        return True
    magic, _total, _half, _size, creator = struct.unpack("<QQQqq", head)
    return magic != shm_clean.MAGIC or not shm_clean._alive(creator)


def write_script(path, text):
    """Writes a script that processes started earlier may be reading: to a temporary name, then
    renamed over `path`, so a reader sees the old file or the new one whole, never a truncated one.
    Seen in CI twice: job B's rank 0 opened hand_body.py while rank 1's start was rewriting it, ran
    an empty script and exited 0 with no output."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def start(tmp_path, body, n=2, backend="shm", timeout_ms=5000, port=None, name="w", **env):
    script = write_script(tmp_path / f"{name}.py", PRELUDE + textwrap.dedent(body))
    e = dict(os.environ, PYTHONSAFEPATH="1", PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
             DTENSOR_BACKEND=backend, DTENSOR_COLLECTIVE_TIMEOUT_MS=str(timeout_ms))
    e.pop("DTENSOR_JOB_TOKEN", None)
    e.update(env)
    cmd = [sys.executable, LAUNCH, "-n", str(n)]
    if port:
        cmd += ["--port", str(port)]
    return subprocess.Popen(cmd + ["--", sys.executable, str(script)], env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def run(tmp_path, body, limit=60, **kw):
    t0 = time.monotonic()
    p = start(tmp_path, body, **kw)
    out, _ = p.communicate(timeout=limit)
    return p.returncode, out, time.monotonic() - t0


def lines_of(out, rank):
    return [l[len(f"[rank {rank}] "):] for l in out.splitlines() if l.startswith(f"[rank {rank}] ")]
