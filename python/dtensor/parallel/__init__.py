"""Tensor parallelism: torch.distributed.tensor.parallel's names over the dtensor engine.

``parallelize_module(model, mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})`` shards
the named submodules' parameters in place (they become ``nn.Parameter`` DTensors, so optimizers
built afterwards update the shards) and installs forward hooks that lay inputs and outputs out.

Differences from PyTorch:

* Pass a 1-D mesh (``mesh["tp"]``, as in PyTorch), or an N-D mesh with ``tp_mesh_dim`` (an index
  or a dim name; default the last dim). Parameters, annotated inputs and outputs are Replicate on
  the other mesh dims.
* ``src_data_rank`` defaults to 0, as in PyTorch: the mesh's first rank's parameter values are
  scattered to the others; ``None`` keeps each rank's own copy (every rank must hold the same
  module), with no communication.
* ``RowwiseParallel`` on ``nn.Embedding`` reads a plain input as Replicate by default.
* ``loss_parallel`` computes the exact loss but does not do the sharded-class-dim optimisation.
"""

import contextlib
from fnmatch import fnmatch

import dtensor
from dtensor.device_mesh import DeviceMesh
from dtensor.parallel.style import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
)

__all__ = [
    "ColwiseParallel",
    "ParallelStyle",
    "PrepareModuleInput",
    "PrepareModuleOutput",
    "RowwiseParallel",
    "SequenceParallel",
    "loss_parallel",
    "parallelize_module",
]


def _tp_dim(device_mesh, tp_mesh_dim):
    if not isinstance(device_mesh, DeviceMesh):
        raise TypeError(f"parallelize_module: expected a dtensor.DeviceMesh, got "
                        f"{type(device_mesh).__name__}")
    if tp_mesh_dim is None:
        return device_mesh.ndim - 1
    if isinstance(tp_mesh_dim, str):
        names = device_mesh.mesh_dim_names or ()
        if tp_mesh_dim not in names:
            raise ValueError(f"parallelize_module: the mesh has no dim named {tp_mesh_dim!r} "
                             f"(its dims: {names})")
        return names.index(tp_mesh_dim)
    if not -device_mesh.ndim <= tp_mesh_dim < device_mesh.ndim:
        raise ValueError(f"parallelize_module: tp_mesh_dim {tp_mesh_dim} is not a dim of a "
                         f"{device_mesh.ndim}-D mesh")
    return tp_mesh_dim % device_mesh.ndim


def _matches(module, path):
    """The submodules of ``module`` at the dotted ``path``; each atom is an fnmatch pattern."""
    found = [module]
    for atom in path.split("."):
        found = [child for parent in found for name, child in parent.named_children()
                 if fnmatch(name, atom)]
    return found


def parallelize_module(module, device_mesh=None, parallelize_plan=None, *, tp_mesh_dim=None,
                       src_data_rank=0):
    """Parallelizes ``module`` in place by ``parallelize_plan`` and returns it.

    ``parallelize_plan`` is a ``ParallelStyle`` (applied to ``module`` itself) or a dict from a
    submodule's fully-qualified name (each dotted part may be an fnmatch pattern: ``"layers.*.w1"``)
    to a style. A name that matches no submodule raises ValueError. ``device_mesh`` is 1-D, or N-D
    with ``tp_mesh_dim`` (index or name, default the last dim) naming the tensor-parallel dim.
    ``src_data_rank``: k (default 0) scatters the parameter values of the mesh's k-th rank;
    None keeps each rank's own copy of the parameters (no communication)."""
    if device_mesh is None:
        raise ValueError("parallelize_module: device_mesh must be given")
    tp = _tp_dim(device_mesh, tp_mesh_dim)
    if parallelize_plan is None:
        return module
    if isinstance(parallelize_plan, ParallelStyle):
        return parallelize_plan._apply(module, device_mesh, tp, src_data_rank)
    if not isinstance(parallelize_plan, dict):
        raise TypeError(f"parallelize_module: parallelize_plan must be a ParallelStyle or a dict "
                        f"of submodule names to styles, got {type(parallelize_plan).__name__}")
    for path, style in parallelize_plan.items():
        if not isinstance(style, ParallelStyle):
            raise TypeError(f"parallelize_module: the plan for {path!r} is not a ParallelStyle: "
                            f"{style!r}")
        targets = _matches(module, path) if path else []
        if not targets:
            raise ValueError(f"parallelize_module: no submodule of {type(module).__name__} "
                             f"matches {path!r} in the plan")
        for sub in targets:
            style._apply(sub, device_mesh, tp, src_data_rank)
    return module


@contextlib.contextmanager
def loss_parallel():
    """``with loss_parallel():`` ``F.cross_entropy(logits, target)`` on logits sharded on the
    class dim (Shard(-1), e.g. a ``ColwiseParallel(use_local_output=False)`` output) gives the
    single-device loss and gradients; call ``loss.backward()`` inside the block too, as PyTorch
    requires. Plain targets (and other plain tensors) are read as replicated.

    Not done: PyTorch's optimisation that keeps the class dim sharded (a distributed log-softmax
    with all-reduced max and sum); the engine's rules gather the class dim instead, so the result
    is exact but the logits are communicated."""
    with dtensor.replicate_plain_tensors():
        yield
