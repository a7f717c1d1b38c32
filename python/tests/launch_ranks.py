"""Test helper: runs a Python script on N local processes with ./x launch and checks that every
rank printed "ok"."""

import os
import subprocess
import sys


def run_on_ranks(script_text, n, tmp_path, name="worker", **env_extra):
    script = tmp_path / f"{name}.py"
    script.write_text(script_text)
    env = dict(os.environ, PYTHONSAFEPATH="1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p), **env_extra)
    out = subprocess.run([sys.executable, os.environ["LAUNCH_PY"], "-n", str(n), "--",
                          sys.executable, str(script)], env=env, capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("ok") == n, out.stdout
    return out.stdout
