"""Placements: how a tensor lives on one mesh dimension (torch.distributed.tensor's names)."""

from dtensor import _C

__all__ = ["Placement", "Shard", "Replicate", "Partial"]


class Placement:
    """Base class of Shard, Replicate and Partial."""

    def is_shard(self, dim=None):
        return False

    def is_replicate(self):
        return False

    def is_partial(self, reduce_op=None):
        return False

    def _text(self):
        raise NotImplementedError

    def _to_c(self):
        return _C.Placement.parse(self._text())

    def __eq__(self, other):
        return isinstance(other, Placement) and self._text() == other._text()

    def __hash__(self):
        return hash(self._text())

    def __str__(self):
        # PyTorch's human-readable form: S(0), R, P(sum).
        return self._text()


class Shard(Placement):
    """The tensor is split along tensor dim ``dim`` (torch.chunk semantics) over the mesh dim."""

    def __init__(self, dim):
        self.dim = dim

    def is_shard(self, dim=None):
        return dim is None or dim == self.dim

    @staticmethod
    def local_shard_size_and_offset(curr_local_size, num_chunks, rank):
        """(size, offset) of piece ``rank`` when ``curr_local_size`` elements are split into
        ``num_chunks`` pieces by torch.chunk's rule: every piece but the trailing ones holds
        ceil(size / num_chunks); pieces past the end are empty, with offset ``curr_local_size``.
        The offset is relative to the tensor being split (as PyTorch's)."""
        if num_chunks <= 0:
            raise ValueError(f"Shard.local_shard_size_and_offset: num_chunks must be positive, "
                             f"got {num_chunks}")
        full = -(-curr_local_size // num_chunks)
        start = full * rank
        if start >= curr_local_size:
            return 0, curr_local_size
        return min(full, curr_local_size - start), start

    def _local_shard_size_and_offset(self, curr_local_size, num_chunks, rank):
        return Shard.local_shard_size_and_offset(curr_local_size, num_chunks, rank)

    def _text(self):
        return f"S({self.dim})"

    def __repr__(self):
        return f"Shard(dim={self.dim})"


class Replicate(Placement):
    """Every rank of the mesh dim holds the whole tensor."""

    def is_replicate(self):
        return True

    def _text(self):
        return "R"

    def __repr__(self):
        return "Replicate()"


class Partial(Placement):
    """Each rank holds a share; the value is the reduction (``reduce_op``) of the shares."""

    def __init__(self, reduce_op="sum"):
        self.reduce_op = reduce_op

    def is_partial(self, reduce_op=None):
        return reduce_op is None or reduce_op == self.reduce_op

    def _text(self):
        return f"P({self.reduce_op})"

    def __repr__(self):
        return f"Partial({self.reduce_op})"


def _from_c(p):
    if p.is_shard():
        return Shard(p.dim)
    if p.is_partial():
        return Partial(p.reduce_op)
    return Replicate()


def _to_c_list(placements, ndim=None):
    """C++ placements; a negative Shard dim counts from the end of a tensor of ``ndim`` dims."""
    if placements is None:
        raise ValueError("placements must be given")
    out = []
    for p in placements:
        if not isinstance(p, Placement):
            raise TypeError(f"expected a Placement (Shard, Replicate, Partial), got {p!r}")
        if isinstance(p, Shard) and p.dim < 0:
            if ndim is None or p.dim + ndim < 0:
                raise ValueError(f"{p!r} does not name a dim of a {ndim}-D tensor")
            p = Shard(p.dim + ndim)
        out.append(p._to_c())
    return out
