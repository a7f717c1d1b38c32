"""The serving model of Hugging Face directories (serving/models/) against transformers itself.

Tiny random models of each family are built with transformers and written by save_pretrained
(the real file layout: config.json, model.safetensors, or shards with an index): Llama with
rope_scaling llama3 and GQA, Llama with tied embeddings and one kv head (MQA) saved in shards,
Mistral, Qwen2 with q/k/v biases, Qwen3 with q/k norms and a head_dim that is not
hidden/heads. tests/serving/hf_logits runs each on 1, 2 and 4 launched ranks (real processes; kv
heads sharded when they divide by the ranks, replicated otherwise) with two prompts batched
together, a small cache block and a prefill chunk shorter than the prompts, and reports every
prefill position's logits, every decode step's logits and the greedy tokens. They must equal
transformers' forward on the same tokens (float32, 1e-4) and model.generate(do_sample=False)
token for token. A bfloat16 run (weights converted at load) stays as close to float32 as
transformers' own bfloat16 forward. Weights stored in bfloat16 and float16 and converted to float32
at load equal transformers loading the same files in float32. Each rank reads from the files only
the bytes of its pieces (counted by the safetensors reader).
"""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

transformers = pytest.importorskip("transformers")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_tiny import MODELS, PROMPTS, SIZES, STEPS, build, randomize, reference  # noqa: E402

LAUNCH, BIN = os.environ["LAUNCH_PY"], os.environ["HF_LOGITS_BIN"]


@pytest.fixture(scope="module", params=sorted(MODELS))
def hf_model(request, tmp_path_factory):
    save_kwargs = MODELS[request.param][2]
    model = build(request.param)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(str(path), **save_kwargs)
    if save_kwargs:
        assert (path / "model.safetensors.index.json").exists()
        assert len(list(path.glob("model-*.safetensors"))) > 1
    return request.param, model, str(path)


def _run(path, n, tmp_path, *args):
    out = str(tmp_path / f"logits-{n}.safetensors")
    cmd = [BIN, "--model", path, "--prompts", ";".join(",".join(map(str, p)) for p in PROMPTS),
           "--steps", str(STEPS), "--out", out, "--block_size", "4", "--prefill_chunk", "5", *args]
    if n > 1:
        cmd = [sys.executable, LAUNCH, "-n", str(n), "--"] + cmd
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return load_file(out)


def _expected_bytes_read(model, ranks, rank):
    """The bytes of rank `rank`'s pieces under NOTE [HF tensor parallelism] (torch.chunk's
    split of each sharded dim), from the weights' names and shapes alone."""
    cfg = model.config
    kv_sharded = cfg.num_key_value_heads % ranks == 0
    total = 0
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        dim = None
        if any(k in name for k in ("q_proj", "gate_proj", "up_proj", "embed_tokens", "lm_head")):
            dim = 0
        elif any(k in name for k in ("k_proj", "v_proj")):
            dim = 0 if kv_sharded else None
        elif any(k in name for k in ("o_proj", "down_proj")):
            dim = 1
        piece = t if dim is None else torch.chunk(t, ranks, dim)[rank]
        total += piece.numel() * t.element_size()
    return total


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_logits_and_greedy_equal_transformers(hf_model, ranks, tmp_path):
    name, model, path = hf_model
    got = _run(path, ranks, tmp_path)
    for i, prompt in enumerate(PROMPTS):
        tokens = got[f"tokens.{i}"].tolist()
        ref, generated = reference(model, prompt, tokens)
        S = len(prompt)
        torch.testing.assert_close(got[f"prefill.{i}"], ref[:S], rtol=0, atol=1e-4,
                                   msg=lambda m: f"{name} on {ranks} ranks, prefill {i}: {m}")
        for k in range(STEPS):
            torch.testing.assert_close(
                got[f"decode.{i}"][k], ref[S + k], rtol=0, atol=1e-4,
                msg=lambda m: f"{name} on {ranks} ranks, prompt {i} decode step {k}: {m}")
        assert tokens == generated, f"{name} on {ranks} ranks, prompt {i}"
    # Each rank read only its pieces of the weights.
    for rank in range(ranks):
        got_bytes = int(open(str(tmp_path / f"logits-{ranks}.safetensors") +
                             f".bytes_read.{rank}").read())
        assert got_bytes == _expected_bytes_read(model, ranks, rank), (name, ranks, rank)


@pytest.mark.parametrize("stored", [torch.bfloat16, torch.float16])
def test_stored_half_precision_converted_to_float32(stored, tmp_path):
    """Weights stored in bfloat16 / float16, served with --dtype float32: equal to transformers
    loading the same file in float32."""
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        **SIZES, num_key_value_heads=2, head_dim=16)).eval()
    randomize(model)
    path = str(tmp_path / "half")
    model.to(stored).save_pretrained(path)
    assert json.load(open(os.path.join(path, "config.json")))["dtype"] == str(stored).split(".")[1]
    ref_model = transformers.Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    got = _run(path, 2, tmp_path, "--dtype", "float32")
    for i, prompt in enumerate(PROMPTS):
        ref, generated = reference(ref_model, prompt, got[f"tokens.{i}"].tolist())
        torch.testing.assert_close(got[f"prefill.{i}"], ref[:len(prompt)], rtol=0, atol=1e-4)
        torch.testing.assert_close(got[f"decode.{i}"], ref[len(prompt):len(prompt) + STEPS],
                                   rtol=0, atol=1e-4)
        assert got[f"tokens.{i}"].tolist() == generated


def test_bfloat16_as_close_as_transformers(hf_model, tmp_path):
    name, model, path = hf_model
    got = _run(path, 2, tmp_path, "--dtype", "bfloat16")
    bf16 = type(model)(model.config).to(torch.bfloat16).eval()
    bf16.load_state_dict(model.state_dict())
    for i, prompt in enumerate(PROMPTS):
        seq = torch.tensor([prompt])
        with torch.no_grad():
            ref = model(seq).logits[0]
            theirs = bf16(seq).logits[0].float()
        err_theirs = (theirs - ref).abs().max().item()
        err_ours = (got[f"prefill.{i}"] - ref).abs().max().item()
        assert err_ours <= 2 * err_theirs + 1e-2, (name, i, err_ours, err_theirs)
