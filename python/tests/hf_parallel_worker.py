"""Ranks of hf_parallel_test: Hugging Face transformers' own n-D parallelism
(``from_pretrained(dir, distributed_config=DistributedConfig(...))``), unmodified, on the engine
through the opt-in, against the one-process reference the test saved beside each model.

usage: hf_parallel_worker.py CONFIG RESULTS MODEL_DIR...

For each model in turn, checks, stopping at the first that fails: the logits; greedy
``generate``; one training step's loss and every parameter's gradient (``full_tensor()`` where
distributed) -- fp32, rtol = atol = 1e-5. Every rank's outcome is all-gathered after each model
and rank 0 appends one line to RESULTS: ``MODEL_DIR<TAB>ok`` or ``MODEL_DIR<TAB>what failed``, so
a model that fails leaves the next ones checked (ranks that fail alike stay in step; a rank stuck
past CASE_TIMEOUT seconds exits, the launcher ends the others, and the models not reported yet
are rerun one per launch by the test)."""

import dtensor.as_torch  # noqa: F401  (the opt-in: before transformers binds torch's names)

import faulthandler
import os
import sys
import traceback

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM
from transformers.distributed import DistributedConfig

from dtensor import _C  # only to check that the distributed parameters are the engine's

# PyTorch's own DTensor class (its private module stays torch's under the opt-in).
TorchDTensor = sys.modules["torch.distributed.tensor._api"].DTensor

TOL = dict(rtol=1e-5, atol=1e-5)
WORLD = int(os.environ["WORLD_SIZE"])

# The DistributedConfig of each case, on WORLD processes. enable_sequence_parallel is
# "reserved, not wired up yet" in transformers 5.23: tp_sp runs what tp runs.
CONFIGS = {
    "tp": lambda: dict(tp_plan="auto"),
    "tp_sp": lambda: dict(tp_plan="auto", enable_sequence_parallel=True),
    "tp_ep": lambda: dict(tp_size=WORLD, ep_size=WORLD),
    "tp_ep_all_reduce": lambda: dict(tp_size=WORLD, ep_size=WORLD,
                                     ep_implementation="all_reduce"),
    "fsdp": lambda: dict(fsdp_size=WORLD),
    "fsdp_offload": lambda: dict(fsdp_size=WORLD, fsdp_cpu_offload=True),
    "fsdp_ep": lambda: dict(fsdp_size=WORLD, ep_size=WORLD),
    "tp2_fsdp": lambda: dict(tp_size=2, fsdp_size=WORLD // 2),
    "tp2_fsdp_ep2": lambda: dict(tp_size=2, fsdp_size=WORLD // 2, ep_size=2),
    "tp2_fsdp_ep": lambda: dict(tp_size=2, fsdp_size=WORLD // 2, ep_size=WORLD),
    "hsdp": lambda: dict(dp_replicate_size=2, fsdp_size=WORLD // 2),
    "hsdp_tp2": lambda: dict(dp_replicate_size=WORLD // 2, tp_size=2),
}


def full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def check(model_dir, config):
    ref = torch.load(os.path.join(model_dir, "ref.pt"))
    ids = ref["ids"]
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, distributed_config=DistributedConfig(**CONFIGS[config]()))
    assert any(_C.is_dtensor(p) for p in model.parameters()), "no parameter is distributed"
    assert not any(isinstance(p, TorchDTensor) for p in model.parameters()), \
        "a parameter is PyTorch's DTensor"

    model.eval()
    with torch.no_grad():
        logits = full(model(ids).logits)
    torch.testing.assert_close(logits, ref["logits"], **TOL, msg=lambda m: "logits: " + m)

    prompt = ids[:, :5]
    generated = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                               max_new_tokens=3, pad_token_id=0)
    assert torch.equal(full(generated), ref["generated"]), \
        f"generate: {generated.tolist()} != {ref['generated'].tolist()}"

    model.train()
    loss = full(model(input_ids=ids, labels=ids).loss)
    loss.backward()
    torch.testing.assert_close(loss.detach(), ref["loss"], **TOL, msg=lambda m: "loss: " + m)
    grads = ref["grads"]
    names = []
    for name, p in model.named_parameters():  # the same order on every rank (collectives)
        names.append(name)
        assert p.grad is not None or name not in grads, f"{name}: no gradient"
        if name in grads:
            torch.testing.assert_close(full(p.grad), grads[name], **TOL,
                                       msg=lambda m, name=name: f"grad of {name}: {m}")
    assert set(grads) <= set(names), sorted(set(grads) - set(names))


def main(config, results, *model_dirs):
    faulthandler.enable()
    if not dist.is_initialized():
        dist.init_process_group("gloo")  # what transformers does on the CPU
    for model_dir in model_dirs:
        faulthandler.dump_traceback_later(int(os.environ.get("CASE_TIMEOUT", "300")), exit=True)
        try:
            check(model_dir, config)
            outcome = "ok"
        except Exception as e:  # noqa: BLE001  (reported, and the next model checked)
            traceback.print_exc()
            lines = str(e).strip().splitlines() or [""]
            outcome = f"{type(e).__name__}: {lines[0][:300]}"
        outcomes = [None] * dist.get_world_size()
        dist.all_gather_object(outcomes, outcome)
        faulthandler.cancel_dump_traceback_later()
        bad = sorted({o for o in outcomes if o != "ok"})
        if dist.get_rank() == 0:
            with open(results, "a") as f:
                f.write(f"{model_dir}\t{'; '.join(bad) if bad else 'ok'}\n")
    print("hf_parallel_worker: done", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
