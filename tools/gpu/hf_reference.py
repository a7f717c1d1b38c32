"""Writes what tools/gpu/check.sh's hf stage needs and the device machine cannot make (it has no
transformers): tiny random-weight Hugging Face models written by transformers' save_pretrained,
and transformers' own logits and greedy tokens for them, computed here on the CPU.

    .venv/bin/python tools/gpu/hf_reference.py .gpu/hf      (tools/gpu/carry_deps.sh runs it)

For each model of tests/serving/hf_tiny.py's GPU_MODELS, DIR/<name>/ holds the model directory
and reference.pt: the prompts, the decode steps, each prompt's float32 logits at every position
of prompt + greedy tokens, the greedy tokens of model.generate(do_sample=False), and the largest
error of transformers' own bfloat16 forward against its float32 one (the bfloat16 bound)."""

import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "serving"))
import hf_tiny  # noqa: E402


def main(out):
    for name in hf_tiny.GPU_MODELS:
        model = hf_tiny.build(name)
        path = os.path.join(out, name)
        model.save_pretrained(path, **hf_tiny.MODELS[name][2])
        bf16 = type(model)(model.config).to(torch.bfloat16).eval()
        bf16.load_state_dict(model.state_dict())
        ref = {"prompts": hf_tiny.PROMPTS, "steps": hf_tiny.STEPS, "logits": [], "tokens": [],
               "bf16_err": 0.0}
        for prompt in hf_tiny.PROMPTS:
            logits, tokens = hf_tiny.reference(model, prompt)
            ref["logits"].append(logits)
            ref["tokens"].append(tokens)
            with torch.no_grad():
                theirs = bf16(torch.tensor([prompt])).logits[0].float()
            err = (theirs - logits[:len(prompt)]).abs().max().item()
            ref["bf16_err"] = max(ref["bf16_err"], err)
        torch.save(ref, os.path.join(path, "reference.pt"))
        print(f"{path}: {len(hf_tiny.PROMPTS)} prompts, bf16 error of transformers "
              f"{ref['bf16_err']:.3g}")


if __name__ == "__main__":
    main(sys.argv[1])
