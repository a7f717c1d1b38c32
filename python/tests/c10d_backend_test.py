"""torch.distributed with the engine as its backend: real processes started
by ./x launch's launcher and by torchrun run c10d_backend_worker.py, which checks every
torch.distributed collective on backend "dtensor" against locally computed values (a subgroup
too, on 3 ranks) and DistributedDataParallel's losses and parameters against a Gloo group's.
The engine's collectives run on shm, or on Gloo (DTENSOR_BACKEND=c10d)."""

import os
import socket
import subprocess
import sys

import pytest

import dtensor

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "c10d_backend_worker.py")
PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(dtensor.__file__)))


def _env(backend):
    env = dict(os.environ)
    env["PYTHONPATH"] = PKG_ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["DTENSOR_COLLECTIVE_TIMEOUT_MS"] = "60000"
    env["DTENSOR_BACKEND"] = backend
    env["PYTHONSAFEPATH"] = "1"  # the worker's own folder holds no built extension
    return env


def _run(cmd, backend):
    p = subprocess.run(cmd, env=_env(backend), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=240)
    return p.returncode, p.stdout.decode(errors="replace")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("backend,n", [("shm", 2), ("shm", 3), ("c10d", 2)])
def test_under_x_launch(backend, n):
    launch = os.environ.get("LAUNCH_PY")
    assert launch, "LAUNCH_PY not set by the BUILD rule"
    rc, out = _run([sys.executable, launch, "-n", str(n), "--", sys.executable, WORKER], backend)
    assert rc == 0, out
    for r in range(n):
        assert f"rank {r}/{n}: torch.distributed on the dtensor backend matches" in out, out


def test_under_torchrun():
    rc, out = _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                    "--master_addr", "127.0.0.1",
                    "--master_port", str(_free_port()), WORKER], "shm")
    assert rc == 0, out
    for r in range(2):
        assert f"rank {r}/2: torch.distributed on the dtensor backend matches" in out, out
