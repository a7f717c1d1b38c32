"""Ring attention: scaled dot-product attention on q/k/v sharded along the sequence.

Each rank holds pieces of the sequence of q, k and v (dim -2 of
``[..., heads, seq, dim]``); ``_SeqLayout`` says which global positions every rank holds, so every
rank knows every other rank's piece sizes without asking. The query never moves. The keys and
values move, either by rotation (``"alltoall"``: W-1 ``all_to_all_single`` steps, rank r sends
to r+1) or by one ``all_gather`` (``"allgather"``; pieces padded to the longest). For each k/v
block (this rank's own first) the block's output and log-sum-exp are computed in fp32 and
merged (``out = sum_b exp(lse_b - lse) * out_b``, ``lse = logaddexp_b lse_b``).

Causal masks use global positions: query i sees key j iff ``pos_k[j] <= pos_q[i]``. A block
whose keys are all in the future of every local query is skipped; otherwise only the bounding
box of the visible (row, column) pairs is computed, masked only where it is not fully visible
(so with head-tail load balance the off-diagonal blocks need half the work and no mask, as in
PyTorch's algorithm). Any layout is correct, in particular sequence lengths not divisible by 2W.

Backward is flash attention's, per block, from the saved output and log-sum-exp: with
``P = exp(S - lse)`` (the final lse, so P is the exact probability), ``dV = P^T dO``,
``dS = P * (dO V^T - rowsum(dO * O))``, ``dQ += dS K scale``, ``dK = dS^T Q scale``. dq stays
local; for ``"alltoall"`` the k/v block travels again with its dk/dv accumulator (one message per
step, W-1 steps) and a last step returns each accumulator to its owner (W ``all_to_all_single``
in all); for ``"allgather"`` k/v are gathered once and dk/dv of every block are
reduce-scattered (sum) to their owners. GQA (``enable_gqa=True``, fewer k/v heads) repeats k/v
heads as torch does and sums their gradients back.
"""

import math
from dataclasses import dataclass
from enum import Enum, auto

import torch

from dtensor import _C
from dtensor import _functional_collectives as fc

__all__ = ["_RotateMethod", "_cp_options", "_SeqLayout", "_ring_sdpa", "set_rotate_method"]


class _RotateMethod(Enum):
    ALL_TO_ALL = auto()
    ALL_GATHER = auto()


@dataclass
class _ContextParallelOptions:
    """PyTorch's ``_cp_options``: ``enable_load_balance`` (head-tail sharding of the buffers of
    ``context_parallel``) and the rotate method; the merge is always fp32."""
    convert_to_f32: bool = True
    enable_load_balance: bool = True
    rotate_method: _RotateMethod = _RotateMethod.ALL_GATHER


_cp_options = _ContextParallelOptions()


def set_rotate_method(rotate_method):
    """``"allgather"`` (default: k/v gathered once) or ``"alltoall"`` (k/v rotated around the
    ring, W-1 steps forward). PyTorch's API."""
    if rotate_method == "allgather":
        _cp_options.rotate_method = _RotateMethod.ALL_GATHER
    elif rotate_method == "alltoall":
        _cp_options.rotate_method = _RotateMethod.ALL_TO_ALL
    else:
        raise NotImplementedError(f"Context Parallel does not support using {rotate_method} for "
                                  f"kv shards rotation; use 'allgather' or 'alltoall'")


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


def _kv_sizes(plan, k, v):
    """Functions of a rank j: the shapes of its k and v pieces, and their numel together."""
    def shapes(j):
        length = plan.kv_layout.lengths[j]
        return [tuple(t.shape[:-2]) + (length, t.shape[-1]) for t in (k, v)]

    return shapes, lambda j: sum(math.prod(s) for s in shapes(j))


def _pack(*ts):
    return torch.cat([t.reshape(-1) for t in ts])


def _unpack(flat, shapes):
    out, at = [], 0
    for s in shapes:
        n = math.prod(s)
        out.append(flat[at:at + n].view(s))
        at += n
    return out


def _rotate(flat, recv_numel, plan):
    """Sends ``flat`` to rank+1 of the ring and receives rank-1's (``recv_numel`` elements):
    one all_to_all_single; returned unwaited (waited at first use)."""
    w = plan.q_layout.world
    send, recv = [0] * w, [0] * w
    send[(plan.rank + 1) % w] = flat.numel()
    recv[(plan.rank - 1) % w] = recv_numel
    return fc.all_to_all_single(flat.contiguous(), recv, send, plan.group, async_op=True)


def _gather_padded(flat, numels, plan):
    """Every rank's ``flat`` (sizes ``numels``), by one all_gather of pieces padded to the
    longest; returns the list of pieces."""
    pad = max(numels)
    buf = torch.zeros(pad, dtype=flat.dtype, device=flat.device)
    buf[:flat.numel()] = flat
    full = fc.all_gather_tensor(buf, 0, plan.group).wait()
    return [full[j * pad:j * pad + n] for j, n in enumerate(numels)]


class _Block:
    """The part of (local q) x (k/v block of ``owner``) that needs computing: row range, column
    range and mask (None: fully visible); ``None`` from ``of`` when nothing is visible."""

    def __init__(self, rows, cols, mask):
        self.rows, self.cols, self.mask = rows, cols, mask

    @staticmethod
    def of(plan, owner, device):
        lq, lk = plan.q_layout.lengths[plan.rank], plan.kv_layout.lengths[owner]
        if lq == 0 or lk == 0:
            return None
        if not plan.is_causal:
            return _Block(slice(0, lq), slice(0, lk), None)
        pq = plan.q_layout.positions(plan.rank, device)
        pk = plan.kv_layout.positions(owner, device)
        vis = pk.unsqueeze(0) <= pq.unsqueeze(1)
        rows = vis.any(1).nonzero()
        if rows.numel() == 0:
            return None
        cols = vis.any(0).nonzero()
        r = slice(int(rows[0]), int(rows[-1]) + 1)
        c = slice(int(cols[0]), int(cols[-1]) + 1)
        sub = vis[r, c]
        return _Block(r, c, None if bool(sub.all()) else sub)


def _expand_heads(t, groups):
    return t if groups == 1 else t.repeat_interleave(groups, dim=-3)


def _sum_heads(t, groups):
    return t if groups == 1 else t.unflatten(-3, (-1, groups)).sum(-3)


def _scores(q, k, blk, scale):
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if blk.mask is not None:
        s = s.masked_fill(~blk.mask, float("-inf"))
    return s


def _finite(x):
    return torch.where(torch.isfinite(x), x, torch.zeros((), dtype=x.dtype, device=x.device))


def _forward_block(q, k, v, blk, scale, out, lse):
    """Merges the block's attention into ``out``/``lse`` (fp32, in place, rows ``blk.rows``)."""
    qb, kb, vb = q[..., blk.rows, :], k[..., blk.cols, :], v[..., blk.cols, :]
    s = _scores(qb, kb, blk, scale)
    b_lse = torch.logsumexp(s, -1)
    b_out = torch.matmul(torch.exp(s - _finite(b_lse).unsqueeze(-1)), vb)
    o, m = out[..., blk.rows, :], lse[..., blk.rows]
    new = torch.logaddexp(m, b_lse)
    ref = _finite(new)
    o.mul_(torch.exp(m - ref).unsqueeze(-1)).add_(b_out * torch.exp(b_lse - ref).unsqueeze(-1))
    m.copy_(new)


def _backward_block(q, k, v, do, lse, delta, blk, scale, dq, dk, dv):
    """Adds the block's gradients to ``dq`` (rows) and ``dk``/``dv`` (columns), fp32."""
    qb, kb, vb = q[..., blk.rows, :], k[..., blk.cols, :], v[..., blk.cols, :]
    dob = do[..., blk.rows, :]
    p = torch.exp(_scores(qb, kb, blk, scale) - _finite(lse[..., blk.rows]).unsqueeze(-1))
    dv[..., blk.cols, :] += torch.matmul(p.transpose(-1, -2), dob)
    ds = p * (torch.matmul(dob, vb.transpose(-1, -2)) - delta[..., blk.rows].unsqueeze(-1))
    dq[..., blk.rows, :] += torch.matmul(ds, kb) * scale
    dk[..., blk.cols, :] += torch.matmul(ds.transpose(-1, -2), qb) * scale


class _RingAttention(torch.autograd.Function):
    """Ring attention on local pieces q [..., Hq, Lq, E], k [..., Hk, Lk, E], v [..., Hk, Lk, Ev];
    returns the local output [..., Hq, Lq, Ev] (this module's docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, plan):
        groups = q.shape[-3] // k.shape[-3] if q.dim() >= 3 else 1
        qf, kf, vf = q.float(), k.float(), v.float()
        out = torch.zeros(tuple(q.shape[:-1]) + (v.shape[-1],), dtype=torch.float32,
                          device=q.device)
        lse = torch.full(tuple(q.shape[:-1]), float("-inf"), dtype=torch.float32,
                         device=q.device)
        w, me = plan.q_layout.world, plan.rank
        shapes, numel = _kv_sizes(plan, k, v)
        if plan.method == _RotateMethod.ALL_GATHER:
            pieces = _gather_padded(_pack(kf, vf), [numel(j) for j in range(w)], plan)
            blocks = [(me, kf, vf)] + [(j, *_unpack(pieces[j], shapes(j)))
                                       for j in ((me - i) % w for i in range(1, w))]
        else:
            blocks = None
        cur_k, cur_v = kf, vf
        for i in range(w):
            owner = (me - i) % w
            if blocks is not None:
                _, cur_k, cur_v = blocks[i]
            else:
                nxt = _rotate(_pack(cur_k, cur_v), numel((owner - 1) % w), plan) \
                    if i < w - 1 else None
            blk = _Block.of(plan, owner, q.device)
            if blk is not None:
                _forward_block(qf, _expand_heads(cur_k, groups), _expand_heads(cur_v, groups), blk,
                               plan.scale, out, lse)
            if blocks is None and nxt is not None:
                cur_k, cur_v = _unpack(nxt.wait(), shapes((owner - 1) % w))
        ctx.plan, ctx.groups = plan, groups
        result = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        return result

    @staticmethod
    def backward(ctx, g):
        q, k, v, out, lse = ctx.saved_tensors
        plan, groups = ctx.plan, ctx.groups
        qf, kf, vf, do = q.float(), k.float(), v.float(), g.float()
        delta = (do * out).sum(-1)
        dq = torch.zeros_like(qf)
        w, me = plan.q_layout.world, plan.rank
        shapes, numel = _kv_sizes(plan, k, v)

        def block_grads(owner, bk, bv, dk, dv):
            blk = _Block.of(plan, owner, q.device)
            if blk is None:
                return
            ek, ev = _expand_heads(bk, groups), _expand_heads(bv, groups)
            dke, dve = torch.zeros_like(ek), torch.zeros_like(ev)
            _backward_block(qf, ek, ev, do, lse, delta, blk, plan.scale, dq, dke, dve)
            dk += _sum_heads(dke, groups)
            dv += _sum_heads(dve, groups)

        if plan.method == _RotateMethod.ALL_GATHER:
            pieces = _gather_padded(_pack(kf, vf), [numel(j) for j in range(w)], plan)
            grads = []
            for j in range(w):
                bk, bv = (kf, vf) if j == me else _unpack(pieces[j], shapes(j))
                dk, dv = torch.zeros_like(bk), torch.zeros_like(bv)
                block_grads(j, bk, bv, dk, dv)
                grads.append(_pack(dk, dv))
            pad = max(numel(j) for j in range(w))
            buf = torch.zeros(w * pad, dtype=torch.float32, device=q.device)
            for j, t in enumerate(grads):
                buf[j * pad:j * pad + t.numel()] = t
            mine = fc.reduce_scatter_tensor(buf, "sum", 0, plan.group).wait()
            dk, dv = _unpack(mine[:numel(me)], shapes(me))
        else:
            cur_k, cur_v = kf, vf
            dk, dv = torch.zeros_like(kf), torch.zeros_like(vf)
            for i in range(w):
                owner = (me - i) % w
                block_grads(owner, cur_k, cur_v, dk, dv)
                if i < w - 1:
                    # The block and its gradient so far go on to the next rank together.
                    nxt = _rotate(_pack(cur_k, cur_v, dk, dv), 2 * numel((owner - 1) % w), plan)
                    s = shapes((owner - 1) % w)
                    cur_k, cur_v, dk, dv = _unpack(nxt.wait(), s + s)
            # The accumulator held now is that of rank me+1's block: return it to its owner.
            back = _rotate(_pack(dk, dv), numel(me), plan).wait()
            dk, dv = _unpack(back, shapes(me))
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


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


def _group_and_rank(mesh):
    if mesh.ndim != 1:
        raise ValueError(f"context parallel: the mesh must be 1-D (the sequence's mesh dim), got "
                         f"{mesh.ndim}-D {mesh}; pass mesh[dim_name]")
    return _C.mesh_group_name(mesh._mesh, 0), mesh.get_local_rank(0)

