"""Placements: how a tensor lives on one mesh dimension (torch.distributed.tensor's names)."""

import math

from dtensor import _C

__all__ = ["Placement", "Shard", "Replicate", "Partial"]  # and _StridedShard, as PyTorch


# NOTE [one Placement type] (python/csrc/bindings.cc): these classes subclass the C++ placement
# classes, so each is the C++ value the engine takes (is_shard, is_partial, dim, reduce_op come
# from there); only PyTorch's Python-side helpers live here.
Placement = _C.Placement


def _text(p):
    """S(0), R, P(sum); _S(0,2) for a strided shard: the key of equality and hashing."""
    return str(p)


class _ByText:
    """Equality and hashing by the text form, so a _StridedShard differs from its Shard."""

    def __eq__(self, other):
        return isinstance(other, Placement) and _text(self) == _text(other)

    def __hash__(self):
        return hash(_text(self))


class Shard(_ByText, _C.Shard):
    """The tensor is split along tensor dim ``dim`` (torch.chunk semantics) over the mesh dim."""

    def __init__(self, dim):
        super().__init__(dim)

    @staticmethod
    def local_shard_size_and_offset(curr_local_size, num_chunks, rank):
        """(size, offset) of piece ``rank`` when ``curr_local_size`` elements are split into
        ``num_chunks`` pieces by torch.chunk's rule (layout/shard_layout.h's chunk_slice): every
        piece but the trailing ones holds ceil(size / num_chunks); pieces past the end are
        empty, with offset ``curr_local_size``. The offset is relative to the tensor being split
        (as PyTorch's)."""
        if num_chunks <= 0:
            raise ValueError(f"Shard.local_shard_size_and_offset: num_chunks must be positive, "
                             f"got {num_chunks}")
        return _C.chunk_slice(curr_local_size, num_chunks, rank)

    def _local_shard_size_and_offset(self, curr_local_size, num_chunks, rank):
        return Shard.local_shard_size_and_offset(curr_local_size, num_chunks, rank)

    def __str__(self):
        return f"S({self.dim})"

    def __repr__(self):
        return f"Shard(dim={self.dim})"

    def __reduce__(self):
        return (type(self), (self.dim,))


class _StridedShard(_ByText, _C.StridedShard):
    """PyTorch's _StridedShard(dim, split_factor=sf): dim is cut into ``split_factor`` pieces
    (torch.chunk), each piece over the mesh dim's ranks, and rank i holds chunk i of every piece
    (8 rows, sf 2, 2 ranks: rank 0 holds rows [0, 1, 4, 5]). On a (dp, tp) mesh
    ``(_StridedShard(0, split_factor=tp), Shard(0))`` is FSDP over TP: "tp" cuts dim 0 first and
    each of those pieces is cut by "dp".

    NOTE [strided shards] (layout/dtensor_spec.h): the engine takes it as it is; a strided shard
    that a shard order expresses (FSDP over TP) becomes a Shard plus that order in C++, and
    ``placements`` gives it back in this form. As in PyTorch it is not a Shard: ``is_shard()`` is
    False and it never equals ``Shard(dim)``."""

    def __init__(self, dim, *, split_factor):
        _C.StridedShard.__init__(self, dim, split_factor=split_factor)

    def __str__(self):
        return f"_S({self.dim},{self.split_factor})"

    def __repr__(self):
        return f"_StridedShard(dim={self.dim}, sf={self.split_factor})"

    def __reduce__(self):
        return (_rebuild_strided_shard, (self.dim, self.split_factor))


def _rebuild_strided_shard(dim, split_factor):
    """Unpickles a _StridedShard (its split_factor is keyword-only)."""
    return _StridedShard(dim, split_factor=split_factor)


def _no_dim(self):
    # PyTorch's Replicate and Partial have no `dim` (the C++ Placement's is a Shard's only):
    # libraries tell shards from the rest by hasattr(p, "dim") (transformers' shard-on-read).
    raise AttributeError(f"'{type(self).__name__}' object has no attribute 'dim'")


class Replicate(_ByText, _C.Replicate):
    """Every rank of the mesh dim holds the whole tensor."""

    dim = property(_no_dim)

    def __init__(self):
        super().__init__()

    def __str__(self):
        return "R"

    def __repr__(self):
        return "Replicate()"

    def __reduce__(self):
        return (type(self), ())


class Partial(_ByText, _C.Partial):
    """Each rank holds a share; the value is the reduction (``reduce_op``) of the shares."""

    dim = property(_no_dim)

    def __init__(self, reduce_op="sum"):
        super().__init__(reduce_op)

    def __str__(self):
        return _C.Placement.__repr__(self)

    def __repr__(self):
        return f"Partial({self.reduce_op})"

    def __reduce__(self):
        return (type(self), (self.reduce_op,))


class _NormPartial(Partial):
    """Pieces that are p-norms of a sharded tensor's pieces: the value is
    (sum of |piece|^p)^(1/p) (NOTE [p-norm Partial] in layout/placement.h; PyTorch's name).
    Orders 0 and 1 reduce by sum, inf by max and -inf by min, as PyTorch's."""

    def __init__(self, norm_type=2):
        p = float(norm_type)
        op = {0.0: "sum", 1.0: "sum", math.inf: "max", -math.inf: "min"}.get(p, f"norm{p!r}")
        _C.Partial.__init__(self, op)
        self._norm_type = norm_type

    @property
    def norm_type(self):
        return self._norm_type

    @property
    def reduce_op(self):
        op = _C.Placement.reduce_op.fget(self)
        return "sum" if op == "norm" else op

    def __str__(self):
        return _C.Placement.__repr__(self)

    def __repr__(self):
        return f"_NormPartial(reduce_op={self.reduce_op}, norm_type={self.norm_type})"

    def __reduce__(self):
        return (type(self), (self.norm_type,))


def _from_c(p):
    if p.is_strided_shard():
        return _StridedShard(p.dim, split_factor=p.split_factor)
    if p.is_shard():
        return Shard(p.dim)
    if p.is_partial():
        if p.norm_order:
            order = p.norm_order
            return _NormPartial(int(order) if order == int(order) else order)
        return Partial(p.reduce_op)
    return Replicate()


def _to_c_list(placements, ndim=None):
    """C++ placements; a negative Shard dim counts from the end of a tensor of ``ndim`` dims."""
    if placements is None:
        raise ValueError("placements must be given")
    out = []
    for p in placements:
        if not isinstance(p, (Shard, Replicate, Partial, _StridedShard)):
            raise TypeError(f"expected a Placement (Shard, Replicate, Partial, _StridedShard), "
                            f"got {p!r}")
        if isinstance(p, (Shard, _StridedShard)) and p.dim < 0:
            if ndim is None or p.dim + ndim < 0:
                raise ValueError(f"{p!r} does not name a dim of a {ndim}-D tensor")
            p = (_StridedShard(p.dim + ndim, split_factor=p.split_factor)
                 if isinstance(p, _StridedShard) else Shard(p.dim + ndim))
        out.append(p)
    return out
