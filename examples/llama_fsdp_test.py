"""./x demo fsdp (examples/llama_fsdp.py) on 4 processes: FSDP and FSDP x TP (2, 2) train with
losses equal to one process's (the demo exits 1 past its tolerance), each rank holds a quarter
of the training state, and the 2-D parameters carry PyTorch's placements."""

import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def test_fsdp_demo_matches_one_process():
    env = dict(os.environ, PYTHONSAFEPATH="1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, os.environ["LAUNCH_PY"], "-n", "4", "--",
                          sys.executable, os.path.join(HERE, "llama_fsdp.py"), "--steps", "2"],
                         env=env, capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert len(re.findall(r"largest \|loss diff\| .*: equal", text)) == 2, text
    states = re.findall(r"training state per rank .*\((\d\.\d\d)x\)", text)
    assert states == ["0.25", "0.25"], text
    assert "placed (_StridedShard(dim=0, sf=2), Shard(dim=0)) on ('dp', 'tp')" in text, text
