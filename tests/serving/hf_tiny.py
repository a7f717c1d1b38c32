"""Tiny random-weight Hugging Face models of each family the C++ server serves, built with
transformers (hf_models_test.py; tools/gpu/hf_reference.py writes GPU_MODELS for the device
machine's check), and transformers' reference logits and greedy tokens for them."""

import torch
import transformers

PROMPTS = [[3, 17, 99, 5, 64, 8, 120], [7, 1, 45, 45, 2, 90, 33, 11, 100, 6, 71]]
STEPS = 5
SIZES = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, max_position_embeddings=64)


def _llama3():
    return transformers.LlamaConfig(
        **SIZES, num_key_value_heads=2, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16})


MODELS = {
    # name: (config factory, model class, save_pretrained kwargs)
    "llama3_gqa": (_llama3, transformers.LlamaForCausalLM, {}),
    "llama_tied_mqa_sharded": (
        lambda: transformers.LlamaConfig(**SIZES, num_key_value_heads=1, tie_word_embeddings=True,
                                         rope_theta=500000.0),
        transformers.LlamaForCausalLM, {"max_shard_size": "40KB"}),
    "mistral": (lambda: transformers.MistralConfig(**SIZES, num_key_value_heads=1,
                                                   sliding_window=64),
                transformers.MistralForCausalLM, {}),
    "qwen2_bias": (lambda: transformers.Qwen2Config(**SIZES, num_key_value_heads=2,
                                                    tie_word_embeddings=True),
                   transformers.Qwen2ForCausalLM, {}),
    "qwen3_qk_norm": (lambda: transformers.Qwen3Config(**SIZES, num_key_value_heads=2,
                                                       head_dim=32),
                      transformers.Qwen3ForCausalLM, {}),
}


def randomize(model):
    # transformers initializes norms to 1 and biases to 0, which would hide their handling; and
    # weights of std 0.02 give nearly flat logits. Spread them.
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name:
                p.copy_(1 + 0.2 * noise)
            elif name.endswith("bias"):
                p.copy_(0.3 * noise)
            else:
                p.copy_(0.15 * noise)


def build(name):
    """Model `name` of MODELS in eval mode, weights drawn from seed 0 and spread (randomize)."""
    make_config, cls, _ = MODELS[name]
    torch.manual_seed(0)
    model = cls(make_config()).eval()
    randomize(model)
    return model


# The families tools/gpu/check.sh serves on the GPU: GQA with llama3 rope scaling, and biases.
GPU_MODELS = ["llama3_gqa", "qwen2_bias"]


def reference(model, prompt, tokens=None):
    """transformers' logits at every position of prompt + tokens[:STEPS] (tokens: the greedy
    ones of its generate() when None), and its generate()'s STEPS + 1 greedy tokens."""
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    with torch.no_grad():
        gen = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt),
                                                                                dtype=torch.long),
                             max_new_tokens=STEPS + 1, do_sample=False)
    generated = gen[0, len(prompt):].tolist()
    seq = torch.tensor([prompt + (generated if tokens is None else tokens)[:STEPS]])
    with torch.no_grad():
        logits = model(seq).logits[0]
    return logits, generated
