"""Leftovers in /dev/shm (stale segments removed and live ones kept, a killed job leaves nothing)
and bad settings in the environment (the collective timeout, the shm buffer size), across real
processes: each a clear error naming the setting, the group and the rank, or one device's result.
"""

import os
import re
import struct
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # fault_helpers.py, beside this file
# shm_is_left_clean: the /dev/shm leak fixture, autouse, so every case here runs under it.
from fault_helpers import (TOOLS, lines_of, run, shm_clean,  # noqa: E402,F401
                           shm_is_left_clean)


# ---- leftovers in /dev/shm ----

def fake_segment(name, creator, magic=shm_clean.MAGIC, age_s=0.0):
    path = os.path.join("/dev/shm", name)
    with open(path, "wb") as f:
        if magic is not None:
            f.write(struct.pack("<QQQqq", magic, 4096, 64, 2, creator) + bytes(4096 - 40))
    if age_s:
        t = time.time() - age_s
        os.utime(path, (t, t))
    return path


def dead_pid():
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_stale_segments_are_removed_and_live_ones_kept(tmp_path):
    tag = "%016x" % (os.getpid() * 7919)
    dead = fake_segment(f"dtensor-{tag}-0000000000000001", dead_pid())
    live = fake_segment(f"dtensor-{tag}-0000000000000002", os.getpid())
    unfinished_old = fake_segment(f"dtensor-{tag}-0000000000000003", 0, magic=None, age_s=120)
    unfinished_new = fake_segment(f"dtensor-{tag}-0000000000000004", 0, magic=None)
    try:
        out = subprocess.run([sys.executable, os.path.join(TOOLS, "shm_clean.py")],
                             capture_output=True, text=True, check=True).stdout
        assert not os.path.exists(dead) and not os.path.exists(unfinished_old), out
        assert os.path.exists(live) and os.path.exists(unfinished_new), out
        # The C++ side: a job's first segment reclaims leftovers of dead jobs too (made here after
        # the launcher's own sweep, before the job's first collective).
        dead2 = os.path.join("/dev/shm", f"dtensor-{tag}-0000000000000005")
        code, out, _ = run(tmp_path, f"""
            F.init_from_env()
            if RANK == 0:
                import struct, subprocess
                p = subprocess.Popen(["true"]); p.wait()
                open({dead2!r}, "wb").write(struct.pack("<QQQqq", {shm_clean.MAGIC}, 4096, 64, 2,
                                                        p.pid) + bytes(4056))
            F.all_reduce(torch.ones(2))
            print("ok")
        """)
        assert code == 0, out
        assert not os.path.exists(dead2)
        assert os.path.exists(live)
    finally:
        for p in (live, unfinished_new):
            if os.path.exists(p):
                os.unlink(p)


def test_a_job_killed_before_every_rank_attached_leaves_nothing(tmp_path):
    code, out, _ = run(tmp_path, """
        F.init_from_env()
        if RANK == 1:
            os._exit(1)  # never attaches
        t = F.all_reduce(torch.ones(4), async_op=True)  # rank 0 creates the segment and waits
        time.sleep(1.0)
        os.kill(os.getpid(), 9)
    """, timeout_ms=30000)
    assert code != 0
    # the fixture checks that the launcher removed the segment


# ---- environment ----

def test_a_huge_timeout_means_no_deadline(tmp_path):
    code, out, _ = run(tmp_path, """
        F.init_from_env()
        assert F.all_reduce(torch.ones(3)).tolist() == [2.0] * 3
        print("ok")
    """, timeout_ms="9223372036854775807")
    assert code == 0 and out.count("ok") == 2, out


def test_a_bad_shm_buffer_size_is_explained_on_every_rank_at_once(tmp_path):
    code, out, took = run(tmp_path, """
        F.init_from_env()
        try:
            F.all_reduce(torch.ones(3))
        except RuntimeError as e:
            print("error:", e)
    """, timeout_ms=60000, DTENSOR_SHM_BUFFER_BYTES="12abc")
    for r in range(2):
        got = "\n".join(lines_of(out, r))
        assert "DTENSOR_SHM_BUFFER_BYTES='12abc'" in got and "group 'world'" in got, out
        assert f"global rank {r}" in got, out
    assert took < 30, out


def test_c10d_names_a_rank_that_never_reached_the_group(tmp_path):
    code, out, took = run(tmp_path, """
        F.init_from_env()
        if RANK == 1:
            sys.exit(0)  # leaves before the group's first collective connects it
        t0 = time.monotonic()
        try:
            F.all_reduce(torch.ones(2))
        except RuntimeError as e:
            print(f"error after {time.monotonic() - t0:.2f} s: {e}")
    """, backend="c10d", timeout_ms=3000)
    got = "\n".join(lines_of(out, 0))
    assert "group 'world' (c10d, ranks [0,1]) on global rank 0" in got, out
    assert "global ranks [1] never reached it" in got, out
    assert "Exception raised from" not in got, out  # no C++ backtrace in the message
    assert float(re.search(r"error after ([\d.]+) s", got).group(1)) < 3.0 + 1.0, out


@pytest.mark.parametrize("value", ["0", "-5", "abc", "99999999999999999999"])
def test_a_bad_timeout_is_named(tmp_path, value):
    code, out, _ = run(tmp_path, """
        try:
            F.init_from_env()
            print("accepted")
        except RuntimeError as e:
            print("error:", e)
    """, timeout_ms=value)
    for r in range(2):
        got = "\n".join(lines_of(out, r))
        assert f"DTENSOR_COLLECTIVE_TIMEOUT_MS='{value}' is not a positive integer" in got, out
