"""DTensor: distributed tensors that are torch.Tensors.

A distributed tensor is a plain ``torch.Tensor`` object whose C++ TensorImpl holds this rank's
piece and the global layout, so ``torch.mm(a, b)``, ``a + b``, ``F.linear``, autograd and
optimizers go straight from torch's bindings into the C++ engine with no Python on the path.
``isinstance(t, DTensor)`` is true for them; the DTensor methods (``to_local``, ``full_tensor``,
``redistribute``, ``placements``, ``device_mesh``) are installed on ``torch.Tensor`` and raise a
clear error on a plain tensor.
"""

import inspect
import warnings

import torch

from dtensor import _C
from dtensor.device_mesh import DeviceMesh, _current_mesh_or, _ensure_context
from dtensor.placement_types import (Partial, Placement, Replicate, Shard, _from_c,
                                     _rebuild_strided_shard, _StridedShard, _to_c_list)

__all__ = [
    "DTensor",
    "distribute_tensor",
    "distribute_module",
    "empty",
    "full",
    "ones",
    "rand",
    "randn",
    "zeros",
]

_meshes = {}


def _need_dtensor(t, name):
    # AttributeError, so hasattr(t, "placements") is False for a plain tensor.
    if not _C.is_dtensor(t):
        raise AttributeError(f"'{name}' is defined only for distributed tensors; this is a plain "
                             f"torch.Tensor (see dtensor.distribute_tensor)")


def _mesh_of(t):
    _need_dtensor(t, "device_mesh")
    c_mesh = _C.mesh(t)
    mesh = _meshes.get(c_mesh)
    if mesh is None:
        mesh = _meshes[c_mesh] = DeviceMesh._wrap(c_mesh)
    return mesh


def _check_mesh(device_mesh, placements, ndim=None):
    if not isinstance(device_mesh, DeviceMesh):
        raise TypeError(f"expected a dtensor.DeviceMesh, got {type(device_mesh).__name__}")
    if placements is None:
        placements = [Replicate()] * device_mesh.ndim
    if len(placements) != device_mesh.ndim:  # PyTorch's exception type for it
        raise ValueError(f"`placements` must have the same length as `device_mesh.ndim`! Found "
                         f"placements length: {len(placements)}, and device_mesh.ndim: "
                         f"{device_mesh.ndim}.")
    _meshes.setdefault(device_mesh._mesh, device_mesh)
    return _to_c_list(placements, ndim)


class _DTensorMeta(type(torch.Tensor)):
    def __instancecheck__(cls, obj):
        return isinstance(obj, torch.Tensor) and _C.is_dtensor(obj)


class DTensor(torch.Tensor, metaclass=_DTensorMeta):
    """The type of distributed tensors (``isinstance`` works); build them with
    ``distribute_tensor``, ``DTensor.from_local`` or the factories."""

    def __new__(cls, *args, **kwargs):
        raise TypeError(
            "DTensor is not constructed directly; use distribute_tensor or DTensor.from_local"
        )

    @staticmethod
    def from_local(local_tensor, device_mesh=None, placements=None, *, run_check=False,
                   shape=None, stride=None):
        """Wraps this rank's piece (gradients flow back to ``local_tensor``). ``device_mesh=None``:
        the current mesh (``with mesh:``)."""
        device_mesh = _current_mesh_or(device_mesh, "DTensor.from_local")
        # _StridedShard goes to C++ as it is (NOTE [strided shards] in layout/dtensor_spec.h).
        c_pl = _check_mesh(device_mesh, placements, local_tensor.dim())
        return _C.from_local(local_tensor, device_mesh._mesh, c_pl, run_check,
                             None if shape is None else list(shape),
                             None if stride is None else list(stride))


def _to_local(self, *, grad_placements=None):
    """This rank's piece (differentiable)."""
    gp = None if grad_placements is None else _to_c_list(grad_placements, self.dim())
    return _C.to_local(self, gp)


def _full_tensor(self, *, grad_placements=None):
    """The global tensor on every rank; ``grad_placements`` as in ``to_local``."""
    if grad_placements is None:
        return _C.full_tensor(self)
    replicated = self.redistribute(self.device_mesh, [Replicate()] * self.device_mesh.ndim)
    return replicated.to_local(grad_placements=grad_placements)


def _redistribute(self, device_mesh=None, placements=None, *, async_op=False, forward_dtype=None,
                  backward_dtype=None):
    """The same tensor laid out by ``placements``, on ``device_mesh`` (default: its own).

    On another mesh (other ranks, another shape) it is a cross-mesh redistribute (NOTE
    [cross-mesh redistribute] in dtensor/redistribute.h), which PyTorch refuses: every rank of
    either mesh calls it; a rank outside this tensor's mesh passes the tensor it has there (its
    piece is absent: a factory or ``from_local`` with ``shape=`` on this mesh makes one), and a
    rank outside ``device_mesh`` gets a tensor with no piece. Differentiable both ways.

    ``forward_dtype``: the local piece is cast to it before the redistribute (the communication
    runs in that dtype) and the result has that dtype. ``backward_dtype``: the gradient is
    redistributed in that dtype, then cast back to this tensor's dtype. As in PyTorch."""
    if placements is None:
        raise ValueError("redistribute: placements must be given")
    c_pl = _to_c_list(placements, self.dim())
    if device_mesh is not None and device_mesh != self.device_mesh:
        if forward_dtype is not None or backward_dtype is not None:
            raise NotImplementedError(
                "redistribute to another mesh takes no forward_dtype/backward_dtype")
        return _C.redistribute_to_mesh(self, device_mesh._mesh, c_pl, async_op)
    for name, dt in (("forward_dtype", forward_dtype), ("backward_dtype", backward_dtype)):
        if dt is not None and not isinstance(dt, torch.dtype):
            raise TypeError(f"redistribute: {name} must be a torch.dtype, got {dt!r}")
    if (forward_dtype is None or forward_dtype == self.dtype) and (
            backward_dtype is None or backward_dtype == self.dtype):
        return _C.redistribute(self, c_pl, async_op)
    return _RedistributeWithDtypes.apply(self, c_pl, async_op, forward_dtype, backward_dtype)


def _grad_placements(placements):
    """The layout a gradient goes back in: Partial inputs get a Replicate gradient (PyTorch's
    rule for the backward of a redistribute)."""
    return [Replicate() if p.is_partial() else p for p in placements]


def _cast_local(t, dtype):
    """``t`` with its local piece cast to ``dtype``, in the same layout (no communication: a
    Partial stays Partial, so a following reduction runs in ``dtype``). Not differentiable."""
    if t.dtype == dtype:
        return t
    local = _C.to_local(t, None).to(dtype)
    return _C.from_local(local, _C.mesh(t), _C.torch_placements(t), False, list(t.shape),
                         list(t.stride()))


class _RedistributeWithDtypes(torch.autograd.Function):
    """redistribute with a communication dtype for the forward and/or the backward."""

    @staticmethod
    def forward(ctx, x, c_pl, async_op, forward_dtype, backward_dtype):
        ctx.input_dtype = x.dtype
        ctx.input_placements = _grad_placements(_placements(x))
        ctx.backward_dtype = backward_dtype or x.dtype
        ctx.async_op = async_op
        if forward_dtype is not None:
            x = _cast_local(x, forward_dtype)
        out = _C.redistribute(x, c_pl, async_op)
        if out is x:
            out = out.view_as(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        if grad is None:
            return None, None, None, None, None
        if not _C.is_dtensor(grad):
            raise RuntimeError("redistribute: the gradient of a distributed tensor is not "
                               "distributed")
        with torch.no_grad():
            grad = _cast_local(grad, ctx.backward_dtype)
            grad = _C.redistribute(grad, _to_c_list(ctx.input_placements, grad.dim()), False)
            grad = _cast_local(grad, ctx.input_dtype)
        return grad, None, None, None, None


def _placements(self):
    _need_dtensor(self, "placements")
    # PyTorch's form: a non-default shard order as _StridedShard (NOTE [strided shards]).
    return tuple(_from_c(p) for p in _C.torch_placements(self))


def _repr(self, *args, **kwargs):
    if _C.is_dtensor(self):
        # PyTorch's DTensor.__repr__.
        with torch.no_grad():
            local = _C.to_local(self, None)
        return (f"DTensor(local_tensor={_plain_repr(local)}, device_mesh={_mesh_of(self)}, "
                f"placements={_placements(self)})")
    return _plain_repr(self, *args, **kwargs)


_plain_repr = torch.Tensor.__repr__
_parameter_new = torch.nn.Parameter.__new__


def _parameter(cls, data=None, requires_grad=True):
    # A distributed parameter's gradient takes the parameter's placements before it is
    # accumulated (a replicated weight used with a batch-sharded input gets its Partial
    # gradient reduced), as distribute_tensor's own leaves do.
    p = _parameter_new(cls, data, requires_grad)
    if requires_grad and data is not None and _C.is_dtensor(p):
        _C.keep_grad_layout(p)
    return p


_plain_deepcopy = torch.Tensor.__deepcopy__


def _deepcopy(self, memo):
    if not _C.is_dtensor(self):
        return _plain_deepcopy(self, memo)
    if id(self) in memo:
        return memo[id(self)]
    if not self.is_leaf:
        # torch's rule for plain tensors too.
        raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support "
                           "the deepcopy protocol at the moment")
    with torch.no_grad():
        new = self.clone()
    new.requires_grad_(self.requires_grad)
    if self.grad is not None:
        new.grad = _deepcopy(self.grad, memo)
    memo[id(self)] = new
    return new


_plain_reduce_ex = torch.Tensor.__reduce_ex__


def _reduce_ex(self, proto):
    """NOTE [pickling distributed tensors]: as PyTorch's DTensor, a distributed tensor pickles
    (pickle, torch.save) as its local piece plus its spec: mesh (NOTE [pickling meshes]),
    placements, global shape and stride, and requires_grad; it unpickles on the same rank of the
    same job. Plain tensors go to torch's own."""
    if not _C.is_dtensor(self):
        return _plain_reduce_ex(self, proto)
    with torch.no_grad():
        local = _C.to_local(self, None).detach()
    return (_rebuild_dtensor, (local, _mesh_of(self), _placements(self), tuple(self.shape),
                               tuple(self.stride()), self.requires_grad))


def _rebuild_dtensor(local, device_mesh, placements, shape, stride, requires_grad):
    t = DTensor.from_local(local, device_mesh, placements, shape=shape, stride=stride)
    return _make_leaf(t) if requires_grad else t


def _make_leaf(t):
    """``t`` requiring grad, a leaf as distribute_tensor makes: its gradient keeps its layout,
    but for Partial, where (as PyTorch's) it comes as autograd made it (Replicate)."""
    t.requires_grad_()
    if not any(p.is_partial() for p in _placements(t)):
        _C.keep_grad_layout(t)
    return t


# torch.load's default (weights_only=True) loads distributed tensors too, as PyTorch's.
torch.serialization.add_safe_globals([_rebuild_dtensor, DeviceMesh, Shard, _StridedShard,
                                      _rebuild_strided_shard, Replicate, Partial])

# The package's only global patches of torch; each is listed with its reason in the docstring of
# dtensor/__init__.py (keep that list in step with these lines).
torch.nn.Parameter.__new__ = staticmethod(_parameter)
torch.Tensor.to_local = _to_local
torch.Tensor.full_tensor = _full_tensor
torch.Tensor.redistribute = _redistribute
torch.Tensor.placements = property(_placements)
torch.Tensor.device_mesh = property(_mesh_of)
torch.Tensor.__repr__ = _repr
torch.Tensor.__deepcopy__ = _deepcopy
torch.Tensor.__reduce_ex__ = _reduce_ex


def distribute_tensor(tensor, device_mesh=None, placements=None, *, src_data_rank=0):
    """Lays ``tensor`` out on ``device_mesh``. ``src_data_rank=None``: every rank passes the same
    data and keeps its piece (no communication); k (0 by default): the data of the rank at mesh
    coordinate (k, ..., k) is scattered to the others. That is PyTorch's meaning: k is a group
    rank, the source on every mesh dim in turn, so on a 1-D mesh the mesh's k-th rank. On a
    Partial mesh dim each rank gets a share of the value (NOTE [distributing Partial]). As
    PyTorch's: a non-leaf tensor (one with a grad_fn) is refused, since its result would be cut
    from the graph; a distributed tensor already laid out so is returned as is, one on another
    mesh or with other placements raises ValueError (redistribute moves it)."""
    device_mesh = _current_mesh_or(device_mesh, "distribute_tensor")
    if not tensor.is_leaf:
        raise RuntimeError("`distribute_tensor` should be used to distribute leaf tensors! but "
                           "found non-leaf tensor!")
    if isinstance(tensor, DTensor):
        if tensor.device_mesh != device_mesh:
            raise ValueError(f"Cannot distribute a DTensor with device mesh {tensor.device_mesh} "
                             f"to a different device mesh {device_mesh}.")
        if placements is None or tensor.placements != tuple(placements):
            raise ValueError(f"Cannot distribute a DTensor with placements {tensor.placements} "
                             f"to a different placements {placements}. do you want to call "
                             f"`redistribute` instead?")
        return tensor
    c_pl = _check_mesh(device_mesh, placements, tensor.dim())
    if placements is not None and any(isinstance(p, Partial) for p in placements):
        return _distribute_partial(tensor, device_mesh, list(placements), src_data_rank)
    src = None
    if src_data_rank is not None:
        # A group rank on each mesh dim, not a global rank (on a 2x2 mesh, 1 is coordinate
        # (1, 1): the mesh's 4th rank, as PyTorch's per-dim broadcasts and scatters give).
        shape = tuple(device_mesh.shape)
        if not 0 <= src_data_rank < min(shape):
            raise ValueError(f"distribute_tensor: src_data_rank {src_data_rank} is not a group "
                             f"rank of every dim of the mesh {device_mesh} (shape {shape})")
        index = 0
        for size in shape:
            index = index * size + src_data_rank
        src = device_mesh._mesh.ranks[index]
    return _C.distribute_tensor(tensor, device_mesh._mesh, c_pl, src)


def _distribute_partial(tensor, device_mesh, placements, src_data_rank):
    """NOTE [distributing Partial]: PyTorch 2.11 distributes a value as Partial by replicating
    it, then on each Partial mesh dim of n ranks keeps shares that reduce to it: value / n for
    "sum", the value itself for "avg", "min" and "max"; other reduce ops raise ValueError, and
    so do mixed reduce ops other than sum with avg. Done here the same way: Replicate on those
    dims, then the shares are wrapped with from_local."""
    ops = {p.reduce_op for p in placements if isinstance(p, Partial)}
    if len(ops) > 1 and ops != {"sum", "avg"}:
        raise ValueError(f"Mixed Partial reduce types are not supported in the same placement "
                         f"list. Found reduce ops: {ops}. Please ensure all Partial placements "
                         f"use the same reduce operation.")
    unsupported = sorted(ops - {"sum", "avg", "min", "max"})
    if unsupported:
        raise ValueError(f"Replicate to Partial({unsupported[0]}) conversion is not supported.")
    replicated = [Replicate() if isinstance(p, Partial) else p for p in placements]
    with torch.no_grad():
        d = distribute_tensor(tensor.detach(), device_mesh, replicated,
                              src_data_rank=src_data_rank)
        local = _C.to_local(d, None)
        for m, p in enumerate(placements):
            if isinstance(p, Partial) and p.reduce_op == "sum":
                local = local / device_mesh.size(m)
    out = DTensor.from_local(local, device_mesh, placements, shape=d.shape, stride=d.stride())
    return _make_leaf(out) if tensor.requires_grad else out


def _hook_fn(fn, what):
    """PyTorch's check of an input_fn / output_fn: (module, x, mesh), or the deprecated
    (x, mesh) with a FutureWarning; another arity raises ValueError."""
    n = len(inspect.signature(fn).parameters)
    if n == 2:
        warnings.warn(f"Deprecating {what} that takes two arguments (inputs, device_mesh), please "
                      f"use {what} that takes in (module, inputs, device_mesh) instead!",
                      FutureWarning, stacklevel=3)
        return lambda mod, x, mesh: fn(x, mesh)
    if n != 3:
        raise ValueError(f"{what} should take in 3 arguments, but got {n} arguments!")
    return fn


def distribute_module(module, device_mesh=None, partition_fn=None, input_fn=None,
                      output_fn=None):
    """PyTorch's: distributes ``module``'s parameters with ``partition_fn(name, module, mesh)``
    (called on every submodule), then replicates every parameter and buffer still plain
    (broadcast from the mesh's first rank; with no ``partition_fn`` that is all of them), and
    installs ``input_fn(module, inputs, mesh)`` / ``output_fn(module, outputs, mesh)`` hooks
    (PyTorch's deprecated ``fn(inputs, mesh)`` works too, with a FutureWarning). A module may be
    distributed once; a second call raises RuntimeError, as PyTorch's."""
    device_mesh = _current_mesh_or(device_mesh, "distribute_module")
    if getattr(module, "_distribute_module_applied", False):
        raise RuntimeError("distribute_module should only be called once on a module, but it "
                           "has already been called on this module!")
    replicate = [Replicate()] * device_mesh.ndim
    if input_fn is not None:
        input_fn = _hook_fn(input_fn, "input_fn")
    if output_fn is not None:
        output_fn = _hook_fn(output_fn, "output_fn")

    def replicate_rest(mod):
        for key, p in list(mod._parameters.items()):
            if p is not None and not isinstance(p, DTensor):
                mod.register_parameter(key, torch.nn.Parameter(
                    distribute_tensor(p.detach(), device_mesh, replicate), p.requires_grad))
        for key, b in list(mod._buffers.items()):
            if b is not None and not isinstance(b, DTensor):
                mod._buffers[key] = distribute_tensor(b, device_mesh, replicate)

    for name, sub in module.named_modules():
        if partition_fn is not None:
            partition_fn(name, sub, device_mesh)
        replicate_rest(sub)
    if input_fn is not None:
        module.register_forward_pre_hook(lambda mod, inputs: input_fn(mod, inputs, device_mesh))
    if output_fn is not None:
        module.register_forward_hook(
            lambda mod, inputs, outputs: output_fn(mod, outputs, device_mesh))
    module._distribute_module_applied = True
    return module


def _factory(name):
    c_fn = getattr(_C, name)

    def make(*size, device_mesh=None, placements=None, dtype=None, requires_grad=False):
        if len(size) == 1 and isinstance(size[0], (list, tuple, torch.Size)):
            size = tuple(size[0])
        device_mesh = _current_mesh_or(device_mesh, f"dtensor.{name}")
        c_pl = _check_mesh(device_mesh, placements, len(size))
        return c_fn(list(size), device_mesh._mesh, c_pl, dtype, requires_grad)

    make.__name__ = name
    make.__doc__ = (f"``torch.{name}`` of the global size laid out on ``device_mesh`` by "
                    f"``placements`` (default replicated); only this rank's piece is made.")
    return make


empty = _factory("empty")
zeros = _factory("zeros")
ones = _factory("ones")
rand = _factory("rand")
randn = _factory("randn")


def full(size, fill_value, *, device_mesh=None, placements=None, dtype=None,
         requires_grad=False):
    """``torch.full`` laid out on ``device_mesh`` by ``placements`` (default replicated). An int
    ``fill_value`` stays an int (int64 values past 2**53 are exact); with ``dtype=None`` the
    dtype is inferred from ``fill_value`` as torch.full does (bool, int64, complex or the default
    float dtype)."""
    device_mesh = _current_mesh_or(device_mesh, "dtensor.full")
    if isinstance(size, int):
        size = (size,)
    if isinstance(fill_value, torch.Tensor):
        fill_value = fill_value.item()
    if not isinstance(fill_value, (bool, int, float, complex)):
        raise TypeError(f"dtensor.full: fill_value must be a number, got "
                        f"{type(fill_value).__name__}")
    if dtype is None:
        dtype = torch.full((), fill_value).dtype
    c_pl = _check_mesh(device_mesh, placements, len(size))
    return _C.full(list(size), fill_value, device_mesh._mesh, c_pl, dtype, requires_grad)
