"""Functional collectives on local tensors, over the C++ engine (torch.ops.dtensor_c10d).

Like PyTorch's ``torch.distributed._functional_collectives``: every call returns a new tensor
and leaves its input untouched; groups are names. Start a job with ``init_from_env()`` in each
rank (launched by ``./x launch -n N -- python3 script.py`` or by
``python3 -m torch.distributed.run --nproc_per_node N -r 1 -t 1 script.py``; see README for why
``-r 1 -t 1``), then call the collectives with a group name (default ``"world"``).
"""

import torch

from dtensor import _C

__all__ = [
    "init_from_env",
    "context",
    "new_group",
    "all_reduce",
    "all_gather_into_tensor",
    "all_gather_tensor",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "broadcast",
    "wait_tensor",
    "AsyncCollectiveTensor",
]

WORLD = "world"
_context = None


def init_from_env(backend="", timeout_ms=0):
    """Rendezvous through torchrun's variables and a TCPStore; returns the rank context.

    ``backend``: "shm" (default, processes on one host), "c10d" (Gloo over TCP) or "threads".
    ``timeout_ms``: bound on every blocking wait (0: $DTENSOR_COLLECTIVE_TIMEOUT_MS, else 300 s).
    """
    global _context
    _context = _C.init_from_env(backend, timeout_ms)
    return _context


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
    """A group name from a name, a list of ranks, a 1-D DeviceMesh or (DeviceMesh, mesh_dim)."""
    if isinstance(group, str):
        return group
    if isinstance(group, (list, tuple)) and group and all(isinstance(r, int) for r in group):
        return _C.new_group(list(group))
    mesh, dim = (group, 0) if not isinstance(group, tuple) else group
    if hasattr(mesh, "_mesh"):
        if not isinstance(group, tuple) and mesh.ndim != 1:
            raise ValueError("a DeviceMesh group must be 1-D; pass (mesh, mesh_dim)")
        return _C.mesh_group_name(mesh._mesh, dim)
    raise TypeError(f"unsupported group {group!r}: pass a name, ranks, or (DeviceMesh, dim)")


def _size(group):
    return _C.group_size(group)


class AsyncCollectiveTensor(torch.Tensor):
    """The output of a collective issued with ``async_op=True``: it waits for the collective the
    first time it is used by any torch op (as PyTorch's AsyncCollectiveTensor does), or at
    ``wait_tensor``. Ops on it return plain tensors."""

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


def _done(t, async_op):
    # The operators issue asynchronously (as PyTorch's _c10d_functional ones do); the output is
    # valid after wait_tensor. With async_op=True the caller gets an AsyncCollectiveTensor.
    if async_op:
        return AsyncCollectiveTensor._wrap(t)
    return torch.ops.dtensor_c10d.wait_tensor(t)


def all_reduce(t, op="sum", group=WORLD, async_op=False):
    group = _group_name(group)
    return _done(torch.ops.dtensor_c10d.all_reduce(t, op, group), async_op)


def all_gather_into_tensor(t, gather_dim=0, group=WORLD, async_op=False):
    group = _group_name(group)
    out = torch.ops.dtensor_c10d.all_gather_into_tensor(t, _size(group), group, gather_dim)
    return _done(out, async_op)


def reduce_scatter_tensor(t, op="sum", scatter_dim=0, group=WORLD, async_op=False):
    group = _group_name(group)
    out = torch.ops.dtensor_c10d.reduce_scatter_tensor(t, op, _size(group), group, scatter_dim)
    return _done(out, async_op)


def all_to_all_single(t, output_split_sizes=None, input_split_sizes=None, group=WORLD,
                      async_op=False):
    group = _group_name(group)
    out = torch.ops.dtensor_c10d.all_to_all_single(
        t, list(output_split_sizes or []), list(input_split_sizes or []), group)
    return _done(out, async_op)


def broadcast(t, src=0, group=WORLD, async_op=False):
    group = _group_name(group)
    return _done(torch.ops.dtensor_c10d.broadcast(t, src, group), async_op)


def all_gather_tensor(t, gather_dim=0, group=WORLD, async_op=False):
    """PyTorch's name for all_gather_into_tensor along ``gather_dim``."""
    return all_gather_into_tensor(t, gather_dim, group, async_op)


def wait_tensor(t):
    """Blocks until ``t`` (an output of a call with async_op=True) is valid; returns it as a
    plain tensor."""
    if isinstance(t, AsyncCollectiveTensor):
        t = t.as_subclass(torch.Tensor)
    return torch.ops.dtensor_c10d.wait_tensor(t)
