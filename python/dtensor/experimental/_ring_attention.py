"""Ring attention on this rank's pieces of q/k/v sharded along the sequence (dim -2 of
``[..., heads, seq, dim]``), for ``context_parallel``: a thin autograd wrapper over the C++ ring
(``dtensor/ring_attention.h``: blocks on ATen's fused CPU kernel, the log-sum-exp merge in fp32,
k/v by one all_gather or W-1 rotations, causal blocks by global positions), which the C++
engine also runs for distributed q/k/v sharded along the sequence (NOTE [ring attention in the
engine]). ``_SeqLayout`` says which global positions every rank holds (natural or head-tail
order), so every rank knows every other rank's piece sizes without asking.
"""

import math
from dataclasses import dataclass
from enum import Enum, auto

import torch

from dtensor import _C

__all__ = ["_RotateMethod", "_cp_options", "_SeqLayout", "_ring_sdpa", "set_rotate_method"]


class _RotateMethod(Enum):
    ALL_TO_ALL = auto()
    ALL_GATHER = auto()


_METHOD_NAMES = {_RotateMethod.ALL_TO_ALL: "alltoall", _RotateMethod.ALL_GATHER: "allgather"}


@dataclass
class _ContextParallelOptions:
    """PyTorch's ``_cp_options``: ``enable_load_balance`` (head-tail sharding of the buffers of
    ``context_parallel``) and the rotate method; the merge is always fp32. The rotate method is
    the process-wide one the C++ engine reads as well (one setting for both paths)."""
    convert_to_f32: bool = True
    enable_load_balance: bool = True

    @property
    def rotate_method(self):
        return (_RotateMethod.ALL_TO_ALL if _C.rotate_method() == "alltoall"
                else _RotateMethod.ALL_GATHER)

    @rotate_method.setter
    def rotate_method(self, method):
        _C.set_rotate_method(_METHOD_NAMES[_RotateMethod(method)])


_cp_options = _ContextParallelOptions()


def set_rotate_method(rotate_method):
    """``"allgather"`` (default: k/v gathered once) or ``"alltoall"`` (k/v rotated around the
    ring, W-1 steps forward). PyTorch's API."""
    if rotate_method not in ("allgather", "alltoall"):
        raise NotImplementedError(f"Context Parallel does not support using {rotate_method} for "
                                  f"kv shards rotation; use 'allgather' or 'alltoall'")
    _C.set_rotate_method(rotate_method)


class _SeqLayout:
    """Global positions of every rank's piece of a sequence of ``seq_len`` on ``world`` ranks.

    Natural order: rank r holds piece r of torch.chunk's rule (``Shard``'s arithmetic).
    Head-tail (``load_balance``): the sequence is cut into 2W chunks by the same rule and rank r
    holds chunks r and 2W-1-r, concatenated; with uneven lengths trailing chunks may be short or
    empty."""

    def __init__(self, seq_len, world, load_balance):
        self.seq_len, self.world, self.load_balance = seq_len, world, load_balance
        if load_balance:
            chunks = [_C.chunk_slice(seq_len, 2 * world, c) for c in range(2 * world)]
            self.segments = [[chunks[r], chunks[2 * world - 1 - r]] for r in range(world)]
        else:
            self.segments = [[_C.chunk_slice(seq_len, world, r)] for r in range(world)]
        self.lengths = [sum(size for size, _ in segs) for segs in self.segments]

    def positions(self, rank, device=None):
        parts = [torch.arange(off, off + size, device=device) for size, off in self.segments[rank]]
        return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long, device=device)

    def runs(self):
        """Per rank, its (offset, size) runs: the C++ ring's ``SeqLayout::segments``."""
        return [[(off, size) for size, off in segs] for segs in self.segments]

    def __eq__(self, other):
        return isinstance(other, _SeqLayout) and (self.seq_len, self.world, self.load_balance) \
            == (other.seq_len, other.world, other.load_balance)

    def __repr__(self):
        kind = "head-tail" if self.load_balance else "natural"
        return f"_SeqLayout({self.seq_len} on {self.world} ranks, {kind}: {self.lengths})"


@dataclass
class _RingPlan:
    """What one ring attention call needs besides q/k/v: the group of the sequence mesh dim,
    this rank's index in it, the layouts of q and of k/v, and the SDPA arguments."""
    group: str
    rank: int
    q_layout: _SeqLayout
    kv_layout: _SeqLayout
    is_causal: bool
    scale: float
    method: _RotateMethod

    def args(self):
        """The plan as the C++ ring's arguments after the tensors."""
        return (self.group, self.rank, self.q_layout.seq_len, self.q_layout.runs(),
                self.kv_layout.seq_len, self.kv_layout.runs(), self.is_causal, self.scale,
                _METHOD_NAMES[self.method])


class _RingAttention(torch.autograd.Function):
    """Ring attention on local pieces q [..., Hq, Lq, E], k [..., Hk, Lk, E], v [..., Hk, Lk, Ev];
    returns the local output [..., Hq, Lq, Ev]."""

    @staticmethod
    def forward(ctx, q, k, v, plan):
        out, lse = _C.ring_attention_forward(q, k, v, *plan.args())
        ctx.plan = plan
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, g):
        q, k, v, out, lse = ctx.saved_tensors
        return _C.ring_attention_backward(g, q, k, v, out, lse, *ctx.plan.args()) + (None,)


def _ring_sdpa(q, k, v, plan):
    """Ring attention on this rank's pieces (differentiable in q, k, v)."""
    return _RingAttention.apply(q, k, v, plan)


def _check_sdpa_args(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """SDPA's arguments that ring attention supports; returns the scale."""
    if attn_mask is not None:
        raise NotImplementedError("context parallel attention: attn_mask is not supported; use "
                                  "is_causal=True or no mask")
    if dropout_p:
        raise NotImplementedError(f"context parallel attention: dropout_p={dropout_p} is not "
                                  f"supported (only dropout_p=0.0)")
    if q.dim() < 2 or k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(f"context parallel attention: q, k, v must have the same number of "
                         f"dims >= 2, got {q.dim()}, {k.dim()}, {v.dim()}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"context parallel attention: q and k head dims differ "
                         f"({q.shape[-1]} vs {k.shape[-1]})")
    if q.dim() >= 3 and k.shape[-3] != q.shape[-3]:
        if not enable_gqa or q.shape[-3] % k.shape[-3]:
            raise ValueError(f"context parallel attention: q has {q.shape[-3]} heads and k "
                             f"{k.shape[-3]}; pass enable_gqa=True with q heads a multiple of k's")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"context parallel attention: k {list(k.shape)} and v {list(v.shape)} "
                         f"differ before the last dim")
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
