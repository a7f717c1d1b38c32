"""./x launch's two ways to start a `python3 script.py` rank, exec and --preload (NOTE [preloaded
ranks] in tools/launch.py), give the script the same world: arguments, __main__, sys.path,
environment, exit codes, atexit handlers, threads joined at exit, its own numpy seed."""

import os
import subprocess
import sys

import pytest

SCRIPT = r'''
import atexit, os, sys, threading, time
import numpy
rank = int(os.environ["RANK"])
print(f"argv={sys.argv[1:]} name={__name__} file={os.path.basename(__file__)} "
      f"path0={os.path.basename(sys.path[0])} world={os.environ['WORLD_SIZE']} "
      f"token={bool(os.environ.get('DTENSOR_JOB_TOKEN'))}", flush=True)
print(f"numpy {numpy.random.randint(1 << 30)}", flush=True)
atexit.register(lambda: print("atexit ran", flush=True))
def late():
    time.sleep(0.3)
    print("thread joined", flush=True)
threading.Thread(target=late).start()
with open(os.path.join(os.environ["OUT_DIR"], f"unflushed{rank}.txt"), "w") as f:
    f.write("written")
how = sys.argv[1]
if how == "exit3" and rank == 1:
    sys.exit(3)
if how == "raise" and rank == 1:
    raise ValueError("boom")
if how == "message" and rank == 1:
    sys.exit("a message")
if how == "minus1" and rank == 1:
    sys.exit(-1)
'''


def launch(tmp_path, how, preload):
    script = tmp_path / "rank_script.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
               OUT_DIR=str(tmp_path))
    env.pop("DTENSOR_LAUNCH_PRELOAD", None)
    cmd = [sys.executable, os.environ["LAUNCH_PY"], "-n", "2"] + (["--preload"] if preload else [])
    out = subprocess.run(cmd + ["--", sys.executable, str(script), how], env=env,
                         capture_output=True, text=True, timeout=120)
    return out.returncode, out.stdout, out.stderr


def rank_lines(out, rank, drop=("numpy",)):
    return sorted(l for l in out.splitlines()
                  if l.startswith(f"[rank {rank}] ") and l.split()[2] not in drop)


@pytest.mark.parametrize("how", ["ok", "exit3", "raise", "message", "minus1"])
def test_preloaded_ranks_see_what_exec_ranks_see(tmp_path, how):
    runs = {preload: launch(tmp_path, how, preload) for preload in (False, True)}
    (code_e, out_e, err_e), (code_p, out_p, err_p) = runs[False], runs[True]
    assert code_e == code_p == (0 if how == "ok" else 1), (out_e, err_e, out_p, err_p)
    for rank in (0, 1):
        assert rank_lines(out_e, rank) == rank_lines(out_p, rank), (out_e, out_p)
        assert f"[rank {rank}] argv=['{how}'] name=__main__ file=rank_script.py" in out_p
        assert (tmp_path / f"unflushed{rank}.txt").read_text() == "written"
    assert "[rank 0] atexit ran" in out_p and "[rank 0] thread joined" in out_p
    if how == "exit3":
        assert "rank 1 exited with 3" in err_p
    if how == "raise":
        assert "ValueError: boom" in out_p
    if how == "message":
        assert "[rank 1] a message" in out_p
    if how == "minus1":
        assert "rank 1 exited with 255" in err_p and "rank 1 exited with 255" in err_e


def test_preloaded_ranks_draw_their_own_numpy_seed(tmp_path):
    _, out, _ = launch(tmp_path, "ok", True)
    draws = {l.split()[-1] for l in out.splitlines() if " numpy " in l}
    assert len(draws) == 2, out
