"""tools/gpu/check.sh's hf stage: hf_logits' output (the C++ server's model of a Hugging Face
directory, run on the GPU) against transformers' reference computed on the CPU
(tools/gpu/hf_reference.py, reference.pt beside the model).

    hf_compare.py MODEL_DIR OUT.safetensors float32|bfloat16 LABEL

float32: every prefill position's and decode step's logits within 1e-4 of transformers', and
the greedy tokens equal to its generate(). bfloat16: the prefill logits as close to
transformers' float32 ones as transformers' own bfloat16 forward is (2x its error + 1e-2, the
bound tests/serving/hf_models_test.py holds the CPU to), and the first greedy token equal.
Prints one line, "LABEL: ok ..." or "LABEL: MISMATCH ..."; exits 1 on a mismatch. Reads
safetensors itself (the device machine has torch only)."""

import json
import struct
import sys

import torch

_DTYPES = {"F32": torch.float32, "I64": torch.int64, "BF16": torch.bfloat16,
           "F16": torch.float16}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = bytearray(data[8 + n + begin:8 + n + end])
        out[name] = torch.frombuffer(raw, dtype=_DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def compare(ref, got, dtype):
    """The worst error and a list of what differs."""
    worst, bad = 0.0, []
    for i, prompt in enumerate(ref["prompts"]):
        n = len(prompt)
        want = ref["logits"][i].float()
        err = (got[f"prefill.{i}"].float() - want[:n]).abs().max().item()
        tokens = got[f"tokens.{i}"].tolist()
        if dtype == "float32":
            err = max(err, (got[f"decode.{i}"].float() - want[n:n + ref["steps"]])
                      .abs().max().item())
            if err > 1e-4:
                bad.append(f"prompt {i}: logits differ by {err:.3g} > 1e-4")
            if tokens != ref["tokens"][i]:
                bad.append(f"prompt {i}: tokens {tokens} != transformers' {ref['tokens'][i]}")
        else:
            bound = 2 * ref["bf16_err"] + 1e-2
            if err > bound:
                bad.append(f"prompt {i}: prefill logits differ by {err:.3g} > {bound:.3g}")
            if tokens[:1] != ref["tokens"][i][:1]:
                bad.append(f"prompt {i}: first token {tokens[:1]} != {ref['tokens'][i][:1]}")
        worst = max(worst, err)
    return worst, bad


def main(model_dir, out, dtype, label):
    ref = torch.load(f"{model_dir}/reference.pt")
    worst, bad = compare(ref, read_safetensors(out), dtype)
    if bad:
        print(f"{label}: MISMATCH: " + "; ".join(bad))
        return 1
    print(f"{label}: ok, logits within {worst:.3g} of transformers'"
          + (", greedy tokens equal" if dtype == "float32" else
             f" (transformers' own bfloat16: {ref['bf16_err']:.3g})"))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
