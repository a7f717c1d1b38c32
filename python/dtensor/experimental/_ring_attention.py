"""Ring attention: scaled dot-product attention on q/k/v sharded along the sequence.

Each rank holds pieces of the sequence of q, k and v (dim -2 of
``[..., heads, seq, dim]``); ``_SeqLayout`` says which global positions every rank holds, so every
rank knows every other rank's piece sizes without asking. The query never moves. The keys and
values move, either by rotation (``"alltoall"``: W-1 ``all_to_all_single`` steps, rank r sends
to r+1) or by one ``all_gather`` (``"allgather"``; pieces padded to the longest: every rank then
holds all of k/v, O(S) by nature). For each k/v block (this rank's own first) the block's output
and log-sum-exp come from ATen's fused CPU flash-attention kernel (NOTE [ring attention blocks])
and are merged in fp32 (``out = sum_b exp(lse_b - lse) * out_b``, ``lse = logaddexp_b lse_b``).

Causal masks use global positions: query i sees key j iff ``pos_k[j] <= pos_q[i]``. A block
whose keys are all in the future of every local query is skipped; otherwise only the bounding
box of the visible (row, column) pairs is computed: unmasked where all of it is visible, with the
kernel's ``is_causal`` where it is exactly top-left causal (the own block), with an additive mask
otherwise (so with head-tail load balance the off-diagonal blocks need half the work and no mask,
as in PyTorch's algorithm). Any layout is correct, in particular sequence lengths not divisible
by 2W.

Backward is the kernel's, per block, given the final output and log-sum-exp (NOTE [ring
attention blocks]). dq stays local; for ``"alltoall"`` the k/v block travels again, sent ahead of
the block's compute, and its dk/dv accumulator follows one step behind (NOTE [ring attention
backward overlap]: 2W-1 ``all_to_all_single``); for ``"allgather"`` k/v are gathered once and
dk/dv of every block are reduce-scattered (sum) to their owners. Large ``"alltoall"`` messages go
head group by head group (NOTE [ring attention memory]). GQA (``enable_gqa=True``, fewer k/v
heads) runs in the kernel, which returns dk/dv with the k/v heads.
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


def _pack(ts, dtype=None, zeros=0):
    """One new flat buffer (``dtype``: ts[0]'s by default) holding ``ts`` and ``zeros`` zeros."""
    n = [t.numel() for t in ts]
    buf = torch.empty(sum(n) + zeros, dtype=dtype or ts[0].dtype, device=ts[0].device)
    at = 0
    for t, size in zip(ts, n):
        buf[at:at + size].view(t.shape).copy_(t)
        at += size
    buf[at:].zero_()
    return buf


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
    range and its mask: ``causal`` (exactly top-left causal within the box, the fused kernel's
    ``is_causal``), ``mask`` (bool, True where visible), or neither (all visible). ``None`` from
    ``of`` when nothing is visible.

    Every layout's positions increase along a piece (natural: one chunk; head-tail: chunk r, then
    chunk 2W-1-r), so the rows that see a key are a suffix of the piece and the keys seen a
    prefix, found by binary search (no Lq x Lk matrix). Every row of the box sees at least the
    box's first key, so no row of a block is fully masked. With q and k/v in the same layout (what
    ``context_parallel`` and distributed q/k/v give) the own block is exactly top-left causal and
    the others are unmasked; ``mask`` arises only from q and k/v in different layouts."""

    def __init__(self, rows, cols, causal=False, mask=None):
        self.rows, self.cols, self.causal, self.mask = rows, cols, causal, mask
        self._additive = {}

    @staticmethod
    def of(plan, owner):
        lq, lk = plan.q_layout.lengths[plan.rank], plan.kv_layout.lengths[owner]
        if lq == 0 or lk == 0:
            return None
        if not plan.is_causal:
            return _Block(slice(0, lq), slice(0, lk))
        pq, pk = plan.q_layout.positions(plan.rank), plan.kv_layout.positions(owner)
        r0 = int(torch.searchsorted(pq, pk[:1]))
        c1 = int(torch.searchsorted(pk, pq[-1:], right=True))
        if r0 == lq or c1 == 0:
            return None
        seen = torch.searchsorted(pk[:c1], pq[r0:], right=True)  # keys each row sees, a prefix
        rows, cols = slice(r0, lq), slice(0, c1)
        if bool((seen == c1).all()):
            return _Block(rows, cols)
        if torch.equal(seen, torch.arange(1, lq - r0 + 1).clamp(max=c1)):
            return _Block(rows, cols, causal=True)
        return _Block(rows, cols, mask=torch.arange(c1).unsqueeze(0) < seen.unsqueeze(1))

    def kernel_mask(self, dtype):
        """``attn_mask`` for the fused kernel: additive, of the query's dtype (it refuses bool)."""
        if self.mask is None:
            return None
        if dtype not in self._additive:
            self._additive[dtype] = torch.zeros(self.mask.shape, dtype=dtype).masked_fill_(
                ~self.mask, float("-inf"))
        return self._additive[dtype]


# NOTE [ring attention blocks]: each block runs ATen's fused CPU flash-attention kernel in the
# inputs' dtype (no Lq x Lk tensor outside the kernel). Forward: the block's (out_b, lse_b) merge
# into fp32 out/lse. Backward: the kernel's backward given the FINAL out and lse (the block's
# rows) returns the block's exact gradients, since it recomputes P = exp(S - lse), which is then
# the true probability, and delta = rowsum(dO * out) from the final output. The kernel takes
# fewer k/v heads (GQA) and returns dk/dv with those heads. It needs one head dim for q, k and
# v: an odd v is padded with zeros (or q and k, with the scale given), which changes no value.
# On other devices the block is computed with explicit fp32 score matrices (_explicit_fwd/_bwd).
_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
_FLASH_BWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def _fused_fwd(q, k, v, blk, scale):
    return _FLASH(q, k, v, 0.0, blk.causal, attn_mask=blk.kernel_mask(q.dtype), scale=scale)


def _fused_bwd(do, q, k, v, out, lse, blk, scale):
    return _FLASH_BWD(do, q, k, v, out, lse, 0.0, blk.causal, attn_mask=blk.kernel_mask(q.dtype),
                      scale=scale)


def _explicit_scores(q, k, blk, scale):
    acc, groups = _acc_dtype(q.dtype), q.shape[-3] // k.shape[-3]
    s = torch.matmul(q.to(acc), k.to(acc).repeat_interleave(groups, dim=-3).transpose(-1, -2))
    mask = blk.mask
    if blk.causal:
        mask = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
    s = s * scale
    return s if mask is None else s.masked_fill(~mask.to(s.device), float("-inf")), groups


def _explicit_fwd(q, k, v, blk, scale):
    s, groups = _explicit_scores(q, k, blk, scale)
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - lse.unsqueeze(-1))
    return torch.matmul(p, v.to(p.dtype).repeat_interleave(groups, dim=-3)).to(q.dtype), lse


def _explicit_bwd(do, q, k, v, out, lse, blk, scale):
    s, groups = _explicit_scores(q, k, blk, scale)
    p = torch.exp(s - lse.unsqueeze(-1))
    do = do.to(p.dtype)
    dv = torch.matmul(p.transpose(-1, -2), do)
    ve, ke = (t.to(p.dtype).repeat_interleave(groups, dim=-3) for t in (v, k))
    ds = p * (torch.matmul(do, ve.transpose(-1, -2)) - (do * out.to(p.dtype)).sum(-1, True))
    dq = torch.matmul(ds, ke) * scale
    dk = torch.matmul(ds.transpose(-1, -2), q.to(p.dtype)) * scale

    def heads(t):
        return t.unflatten(-3, (-1, groups)).sum(-3) if groups > 1 else t
    return dq.to(q.dtype), heads(dk).to(k.dtype), heads(dv).to(v.dtype)


def _block_ops(device):
    return (_fused_fwd, _fused_bwd) if device.type == "cpu" else (_explicit_fwd, _explicit_bwd)


def _as_4d(t):
    """``[..., H, L, E]`` as the kernel's ``[B, H, L, E]`` (a view where strides allow)."""
    if t.dim() == 2:
        return t.unsqueeze(0).unsqueeze(0)
    if t.dim() == 3:
        return t.unsqueeze(0)
    return t if t.dim() == 4 else t.flatten(0, -4)


def _pad_last(t, size):
    return t if t.shape[-1] == size else torch.nn.functional.pad(t, (0, size - t.shape[-1]))


def _acc_dtype(dtype):
    """What merges and gradient sums run in: fp32, or the inputs' dtype when wider."""
    return torch.promote_types(dtype, torch.float32)


def _empty_attention(q4):
    """fp32 out and lse of rows that see no key yet: zeros and -inf."""
    acc = _acc_dtype(q4.dtype)
    return (torch.zeros(q4.shape, dtype=acc, device=q4.device),
            torch.full(q4.shape[:-1], float("-inf"), dtype=acc, device=q4.device))


def _merge(out, lse, rows, b_out, b_lse):
    """Merges a block's attention into fp32 ``out``/``lse`` (in place, rows ``rows``);
    ``None`` ``out``: the block is the first, over every row. Returns out, lse."""
    if out is None:
        return b_out.to(_acc_dtype(b_out.dtype)), b_lse
    o, m = out[..., rows, :], lse[..., rows]
    new = torch.logaddexp(m, b_lse)
    ref = torch.where(torch.isfinite(new), new, torch.zeros((), dtype=new.dtype))
    o.mul_(torch.exp(m - ref).unsqueeze(-1))
    o.add_(b_out.to(o.dtype).mul_(torch.exp(b_lse - ref).unsqueeze(-1)))
    m.copy_(new)
    return out, lse


def _add_rows(acc, rows, grad, full):
    """``acc[..., rows, :] += grad`` (``_acc_dtype``); ``None`` ``acc`` takes ``grad`` when it
    covers every row (``full``), else a new one."""
    if acc is None:
        if rows.start == 0 and rows.stop == full:
            return grad.to(_acc_dtype(grad.dtype))
        acc = torch.zeros(grad.shape[:-2] + (full, grad.shape[-1]), dtype=_acc_dtype(grad.dtype),
                          device=grad.device)
    acc[..., rows, :] += grad
    return acc


class _RingAttention(torch.autograd.Function):
    """Ring attention on local pieces q [..., Hq, Lq, E], k [..., Hk, Lk, E], v [..., Hk, Lk, Ev];
    returns the local output [..., Hq, Lq, Ev] (this module's docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, plan):
        out_shape = tuple(q.shape[:-1]) + (v.shape[-1],)
        dim = max(q.shape[-1], v.shape[-1])
        q4, k4, v4 = (_pad_last(_as_4d(t), dim) for t in (q, k, v))
        blocks = {j: _Block.of(plan, j) for j in range(plan.q_layout.world)}
        fwd, _ = _block_ops(q.device)
        groups = q4.shape[1] // k4.shape[1]
        heads = _head_groups(plan, k4, 2 * k4.element_size())
        out = lse = None
        for hs in heads:
            h_q = q4[:, hs.start * groups:hs.stop * groups]
            h_out = h_lse = None

            def compute(owner, bk, bv):
                nonlocal h_out, h_lse
                blk = blocks[owner]
                if blk is None:
                    return
                b_out, b_lse = fwd(h_q[..., blk.rows, :], bk[..., blk.cols, :],
                                   bv[..., blk.cols, :], blk, plan.scale)
                if h_out is None and blk.rows.stop - blk.rows.start < h_q.shape[-2]:
                    h_out, h_lse = _empty_attention(h_q)
                h_out, h_lse = _merge(h_out, h_lse, blk.rows, b_out, b_lse)

            _kv_blocks(plan, k4[:, hs], v4[:, hs], compute)
            if h_out is None:  # no key visible to any local query (or no local query)
                h_out, h_lse = _empty_attention(h_q)
            if len(heads) == 1:
                out, lse = h_out, h_lse
                break
            if out is None:
                out, lse = _empty_attention(q4)
            out[:, hs.start * groups:hs.stop * groups] = h_out
            lse[:, hs.start * groups:hs.stop * groups] = h_lse
            del h_out, h_lse
        out = out.to(q.dtype)
        ctx.plan, ctx.blocks = plan, blocks
        ctx.save_for_backward(q, k, v, out, lse)
        return out[..., :v.shape[-1]].reshape(out_shape)

    @staticmethod
    def backward(ctx, g):
        q, k, v, out, lse = ctx.saved_tensors
        plan, blocks = ctx.plan, ctx.blocks
        dim = out.shape[-1]
        q4, k4, v4, do = (_pad_last(_as_4d(t), dim) for t in (q, k, v, g.to(q.dtype)))
        _, bwd = _block_ops(q.device)
        lq, groups = q4.shape[-2], q4.shape[1] // k4.shape[1]
        heads = _head_groups(plan, k4, 4 * _acc_dtype(q.dtype).itemsize)
        dq = dk = dv = None
        for hs in heads:
            qs = slice(hs.start * groups, hs.stop * groups)
            h_q, h_do, h_out, h_lse = q4[:, qs], do[:, qs], out[:, qs], lse[:, qs]
            h_dq = None

            def grads(owner, bk, bv):
                """The block's gradients: dq added to ``h_dq``; returns (columns, dk, dv) of the
                block, or None when it is skipped."""
                nonlocal h_dq
                blk = blocks[owner]
                if blk is None:
                    return None
                r, c = blk.rows, blk.cols
                b_dq, b_dk, b_dv = bwd(h_do[..., r, :], h_q[..., r, :], bk[..., c, :],
                                       bv[..., c, :], h_out[..., r, :], h_lse[..., r], blk,
                                       plan.scale)
                h_dq = _add_rows(h_dq, r, b_dq, lq)
                return c, b_dk, b_dv

            h_dk, h_dv = _kv_grads(plan, k4[:, hs], v4[:, hs], grads)
            if h_dq is None:
                h_dq = torch.zeros(h_q.shape, dtype=_acc_dtype(q.dtype), device=q.device)
            if len(heads) == 1:
                dq, dk, dv = h_dq, h_dk, h_dv
                break
            if dq is None:
                dq, dk, dv = (torch.empty(t.shape, dtype=_acc_dtype(q.dtype), device=q.device)
                              for t in (q4, k4, v4))
            dq[:, qs], dk[:, hs], dv[:, hs] = h_dq, h_dk, h_dv
            del h_dq, h_dk, h_dv
        return (dq[..., :q.shape[-1]].reshape(q.shape).to(q.dtype),
                dk[..., :k.shape[-1]].reshape(k.shape).to(k.dtype),
                dv[..., :v.shape[-1]].reshape(v.shape).to(v.dtype), None)


# NOTE [ring attention memory]: the "alltoall" backward holds, per step, the block's k/v and the
# next one in flight (the inputs' dtype, 2x a local k each), the block's kernel gradients and
# its dk/dv accumulator arriving or leaving (fp32, or the inputs' dtype when wider; 2x each):
# about 8x a local k on top of out, dq and the final dk/dv, where one process at S/W holds out,
# dq, dk, dv and its kernel's buffers (about 5x). The forward's message (k/v, 2x) in flight with
# the block's kernel output adds as much. So a ring whose k/v and dk/dv messages together exceed
# _RING_MESSAGE_BYTES runs per group of k/v heads (the heads are independent), each group's
# messages at most that size or one head's: (W-1) all_to_all_single forward and 2W-1 backward per
# group, and the peak per rank stays near one process's at S/W. Messages of 512 KiB keep the
# collectives' latency small beside their transfer. "allgather" holds every rank's k/v anyway
# and is not split.
_RING_MESSAGE_BYTES = 1 << 19


def _head_groups(plan, k4, head_bytes):
    """The k/v head ranges of the rings (NOTE [ring attention memory]), a message holding
    ``head_bytes`` per element of one head's piece; the same on every rank (the longest
    piece's size)."""
    hk = k4.shape[1]
    if plan.method != _RotateMethod.ALL_TO_ALL:
        return [slice(0, hk)]
    per_head = head_bytes * k4.shape[0] * max(plan.kv_layout.lengths) * k4.shape[-1]
    n = max(1, min(hk, _RING_MESSAGE_BYTES // per_head))
    return [slice(a, min(a + n, hk)) for a in range(0, hk, n)]


def _kv_blocks(plan, k, v, compute):
    """Calls ``compute(owner, k_j, v_j)`` for every rank j's k/v block (4-D), this rank's first:
    all gathered at once, or rotated around the ring (W-1 steps, the next block in flight while
    one is computed: two blocks live)."""
    w, me = plan.q_layout.world, plan.rank
    shapes, numel = _kv_sizes(plan, k, v)
    if plan.method == _RotateMethod.ALL_GATHER:
        pieces = _gather_padded(_pack([k, v]), [numel(j) for j in range(w)], plan)
        compute(me, k, v)
        for j in ((me - i) % w for i in range(1, w)):
            compute(j, *_unpack(pieces[j], shapes(j)))
        return
    for _, owner, bk, bv in _ring(plan, k, v):
        compute(owner, bk, bv)


def _ring(plan, k, v):
    """The "alltoall" ring: yields (step, owner, k_j, v_j) for every rank j's k/v block, this
    rank's first, each step's rotation to rank+1 issued before the block is yielded and waited
    when the caller comes back for the next (the next block in flight while one is computed)."""
    w, me = plan.q_layout.world, plan.rank
    shapes, numel = _kv_sizes(plan, k, v)
    flat = None
    for i in range(w):
        owner = (me - i) % w
        nxt = None
        if i < w - 1:
            flat = _pack([k, v]) if flat is None else flat
            nxt = _rotate(flat, numel((owner - 1) % w), plan)
        yield (i, owner) + ((k, v) if i == 0 else tuple(_unpack(flat, shapes(owner))))
        if nxt is not None:
            flat = nxt.wait()


# NOTE [ring attention backward overlap]: the "alltoall" backward moves two things around the
# ring, as PyTorch's does: the k/v blocks, each step's rotation issued before the block's
# compute (W-1 all_to_all_single, the next block arriving while one is computed), and the dk/dv
# accumulators, one step behind: at step i rank r computes the gradients of block r-i, then
# takes the accumulator rank r-1 sent at the end of step i-1 (that same block's, arriving while
# rank r computed), adds them and sends it on to rank r+1 (W all_to_all_single; the first step's
# is the own block's, new; after the last, each accumulator has reached its owner). Each rank
# waits only for transfers issued a whole block's compute earlier, and the k/v travel in the
# inputs' dtype. The sums are exact: every block's gradients are added once, in ring order.
def _kv_grads(plan, k, v, grads):
    """Calls ``grads(owner, k_j, v_j)`` for every rank j's k/v block (4-D), which returns None or
    the block's (columns, dk, dv); returns this rank's dk, dv (``_acc_dtype``) summed over every
    rank. ``"allgather"``: k/v gathered once, every block's dk/dv reduce-scattered (sum) to its
    owner. ``"alltoall"``: NOTE [ring attention backward overlap]."""
    w, me = plan.q_layout.world, plan.rank
    shapes, numel = _kv_sizes(plan, k, v)
    acc_dtype = _acc_dtype(k.dtype)
    if plan.method == _RotateMethod.ALL_GATHER:
        pieces = _gather_padded(_pack([k, v]), [numel(j) for j in range(w)], plan)
        pad = max(numel(j) for j in range(w))
        buf = torch.zeros(w * pad, dtype=acc_dtype, device=k.device)
        for j in range(w):
            bk, bv = (k, v) if j == me else _unpack(pieces[j], shapes(j))
            _add_block(_unpack(buf[j * pad:j * pad + numel(j)], shapes(j)), grads(j, bk, bv))
        del pieces
        mine = fc.reduce_scatter_tensor(buf, "sum", 0, plan.group).wait()
        return _unpack(mine[:numel(me)], shapes(me))
    acc_in = None
    for i, owner, bk, bv in _ring(plan, k, v):
        got = grads(owner, bk, bv)
        if i == 0:
            acc = _own_accumulator(got, shapes(me), acc_dtype, k.device)
        else:
            acc = acc_in.wait()
            _add_block(_unpack(acc, shapes(owner)), got)
        del got
        # Rank me+1 computes this block next; after the last step the accumulator this rank
        # receives is its own block's, from rank me-1, which computed that block last.
        acc_in = _rotate(acc, numel((owner - 1) % w), plan)
        del acc
    return _unpack(acc_in.wait(), shapes(me))


def _add_block(acc, got):
    """Adds a block's (columns, dk, dv) (``grads``' result; None: nothing) to the dk/dv
    accumulators ``acc``."""
    if got is not None:
        cols, b_dk, b_dv = got
        acc[0][..., cols, :] += b_dk
        acc[1][..., cols, :] += b_dv


def _own_accumulator(got, shapes, dtype, device):
    """The flat dk/dv accumulator of this rank's own block, holding the block's gradients: their
    copy when they cover every column, else zeros with them added."""
    if got is not None and got[0].start == 0 and got[0].stop == shapes[0][-2]:
        return _pack(list(got[1:]), dtype)
    acc = torch.zeros(sum(math.prod(s) for s in shapes), dtype=dtype, device=device)
    _add_block(_unpack(acc, shapes), got)
    return acc


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

