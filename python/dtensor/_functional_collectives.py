"""Functional collectives on local tensors, over the C++ engine (torch.ops.dtensor_c10d).

PyTorch's ``torch.distributed._functional_collectives`` names, signatures and defaults: every
call returns a new tensor (an ``AsyncCollectiveTensor``: ``wait()`` gives the plain tensor) and
leaves its input untouched; ``group`` is any of PyTorch's forms (a ProcessGroup, ranks, rank lists, a 1-D
mesh, (mesh, dim)) or a group name; ``tag`` is accepted and unused. Extensions: defaults
(``reduceOp="sum"``, ``group="world"``); the call waits, so errors raise at it, unless
``async_op=True`` (then the first use waits, as PyTorch's); the operators are differentiable.
Start a job with ``init_from_env()`` in each rank (launched by
``./x launch -n N -- python3 script.py`` or by
``python3 -m torch.distributed.run --nproc_per_node N script.py``), then call the collectives
with a group name (default ``"world"``).
"""

import contextlib

import torch

from dtensor import _C

__all__ = [
    "init_from_env",
    "context",
    "new_group",
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced",
    "all_gather_tensor",
    "all_gather_tensor_autograd",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_autograd",
    "reduce_scatter_tensor_coalesced",
    "all_to_all_single",
    "all_to_all_single_autograd",
    "broadcast",
    "permute_tensor",
    "wait_tensor",
    "AsyncCollectiveTensor",
]

WORLD = "world"


@contextlib.contextmanager
def _purpose(name):
    """Names what the collectives issued inside are for (NOTE [collective purpose] in
    collectives/functional.h): ranks whose calls name different purposes fail that collective
    on every rank with an error naming both. Not part of PyTorch's API."""
    _C.push_comm_purpose(name)
    try:
        yield
    finally:
        _C.pop_comm_purpose()
_context = None


def init_from_env(backend="", timeout_ms=0):
    """Rendezvous through torchrun's variables and a TCPStore; returns the rank context.

    ``backend``: "shm" (default, processes on one host), "c10d" (Gloo over TCP) or "threads".
    ``timeout_ms``: bound on every blocking wait (0: $DTENSOR_COLLECTIVE_TIMEOUT_MS, else 300 s).
    """
    global _context
    _context = _C.init_from_env(backend, timeout_ms)
    _leave_on_uncaught_exception()
    return _context


def _leave_on_uncaught_exception():
    """A rank process that ends with an uncaught exception leaves its groups first, so peers that
    wait for it fail at once naming its error (NOTE [leaving a group]) instead of waiting out the
    timeout or for the launcher to kill them."""
    import sys

    previous = sys.excepthook
    if getattr(previous, "_dtensor_leaves", False):
        return

    def hook(exc_type, exc, tb):
        try:
            if _context is not None:
                first = str(exc).split("\n", 1)[0]
                _context.leave(f"{exc_type.__name__}: {first}")
        except Exception:  # noqa: BLE001  (the original error is what must be reported)
            pass
        previous(exc_type, exc, tb)

    hook._dtensor_leaves = True
    sys.excepthook = hook


def context():
    """The collectives context of the calling rank: the one init_from_env() made, else the calling
    thread's (a rank of dtensor.run_threads, or one made by init_device_mesh)."""
    if _context is not None:
        return _context
    return _C.current_context()


def new_group(ranks, tag=""):
    """A group over ``ranks`` (every member must create it); returns its name."""
    return context().new_group(list(ranks), tag)


def _group_name(group):
    """A group name from any of PyTorch's group forms (``RANK_TYPES``): a name, a list of ranks,
    a list of rank lists (this rank's list is the group), a ``torch.distributed.ProcessGroup``,
    a 1-D DeviceMesh or (DeviceMesh, mesh_dim)."""
    if isinstance(group, str):
        return group
    if isinstance(group, (list, tuple)) and group and all(isinstance(r, int) for r in group):
        return _C.new_group(list(group))
    if isinstance(group, list) and group and all(isinstance(g, (list, tuple)) for g in group):
        mine = [g for g in group if _C.rank() in g]
        if len(mine) != 1:
            raise ValueError(f"functional collectives: rank {_C.rank()} is in {len(mine)} of "
                             f"the groups {group}; it must be in exactly one")
        return _C.new_group(list(mine[0]))
    mesh, dim = (group, 0) if not isinstance(group, tuple) else group
    if hasattr(mesh, "_mesh"):
        if not isinstance(group, tuple) and mesh.ndim != 1:
            raise ValueError("a DeviceMesh group must be 1-D; pass (mesh, mesh_dim)")
        return _C.mesh_group_name(mesh._mesh, dim)
    name = getattr(group, "_group", None)  # a DTensorProcessGroup (backend "dtensor")
    if isinstance(name, str):
        return name
    if isinstance(group, torch.distributed.ProcessGroup):
        engine = _engine_group_of(group)
        if engine is not None:
            return engine
        from torch.distributed import distributed_c10d as c10d
        ranks = c10d._pg_group_ranks.get(group)
        if ranks is None:
            raise ValueError(f"functional collectives: {group!r} is not a registered group")
        return _C.new_group(sorted(ranks, key=ranks.get))
    raise TypeError(f"unsupported group {group!r}: pass a name, ranks, a list of rank lists, a "
                    f"ProcessGroup, a 1-D DeviceMesh or (DeviceMesh, mesh_dim)")


def _engine_group_of(pg):
    """The engine group behind a mesh's torch ProcessGroup (registered as "dtensor:<group>",
    NOTE [mesh groups as torch process groups]), else None."""
    try:
        name = pg.group_name
    except RuntimeError:  # a group with no name set
        return None
    prefix = "dtensor:"
    return name[len(prefix):] if isinstance(name, str) and name.startswith(prefix) else None


def _size(group):
    return _C.group_size(group)


class AsyncCollectiveTensor(torch.Tensor):
    """The output of a functional collective (PyTorch's type). Issued with ``async_op=True``, it
    waits for the collective the first time any torch op uses it (ops return plain tensors), or
    at ``wait()`` / ``wait_tensor``; by default it is complete already. ``wait()`` returns the
    plain tensor; ``trigger_wait()`` waits and returns this object; ``elem`` is the plain tensor
    (not waited)."""

    @staticmethod
    def _wrap(t):
        return torch.Tensor._make_subclass(AsyncCollectiveTensor, t, t.requires_grad)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        def unwrap(x):
            if isinstance(x, AsyncCollectiveTensor):
                return torch.ops.dtensor_c10d.wait_tensor(x.as_subclass(torch.Tensor))
            if isinstance(x, (list, tuple)):
                return type(x)(unwrap(y) for y in x)
            return x

        with torch._C.DisableTorchFunction():
            return func(*unwrap(args), **{k: unwrap(v) for k, v in (kwargs or {}).items()})

    @property
    def elem(self):
        with torch._C.DisableTorchFunction():
            return self.as_subclass(torch.Tensor)

    def wait(self):
        return wait_tensor(self)

    def trigger_wait(self):
        wait_tensor(self)
        return self


def _done(t, async_op):
    # The operators issue asynchronously (as PyTorch's _c10d_functional ones do); the output is
    # valid after wait_tensor. async_op=False (default) waits here, so a failed collective raises
    # at the call, and returns the result as a completed AsyncCollectiveTensor, so PyTorch code
    # that calls .wait() works; async_op=True returns it unwaited (waited at first use). A result
    # in the autograd graph (the operators are differentiable) stays a plain tensor, waited even
    # with async_op=True: a subclass wrapper would cut the graph.
    if not async_op or t.requires_grad:  # a plain result must be complete: nothing waits on it
        t = torch.ops.dtensor_c10d.wait_tensor(t)
    return t if t.requires_grad else AsyncCollectiveTensor._wrap(t)


def all_reduce(self, reduceOp="sum", group=WORLD, tag="", *, async_op=False):  # noqa: N803
    """PyTorch's signature. ``reduceOp``: "sum", "avg", "product", "min", "max", "band", "bor",
    "bxor". ``tag`` is accepted and unused (PyTorch's is deprecated)."""
    group = _group_name(group)
    return _done(torch.ops.dtensor_c10d.all_reduce(self, reduceOp.lower(), group), async_op)


def all_gather_into_tensor(t, gather_dim=0, group=WORLD, tag="", *, async_op=False):
    group = _group_name(group)
    out = torch.ops.dtensor_c10d.all_gather_into_tensor(t, _size(group), group, gather_dim)
    return _done(out, async_op)


def all_gather_tensor(self, gather_dim=0, group=WORLD, tag="", *, async_op=False):
    """PyTorch's name and signature: every rank's ``self`` concatenated along ``gather_dim``."""
    return all_gather_into_tensor(self, gather_dim, group, tag, async_op=async_op)


def reduce_scatter_tensor(self, reduceOp="sum", scatter_dim=0, group=WORLD, tag="", *,  # noqa: N803
                          async_op=False):
    group = _group_name(group)
    out = torch.ops.dtensor_c10d.reduce_scatter_tensor(self, reduceOp.lower(), _size(group),
                                                       group, scatter_dim)
    return _done(out, async_op)


def all_to_all_single(self, output_split_sizes=None, input_split_sizes=None, group=WORLD, tag="",
                      *, async_op=False):
    group = _group_name(group)
    out = torch.ops.dtensor_c10d.all_to_all_single(
        self, list(output_split_sizes or []), list(input_split_sizes or []), group)
    return _done(out, async_op)


def broadcast(self, src=0, group=WORLD, tag="", *, async_op=False):
    group = _group_name(group)
    return _done(torch.ops.dtensor_c10d.broadcast(self, src, group), async_op)


def all_reduce_coalesced(self, reduceOp="sum", group=WORLD, tag="", *,  # noqa: N803
                         async_op=False):
    """One all_reduce per tensor of the list ``self``; returns the list."""
    return [all_reduce(t, reduceOp, group, tag, async_op=async_op) for t in self]


def all_gather_into_tensor_coalesced(self, group=WORLD, tag="", *, async_op=False):
    return [all_gather_tensor(t, 0, group, tag, async_op=async_op) for t in self]


def reduce_scatter_tensor_coalesced(inputs, reduceOp="sum",  # noqa: N803
                                    scatter_dim=None, group=WORLD, tag="", *, async_op=False):
    dims = scatter_dim if scatter_dim is not None else [0] * len(inputs)
    return [reduce_scatter_tensor(t, reduceOp, d, group, tag, async_op=async_op)
            for t, d in zip(inputs, dims)]


def permute_tensor(self, src_dst, group=WORLD, tag=""):
    """PyTorch's: ``src_dst[m] == n`` means group rank m sends its tensor to group rank n;
    returns the tensor this rank receives (same shape), waited."""
    name = _group_name(group)
    ranks = list(_C.group_ranks(name))
    me = ranks.index(_C.rank())
    if sorted(src_dst) != list(range(len(ranks))):
        raise ValueError(f"permute_tensor: src_dst {list(src_dst)} is not a permutation of the "
                         f"group's {len(ranks)} ranks")
    flat = self.contiguous().view(-1)
    send = [0] * len(ranks)
    recv = [0] * len(ranks)
    send[src_dst[me]] = flat.numel()
    recv[src_dst.index(me)] = flat.numel()
    out = wait_tensor(all_to_all_single(flat, recv, send, name, tag)).view(self.shape)
    return out if out.requires_grad else AsyncCollectiveTensor._wrap(out)


# The dtensor_c10d operators are differentiable (NOTE [torch ops]: all_gather <-> reduce_scatter
# of sum or avg, all_to_all reversed); PyTorch's *_autograd names return them waited, as plain
# tensors in the autograd graph (an AsyncCollectiveTensor would cut the graph).

def all_gather_tensor_autograd(self, gather_dim=0, group=WORLD, tag=""):
    """Differentiable all_gather_tensor (backward: reduce_scatter of the gradient, sum)."""
    return all_gather_tensor(self, gather_dim, group, tag, async_op=False)


def reduce_scatter_tensor_autograd(self, reduceOp="sum", scatter_dim=0, group=WORLD,  # noqa: N803
                                   tag=""):
    """Differentiable reduce_scatter_tensor for "sum" and "avg" (backward: all_gather)."""
    return reduce_scatter_tensor(self, reduceOp, scatter_dim, group, tag, async_op=False)


def all_to_all_single_autograd(self, output_split_sizes=None, input_split_sizes=None, group=WORLD,
                               tag=""):
    """Differentiable all_to_all_single (backward: the reverse exchange)."""
    return all_to_all_single(self, output_split_sizes, input_split_sizes, group, tag,
                             async_op=False)


def wait_tensor(tensor):
    """Blocks until ``tensor`` (a functional collective's output) is valid; returns it as a
    plain tensor."""
    if isinstance(tensor, AsyncCollectiveTensor):
        tensor = tensor.elem
    return torch.ops.dtensor_c10d.wait_tensor(tensor)
