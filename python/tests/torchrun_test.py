"""Python programs run as N ranks under torchrun and under ./x launch.

Each case starts real processes with a real TCPStore rendezvous; the worker checks every
collective against the single-device result and the launcher must exit 0.

Debian's torch 1.13 launcher on Python 3.11 crashes in Std.from_str unless redirects/tee are
given as 1 (an enum change in Python 3.11 makes "0" parse to None), so the documented command
is ``python3 -m torch.distributed.run --nproc_per_node N script.py``.
"""

import os
import socket
import subprocess
import sys

import pytest

import dtensor

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "collectives_worker.py")
PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(dtensor.__file__)))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = PKG_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["DTENSOR_COLLECTIVE_TIMEOUT_MS"] = "60000"
    # Do not put the worker's (symlink-resolved) source folder first on sys.path: its copy of the
    # package has no built extension (Python 3.11's safe-path mode).
    env["PYTHONSAFEPATH"] = "1"
    return env


def _run(cmd):
    p = subprocess.run(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=240)
    out = p.stdout.decode(errors="replace")
    return p.returncode, out


@pytest.mark.parametrize("backend,n", [("shm", 2), ("shm", 3), ("c10d", 2)])
def test_under_torchrun(backend, n):
    rc, out = _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(n),
                    "--master_addr", "127.0.0.1",
                    "--master_port", str(_free_port()), WORKER, backend])
    assert rc == 0, out
    for r in range(n):
        assert f"rank {r}/{n} on {backend}: every collective matches" in out, out


def test_under_x_launch():
    launch = os.environ.get("LAUNCH_PY")
    assert launch, "LAUNCH_PY not set by the BUILD rule"
    rc, out = _run([sys.executable, launch, "-n", "2", "--backend", "shm", "--",
                    sys.executable, WORKER, "shm"])
    assert rc == 0, out
    assert "[rank 1] rank 1/2 on shm: every collective matches" in out, out
