"""The C++ server's model (serving/llama.h, through tools/llama_generate) against the Python
model (llama_model.py): greedy generations from the same checkpoint agree token for token on 1,
2 and 4 ranks, for a checkpoint saved by one process and one saved sharded by 4 ranks (the demo's
tensor-parallel layout: trained on 4, served on 1, 2 or 4). Nothing is trained and no expected
tokens are written down: both sides generate from the same random weights."""

import json
import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dtensor  # noqa: E402
import dtensor.checkpoint  # noqa: E402
from dtensor.parallel import parallelize_module  # noqa: E402
from llama_model import Llama, greedy_generate, tp_plan  # noqa: E402

# (prompt, new tokens): the second runs past the C++ decode's first length bucket of 64
# positions (NOTE [decode length buckets] in serving/llama.cc).
PROMPTS = [([1, 2, 3, 4, 5], 24), ([300, 7, 511, 0, 42, 42, 42, 9, 128, 64, 250], 70)]


def _binary():
    root = os.environ.get("TEST_SRCDIR")
    assert root, "run under bazel test (the binary comes from the runfiles)"
    return os.path.join(root, os.environ["TEST_WORKSPACE"], "tools", "llama_generate")


def _model(seed):
    torch.manual_seed(seed)
    model = Llama()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # away from their all-ones init, so that they matter
                p.add_(0.1 * torch.randn_like(p))
            if name in ("attention.wq.weight", "attention.wk.weight"):
                # Sharp attention: with nn.Linear's init it is near uniform, and the generation
                # hardly depends on positions (a model without RoPE gave the same tokens).
                p.mul_(4.0)
    return model


def _cpp_generate(ckpt, prompt, new_tokens, ranks):
    out = subprocess.run(
        [_binary(), f"--checkpoint={ckpt}", "--prompt=" + ",".join(map(str, prompt)),
         f"--max_new_tokens={new_tokens}", f"--ranks={ranks}"],
        check=True, capture_output=True, text=True, timeout=300)
    return json.loads(out.stdout)["tokens"]


def _save_on_4_ranks(model, ckpt):
    """Saves `model` as the demo does: parallelized on 4 ranks (threads), each writing its
    shards."""
    state = {k: v.clone() for k, v in model.state_dict().items()}

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (4,))
        local = Llama()
        local.load_state_dict(state)
        parallelize_module(local, mesh, tp_plan())
        dtensor.distribute_module(local, mesh)
        dtensor.checkpoint.save(local.state_dict(), checkpoint_id=str(ckpt))

    dtensor.run_threads(4, rank_fn)


@pytest.mark.parametrize("saved_on", [1, 4])
def test_cpp_generation_equals_python(tmp_path, saved_on):
    model = _model(seed=11 + saved_on)
    ckpt = tmp_path / "ckpt"
    if saved_on == 1:
        dtensor.checkpoint.save(model.state_dict(), checkpoint_id=str(ckpt))
    else:
        _save_on_4_ranks(model, ckpt)
        assert (ckpt / "rank-3.safetensors").exists()
    for prompt, new_tokens in PROMPTS:
        expected = greedy_generate(model, prompt, new_tokens)
        assert len(set(expected)) > 1  # not a degenerate model
        for ranks in (1, 2, 4):
            assert _cpp_generate(ckpt, prompt, new_tokens, ranks) == expected, (prompt, ranks)
