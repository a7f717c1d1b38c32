"""The demo's Llama-style model (one block), shared by examples/llama_train.py (tensor-parallel
training), the C++ server's parity test (serving/, examples/llama_parity_test.py) and anyone who
loads the demo's checkpoint: embedding, RMS norm, rotary attention, SwiGLU MLP, head.

The model code is plain PyTorch and runs on plain tensors (one process) or on distributed tensors
handed to it by the parallel layers of tp_plan(). Parameter names (the checkpoint's keys) are
those of the state dict: tok_embeddings.weight, attention_norm.weight, attention.w{q,k,v,o}.weight,
ffn_norm.weight, feed_forward.w{1,2,3}.weight, norm.weight, output.weight.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import dtensor
from dtensor import DTensor, Replicate
from dtensor.parallel import ColwiseParallel, RowwiseParallel

VOCAB, DIM, HEADS, HIDDEN = 512, 128, 8, 384
ROPE_THETA = 10000.0


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(seq, head_dim, theta=ROPE_THETA):
    """cos and sin [seq, head_dim] (float32) for positions 0..seq-1 (Llama's rotate_half form:
    the two halves of the head dim share the frequencies). Computed in float64 and rounded, with
    the same ops as serving/llama.cc (NOTE [rotary tables] there), so both get equal tables."""
    f64 = torch.float64
    inv_freq = torch.pow(theta, torch.arange(0, head_dim, 2, dtype=f64) / head_dim).reciprocal()
    angles = torch.outer(torch.arange(seq, dtype=f64), inv_freq)
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().float(), emb.sin().float()


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _like(t, ref):
    """`t` (plain, equal on every rank) replicated on `ref`'s mesh when `ref` is distributed,
    else on `ref`'s device."""
    if isinstance(ref, DTensor):
        mesh = ref.device_mesh
        return dtensor.distribute_tensor(t, mesh, [Replicate()] * mesh.ndim, src_data_rank=None)
    return t.to(ref.device)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq = nn.Linear(DIM, DIM, bias=False)
        self.wk = nn.Linear(DIM, DIM, bias=False)
        self.wv = nn.Linear(DIM, DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x, mask):
        b, s, d = x.shape
        hd = d // HEADS
        # Heads first ([H, B, S, hd]): matmul folds batch dims with the (sharded) heads leading.
        q, k, v = (w(x).view(b, s, HEADS, hd).permute(2, 0, 1, 3)
                   for w in (self.wq, self.wk, self.wv))
        cos, sin = (_like(t, q) for t in rope_tables(s, hd))
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
        attn = torch.softmax(scores.masked_fill(mask, -1e9), dim=-1)
        return self.wo((attn @ v).permute(1, 2, 0, 3).reshape(b, s, d))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w3 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.attention_norm = RMSNorm(DIM)
        self.attention = Attention()
        self.ffn_norm = RMSNorm(DIM)
        self.feed_forward = FeedForward()
        self.norm = RMSNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens, mask):
        h = self.tok_embeddings(tokens)
        h = h + self.attention(self.attention_norm(h), mask)
        h = h + self.feed_forward(self.ffn_norm(h))
        return self.output(self.norm(h))


def tp_plan():
    keep = dict(use_local_output=False)
    return {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), **keep),
        "attention.wq": ColwiseParallel(**keep),
        "attention.wk": ColwiseParallel(**keep),
        "attention.wv": ColwiseParallel(**keep),
        "attention.wo": RowwiseParallel(**keep),
        "feed_forward.w1": ColwiseParallel(**keep),
        "feed_forward.w3": ColwiseParallel(**keep),
        "feed_forward.w2": RowwiseParallel(**keep),
        "output": ColwiseParallel(output_layouts=Replicate(), **keep),
    }


@torch.no_grad()
def greedy_generate(model, prompt_tokens, max_new_tokens):
    """Greedy generation on the plain one-process model: every step recomputes the whole sequence
    under the causal mask and appends the argmax of the last position's logits (torch.argmax:
    on an exact tie the lowest token id wins, as in the C++ server). Returns the new tokens."""
    tokens = list(prompt_tokens)
    out = []
    for _ in range(max_new_tokens):
        s = len(tokens)
        mask = torch.ones(s, s, dtype=torch.bool).triu(1)
        logits = model(torch.tensor([tokens], dtype=torch.int64), mask)
        nxt = int(torch.argmax(logits[0, -1]).item())
        tokens.append(nxt)
        out.append(nxt)
    return out
