"""Context parallelism: PyTorch's ``context_parallel``, ``context_parallel_unshard`` and
``set_rotate_method`` over the engine's ring attention (described in ``_ring_attention.py``).

Inside ``with context_parallel(mesh, buffers=..., buffer_seq_dims=...)`` a ``TorchFunctionMode``
of the calling thread catches ``F.scaled_dot_product_attention`` (PyTorch monkey-patches the
function instead) and runs ring attention when
* q, k, v are plain tensors: this rank's pieces along dim -2, laid out as the buffers were
  sharded (head-tail when ``_cp_options.enable_load_balance``, else natural order); the global
  length is the one of a buffer whose piece on this rank has q's length, else W times it. The
  ring is ``mesh``'s group (1-D: on a 2-D or 3-D world, ``world["cp"]``), so pieces that are
  also a TP rank's heads (``parallelize_module``'s local outputs) work as they are;
* q, k, v are distributed tensors laid out as NOTE [ring attention in the engine] says: the
  result is a distributed tensor in q's placements. The engine runs that ring outside the
  block too, with no mask or dropout (PyTorch's ``_enable_context_parallel_dispatcher()`` has
  nothing to enable).
* q, k, v are distributed tensors on a mesh that shares no rank but this one with ``mesh`` (TP's
  projections with ``use_local_output=False``: heads on "tp", each tp rank's tensors built
  from this cp rank's piece of the sequence): their local tensors are pieces as plain ones
  are, so ring attention runs on them and the result is placed as q (NOTE [pieces on another
  mesh]).
Other calls (other layouts, other functions) run unchanged.

NOTE [pieces on another mesh]: a distributed tensor's global shape is global over its own mesh
only. Inside the block the sequence of every tensor built from a buffer is this cp rank's piece,
and a mesh that holds none of the other cp ranks cannot say otherwise, so its tensors' sequence
is a piece, as a plain tensor's is (PyTorch's context_parallel treats every SDPA input in the
block as a piece too). Left to the engine, SDPA would attend within the piece only: a silent
wrong answer. A mesh that holds other cp ranks says by its placements whether the sequence is
sharded (the case above) or whole (the engine's).

Distributed q, k, v take the engine's ring attention where it takes their layout (NOTE [ring
attention in the engine]: one mesh dim shards the sequence, the others at most the heads or a
batch dim, q, k and v alike; ``_C.ring_attention_mesh_dim``); inside ``context_parallel`` any
other layout with the sequence sharded is refused with the engine's reason, since the engine's
rules would gather k/v (O(S) per rank) where the block promises a ring.
"""

import contextlib
import sys

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from dtensor import _C
from dtensor import _functional_collectives as fc
from dtensor._api import DTensor
from dtensor.experimental._ring_attention import (_check_sdpa_args, _cp_options, _ring_sdpa,
                                             _RingPlan, _SeqLayout)

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


def _mesh_dim_group(mesh, dim):
    """The group of mesh dim ``dim`` that holds this rank, this rank's index in it and its
    size: what a ring over that mesh dim runs on."""
    return _C.mesh_group_name(mesh._mesh, dim), mesh.get_local_rank(dim), mesh.size(dim)


def _cp_group(mesh):
    """The ring of ``context_parallel(mesh)``: ``mesh`` is 1-D (PyTorch's rule)."""
    if mesh.ndim != 1:
        raise ValueError(f"context_parallel: the mesh must be 1-D (the context-parallel dim), "
                         f"got {mesh.ndim}-D {mesh}; pass the sequence's dim, mesh['cp']")
    return _mesh_dim_group(mesh, 0)


def _eager(fn):
    """``fn``, run eagerly under torch.compile when Dynamo is imported (NOTE [context parallel
    under torch.compile]); ``fn`` itself otherwise."""
    # A module another thread is still importing is in sys.modules without its attributes.
    disable = getattr(sys.modules.get("torch._dynamo"), "disable", None)
    if disable is None:
        return fn
    return disable(
        fn, reason="context parallel: ring attention runs eagerly (its collectives and layout "
                   "arithmetic are engine calls Dynamo cannot trace)")


class _ContextParallelMode(TorchFunctionMode):
    # NOTE [context parallel under torch.compile]: Dynamo traces a TorchFunctionMode's
    # __torch_function__ for every call of a compiled region, so the SDPA call would be traced
    # into ring attention, whose collectives and layout arithmetic are the engine's C++ calls:
    # a graph break at each (about ten graphs per call, each rank's answer still right). The
    # call runs eagerly instead (torch._dynamo.disable, one graph break): the code before and
    # after SDPA compiles, and the backward of ring attention is its autograd Function's.
    # Dynamo is looked up when the block is entered, not imported (importing it costs seconds):
    # in a block entered before anything imported it, Dynamo traces the call as above.
    def __init__(self, mesh, load_balance, seq_lens):
        super().__init__()
        self.mesh, self.load_balance, self.seq_lens = mesh, load_balance, seq_lens
        self.sdpa = _eager(_sdpa)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            out = self.sdpa(self, _sdpa_signature(*args, **kwargs))
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
        beside = _beside(q.device_mesh, mode.mesh)
        if not beside and (a["attn_mask"] is not None or a["dropout_p"]):
            # Arguments ring attention does not take: the engine's SDPA, exact (k/v gathered),
            # dropout drawn as one device draws it (NOTE [SDPA's math path]).
            return None
        out = _sdpa_dtensor(q, k, v, a)
        if out is None and beside:
            out = _sdpa_pieces_on_another_mesh(mode, q, k, v, a)
        return out
    return _sdpa_pieces(mode, q, k, v, a)


def _beside(mesh, cp_mesh):
    """Whether ``mesh`` holds no rank of ``cp_mesh`` but this one (NOTE [pieces on another
    mesh])."""
    return len(set(mesh.mesh.flatten().tolist()) & set(cp_mesh.mesh.flatten().tolist())) == 1


def _sdpa_pieces_on_another_mesh(mode, q, k, v, a):
    """NOTE [pieces on another mesh]: ring attention on the local tensors, placed as q."""
    n = q.dim()
    if any(t.dim() != n or t.device_mesh != q.device_mesh for t in (k, v)) or any(
            [_placement_key(p, n) for p in t.placements] !=
            [_placement_key(p, n) for p in q.placements] for t in (k, v)) or any(
            p.is_partial() or (p.is_shard() and p.dim % n >= n - 2) for p in q.placements):
        raise ValueError(f"context_parallel: distributed q, k, v on {q.device_mesh} (beside the "
                         f"context-parallel mesh {mode.mesh}) must be placed alike, with the "
                         f"sequence and the head size whole; got {list(q.placements)}, "
                         f"{list(k.placements)}, {list(v.placements)}")
    out = _sdpa_pieces(mode, q.to_local(), k.to_local(), v.to_local(), a)
    shape = tuple(q.shape[:-1]) + (v.shape[-1],)
    return DTensor.from_local(out, q.device_mesh, list(q.placements), shape=shape,
                              stride=torch.empty(shape, device="meta").stride())


def _placement_key(p, ndim):
    """A placement compared by the tensor dim it cuts (``Shard(-2)`` is ``Shard(2)`` of 4 dims)."""
    return ("shard", p.dim % ndim) if p.is_shard() else str(p)


def _sdpa_pieces(mode, q, k, v, a):
    """Ring attention on plain pieces of the block's sequence."""
    scale = _check_sdpa_args(q, k, v, a["attn_mask"], a["dropout_p"], a["is_causal"],
                             a["scale"], a["enable_gqa"])
    group, rank, world = _cp_group(mode.mesh)
    q_lay = _plain_layout(q.shape[-2], world, rank, mode.load_balance, mode.seq_lens)
    kv_lay = q_lay if k.shape[-2] == q.shape[-2] else \
        _plain_layout(k.shape[-2], world, rank, mode.load_balance, mode.seq_lens)
    return _ring_sdpa(q, k, v, _plan(group, rank, q_lay, kv_lay, a["is_causal"], scale))


def _plan(group, rank, q_lay, kv_lay, is_causal, scale):
    return _RingPlan(group, rank, q_lay, kv_lay, bool(is_causal), scale,
                     _cp_options.rotate_method)


def _ring_mesh_dim(q, k, v):
    """The mesh dim whose group runs ring attention on distributed q/k/v (NOTE [ring attention
    in the engine]); None when no mesh dim shards the sequence. Raises ValueError for a
    sequence-sharded layout ring attention does not take."""
    mesh_dim, refusal = _C.ring_attention_mesh_dim(q, k, v)
    if refusal:
        raise ValueError(
            f"context parallel attention: {refusal}; got q, k, v placed {list(q.placements)}, "
            f"{list(k.placements)}, {list(v.placements)} on {q.device_mesh}, shapes "
            f"{list(q.shape)}, {list(k.shape)}, {list(v.shape)}. Ring attention takes Shard(seq) "
            f"(dim -2) on one mesh dim and, on the others, Replicate or Shard of the heads "
            f"(dim -3) or a batch dim, the same on q, k and v")
    return None if mesh_dim < 0 else mesh_dim


def _sdpa_dtensor(q, k, v, a):
    """Ring attention on distributed q/k/v: the engine's (NOTE [ring attention in the engine]);
    None for a layout that does not shard the sequence (the engine's rules). A sequence-sharded
    layout or arguments ring attention does not take raise."""
    if _ring_mesh_dim(q, k, v) is None:
        return None
    _check_sdpa_args(q, k, v, a["attn_mask"], a["dropout_p"], a["is_causal"], a["scale"],
                     a["enable_gqa"])
    return torch.ops.aten.scaled_dot_product_attention.default(
        q, k, v, None, 0.0, a["is_causal"], scale=a["scale"], enable_gqa=a["enable_gqa"])


def _enable_context_parallel_dispatcher():
    """PyTorch's name, kept for its callers: it makes ``F.scaled_dot_product_attention`` on
    distributed q/k/v sharded ``Shard(dim -2)`` on a mesh dim run ring attention without
    ``context_parallel``, which the engine does by itself for every such call (NOTE [ring
    attention in the engine]), so there is nothing to enable."""


def _disable_context_parallel_dispatcher():
    """PyTorch's name; the engine's ring attention stays (see
    ``_enable_context_parallel_dispatcher``)."""


@contextlib.contextmanager
def context_parallel(mesh, *, buffers=None, buffer_seq_dims=None, no_restore_buffers=None):
    """``with context_parallel(mesh, buffers=[...], buffer_seq_dims=[...]):`` shards each buffer
    in place along its sequence dim (head-tail when ``_cp_options.enable_load_balance``, the
    default, as PyTorch), keeping this rank's piece, and runs ``F.scaled_dot_product_attention``
    as ring attention (this module's docstring); at exit the buffers get their values
    back, except those in ``no_restore_buffers``. ``mesh`` is 1-D (the context-parallel dim;
    ``world["cp"]`` of a 2-D or 3-D world, whose other dims, TP's or FSDP's, it ignores).
    Beyond PyTorch: lengths need not divide by 2W; non-causal attention on a head-tail layout is
    exact (PyTorch refuses it); calls on distributed tensors sharded on the sequence work too,
    on any mesh (NOTE [ring attention in the engine])."""
    buffers = [] if buffers is None else list(buffers)
    seq_dims = [] if buffer_seq_dims is None else list(buffer_seq_dims)
    no_restore = [] if no_restore_buffers is None else list(no_restore_buffers)
    if len(buffers) != len(seq_dims):
        raise ValueError("`seq_dims` must have the same number of elements as `buffers`.")
    for b in no_restore:
        if not any(b is x for x in buffers):
            raise ValueError("`no_restore_buffers` must be a subset of `buffers`.")
    _, rank, world = _cp_group(mesh)
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
    group, rank, world = _cp_group(mesh)
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

