"""Context parallelism: PyTorch's ``context_parallel``, ``context_parallel_unshard`` and
``set_rotate_method`` over the engine's ring attention (described in ``_ring_attention.py``).

Inside ``with context_parallel(mesh, buffers=..., buffer_seq_dims=...)`` a ``TorchFunctionMode``
of the calling thread catches ``F.scaled_dot_product_attention`` (PyTorch monkey-patches the
function instead) and runs ring attention when
* q, k, v are plain tensors: this rank's pieces along dim -2, laid out as the buffers were
  sharded (head-tail when ``_cp_options.enable_load_balance``, else natural order); the global
  length is the one of a buffer whose piece on this rank has q's length, else W times it;
* q, k, v are distributed tensors sharded ``Shard(dim -2)`` on a 1-D mesh: the result is a
  distributed tensor ``Shard(dim -2)`` too. Distributed tensors are plain ``torch.Tensor``
  objects with no Python-level type of their own, so outside the block their SDPA goes straight
  to the C++ engine (which gathers k/v along the sequence, exact), unless
  ``_enable_context_parallel_dispatcher()`` (PyTorch's name) registered ring attention as the
  op's kernel for distributed tensors' autograd dispatch key.
Other calls (other layouts, other functions) run unchanged.
"""

import contextlib

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from dtensor import _functional_collectives as fc
from dtensor._api import DTensor
from dtensor.experimental._ring_attention import (_check_sdpa_args, _cp_options, _group_and_rank,
                                             _ring_sdpa, _RingPlan, _SeqLayout)
from dtensor.placement_types import Shard

__all__ = ["context_parallel", "context_parallel_unshard", "_HeadTailLoadBalancer",
           "_enable_context_parallel_dispatcher", "_disable_context_parallel_dispatcher"]


class _HeadTailLoadBalancer:
    """PyTorch's head-tail load balancer: rank r holds chunks r and 2W-1-r of 2W (uneven
    lengths: chunks by torch.chunk's rule). ``_generate_indices()`` gives the ``(1, seq_len)``
    index that rearranges a sequence into rank order; ``restore=True`` its inverse."""

    def __init__(self, seq_length, world_size, device="cpu"):
        self.seq_length, self.world_size, self.device = seq_length, world_size, device

    def _layout(self):
        return _SeqLayout(self.seq_length, self.world_size, True)

    def _generate_indices(self, restore=False):
        lay = self._layout()
        idx = torch.cat([lay.positions(r, self.device) for r in range(self.world_size)])
        # The dtypes are PyTorch's: int32, and int64 for the restore index (its argsort).
        return (torch.argsort(idx) if restore else idx.to(torch.int32)).unsqueeze(0)


def _sdpa_signature(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                    scale=None, enable_gqa=False):
    return dict(query=query, key=key, value=value, attn_mask=attn_mask, dropout_p=dropout_p,
                is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)


def _plain_layout(local_len, world, rank, load_balance, seq_lens):
    """The layout of a plain piece of ``local_len`` (this module's docstring)."""
    for s in seq_lens:
        lay = _SeqLayout(s, world, load_balance)
        if lay.lengths[rank] == local_len:
            return lay
    lay = _SeqLayout(local_len * world, world, load_balance)
    if lay.lengths[rank] != local_len:
        raise ValueError(f"context_parallel: a sequence piece of {local_len} on rank {rank} fits "
                         f"no buffer's layout (lengths {list(seq_lens)}) nor an even split; shard "
                         f"it as a buffer of context_parallel")
    return lay


class _ContextParallelMode(TorchFunctionMode):
    def __init__(self, mesh, load_balance, seq_lens):
        super().__init__()
        self.mesh, self.load_balance, self.seq_lens = mesh, load_balance, seq_lens

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            out = _sdpa(self, _sdpa_signature(*args, **kwargs))
            if out is not None:
                return out
        return func(*args, **kwargs)


def _sdpa(mode, a):
    q, k, v = a["query"], a["key"], a["value"]
    dist = [isinstance(t, DTensor) for t in (q, k, v)]
    if any(dist):
        if not all(dist):
            raise ValueError("context_parallel: scaled_dot_product_attention got distributed "
                             "and plain tensors among q, k, v; pass all of one kind")
        return _sdpa_dtensor(q, k, v, a)
    scale = _check_sdpa_args(q, k, v, a["attn_mask"], a["dropout_p"], a["is_causal"],
                             a["scale"], a["enable_gqa"])
    group, rank = _group_and_rank(mode.mesh)
    world = mode.mesh.size()
    q_lay = _plain_layout(q.shape[-2], world, rank, mode.load_balance, mode.seq_lens)
    kv_lay = q_lay if k.shape[-2] == q.shape[-2] else \
        _plain_layout(k.shape[-2], world, rank, mode.load_balance, mode.seq_lens)
    return _ring_sdpa(q, k, v, _plan(group, rank, q_lay, kv_lay, a["is_causal"], scale))


def _plan(group, rank, q_lay, kv_lay, is_causal, scale):
    if is_causal and q_lay.seq_len != kv_lay.seq_len:
        raise NotImplementedError(f"context parallel attention: is_causal needs equal query and "
                                  f"key lengths, got {q_lay.seq_len} and {kv_lay.seq_len}")
    return _RingPlan(group, rank, q_lay, kv_lay, bool(is_causal), scale,
                     _cp_options.rotate_method)


def _sdpa_dtensor(q, k, v, a, strict=True):
    """Ring attention on distributed q/k/v sharded on dim -2 over a 1-D mesh (None: another
    layout, left to the engine; with ``strict=False`` also arguments ring attention does not
    take, which the engine computes instead of refusing)."""
    mesh = q.device_mesh
    for t in (q, k, v):
        if t.device_mesh != mesh or mesh.ndim != 1 or t.dim() < 2 or \
                not t.placements[0].is_shard(t.dim() - 2):
            return None
    group, rank = _group_and_rank(mesh)
    world = mesh.size()
    try:
        scale = _check_sdpa_args(q, k, v, a["attn_mask"], a["dropout_p"], a["is_causal"],
                                 a["scale"], a["enable_gqa"])
        plan = _plan(group, rank, _SeqLayout(q.shape[-2], world, False),
                     _SeqLayout(k.shape[-2], world, False), a["is_causal"], scale)
    except (ValueError, NotImplementedError):
        if strict:
            raise
        return None
    out = _ring_sdpa(q.to_local(), k.to_local(), v.to_local(), plan)
    seq = q.dim() - 2
    shape = tuple(q.shape[:-1]) + (v.shape[-1],)
    return DTensor.from_local(out, mesh, [Shard(seq)], shape=shape,
                              stride=torch.empty(shape, device="meta").stride())


# The kernel of aten::scaled_dot_product_attention for distributed tensors' autograd key while
# the context parallel dispatcher is enabled (None: disabled).
_dispatcher_lib = None


def _sdpa_kernel(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *,
                 scale=None, enable_gqa=False):
    a = _sdpa_signature(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    out = None
    if all(isinstance(t, DTensor) for t in (query, key, value)):
        out = _sdpa_dtensor(query, key, value, a, strict=False)
    if out is None:
        # What the dispatcher runs for the op otherwise: its composite decomposition.
        out = torch.ops.aten.scaled_dot_product_attention.default.decompose(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
            enable_gqa=enable_gqa)
    return out


def _enable_context_parallel_dispatcher():
    """PyTorch's name: from now on, in every thread, ``F.scaled_dot_product_attention`` on
    distributed q/k/v sharded ``Shard(dim -2)`` on a 1-D mesh runs ring attention (rotate method
    of ``set_rotate_method``; the result is ``Shard(dim -2)``), without ``context_parallel``.
    Distributed tensors have no Python type to hook, so this registers a kernel of
    ``aten::scaled_dot_product_attention`` for their autograd dispatch key
    (``AutogradPrivateUse1``); other layouts and arguments ring attention does not take (a mask,
    dropout) run as before (the op's composite decomposition on the engine). Under ``torch.inference_mode`` (no autograd key) the engine's own path runs."""
    global _dispatcher_lib
    if _dispatcher_lib is None:
        lib = torch.library.Library("aten", "IMPL")
        lib.impl("scaled_dot_product_attention", _sdpa_kernel, "AutogradPrivateUse1")
        _dispatcher_lib = lib


def _disable_context_parallel_dispatcher():
    """Undoes ``_enable_context_parallel_dispatcher``."""
    global _dispatcher_lib
    if _dispatcher_lib is not None:
        _dispatcher_lib._destroy()
        _dispatcher_lib = None


@contextlib.contextmanager
def context_parallel(mesh, *, buffers=None, buffer_seq_dims=None, no_restore_buffers=None):
    """``with context_parallel(mesh, buffers=[...], buffer_seq_dims=[...]):`` shards each buffer
    in place along its sequence dim (head-tail when ``_cp_options.enable_load_balance``, the
    default, as PyTorch), keeping this rank's piece, and runs ``F.scaled_dot_product_attention``
    as ring attention (this module's docstring); at exit the buffers get their values
    back, except those in ``no_restore_buffers``. ``mesh`` is 1-D (the context-parallel dim).
    Beyond PyTorch: lengths need not divide by 2W; non-causal attention on a head-tail layout is
    exact (PyTorch refuses it); calls on distributed tensors sharded on the sequence work too."""
    buffers = [] if buffers is None else list(buffers)
    seq_dims = [] if buffer_seq_dims is None else list(buffer_seq_dims)
    no_restore = [] if no_restore_buffers is None else list(no_restore_buffers)
    if len(buffers) != len(seq_dims):
        raise ValueError("`seq_dims` must have the same number of elements as `buffers`.")
    for b in no_restore:
        if not any(b is x for x in buffers):
            raise ValueError("`no_restore_buffers` must be a subset of `buffers`.")
    _, rank = _group_and_rank(mesh)
    world = mesh.size()
    load_balance = _cp_options.enable_load_balance
    seq_lens = []
    originals = []
    with torch.no_grad():
        for b, d in zip(buffers, seq_dims):
            originals.append(None if any(b is x for x in no_restore) else b.clone())
            lay = _SeqLayout(b.shape[d], world, load_balance)
            seq_lens.append(lay.seq_len)
            piece = b.index_select(d, lay.positions(rank, b.device))
            b.resize_(piece.shape)
            b.copy_(piece)
    try:
        with _ContextParallelMode(mesh, load_balance, seq_lens):
            yield
    finally:
        with torch.no_grad():
            for b, orig in zip(buffers, originals):
                if orig is not None:
                    b.resize_(orig.shape)
                    b.copy_(orig)


@torch.no_grad()
def context_parallel_unshard(mesh, buffers, seq_dims, load_balancer=None):
    """The whole sequences, in natural order, of pieces sharded by ``context_parallel`` (head-tail
    when ``load_balancer`` is given or ``_cp_options.enable_load_balance``, else natural order).
    One all_gather of the pieces' lengths (so uneven lengths work), then one per buffer."""
    buffers, seq_dims = list(buffers), list(seq_dims)
    if len(buffers) != len(seq_dims):
        raise ValueError("`seq_dims` must have the same number of elements as `buffers`.")
    if not buffers:
        return []
    group, rank = _group_and_rank(mesh)
    world = mesh.size()
    load_balance = load_balancer is not None or _cp_options.enable_load_balance
    mine = torch.tensor([b.shape[d] for b, d in zip(buffers, seq_dims)], dtype=torch.long)
    lengths = fc.all_gather_tensor(mine, 0, group).wait().view(world, -1)
    out = []
    for i, (b, d) in enumerate(zip(buffers, seq_dims)):
        d = d % b.dim()
        got = [int(x) for x in lengths[:, i]]
        seq_len = sum(got) if load_balancer is None else load_balancer.seq_length
        lay = _SeqLayout(seq_len, world, load_balance)
        if lay.lengths != got:
            raise ValueError(f"context_parallel_unshard: buffer {i}'s pieces have lengths {got}; "
                             f"{lay} expects {lay.lengths}")
        pad = max(got)
        shape = list(b.shape)
        shape[d] = pad
        padded = torch.zeros(shape, dtype=b.dtype, device=b.device)
        padded.narrow(d, 0, b.shape[d]).copy_(b)
        full = fc.all_gather_tensor(padded, d, group).wait()
        shape = list(b.shape)
        shape[d] = seq_len
        whole = torch.empty(shape, dtype=b.dtype, device=b.device)
        for r in range(world):
            whole.index_copy_(d, lay.positions(r, b.device), full.narrow(d, r * pad, got[r]))
        out.append(whole)
    return out

