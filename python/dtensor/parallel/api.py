"""``parallelize_module``: applies a plan of ParallelStyles to a module's submodules (PyTorch's
torch/distributed/tensor/parallel/api.py; the package docstring lists the differences)."""

import inspect
from fnmatch import fnmatch
import warnings

from dtensor.device_mesh import DeviceMesh, _current_mesh_or
from dtensor.parallel.style import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
)

__all__ = ["parallelize_module"]

_BUILTIN_STYLES = (ColwiseParallel, RowwiseParallel, SequenceParallel, PrepareModuleInput,
                   PrepareModuleOutput, PrepareModuleInputOutput)


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


def _tp_submesh(device_mesh, tp):
    """The 1-D sub-mesh along mesh dim ``tp`` that holds this rank (the mesh itself if 1-D)."""
    if device_mesh.ndim == 1:
        return device_mesh
    names = device_mesh.mesh_dim_names
    if names:
        return device_mesh[names[tp]]
    coord = device_mesh.get_coordinate()
    if coord is None:
        raise ValueError(f"parallelize_module: this rank is not in the mesh {device_mesh}")
    index = list(coord)
    index[tp] = slice(None)
    return DeviceMesh(device_mesh.device_type, device_mesh.mesh[tuple(index)].tolist())


def _takes_tp_mesh_dim(style):
    try:
        return "tp_mesh_dim" in inspect.signature(style._apply).parameters
    except (TypeError, ValueError):
        return False


# PyTorch's built-in styles run these (static) methods from their _apply, and subclasses override
# them (torchao's float8 styles do); this package's styles have no such methods, so an override
# would be silently skipped.
_PYTORCH_STYLE_HOOKS = ("_prepare_input_fn", "_prepare_output_fn", "_partition_linear_fn",
                        "_partition_embedding_fn", "_prepare_input_arg", "_prepare_input_kwarg_fn",
                        "_prepare_out_fn")


def _refuse_pytorch_hook_overrides(style):
    """A subclass of one of this package's styles that defines a hook method of PyTorch's styles
    raises instead of being ignored (override ``_apply`` instead)."""
    builtin = next((c for c in _BUILTIN_STYLES if isinstance(style, c)), None)
    if builtin is None:
        return  # a user's own ParallelStyle: its _apply does what it says
    for name in _PYTORCH_STYLE_HOOKS:
        if hasattr(type(style), name):
            raise NotImplementedError(
                f"parallelize_module: {type(style).__name__} overrides {name}, a hook of "
                f"PyTorch's {builtin.__name__} that this package's {builtin.__name__} does not "
                f"call; override _apply(module, device_mesh) instead")


def _apply_style(style, module, device_mesh, tp, src_data_rank):
    """PyTorch's contract: ``style.src_data_rank`` is set, then ``style._apply(module, mesh)``.
    A style whose ``_apply`` takes ``tp_mesh_dim`` (this package's) gets the whole mesh and the tp
    dim; any other (a user's ParallelStyle) gets the tp dim's 1-D sub-mesh."""
    style.src_data_rank = src_data_rank
    _refuse_pytorch_hook_overrides(style)
    if _takes_tp_mesh_dim(style):
        out = style._apply(module, device_mesh, tp_mesh_dim=tp)
    else:
        out = style._apply(module, _tp_submesh(device_mesh, tp))
    return module if out is None else out


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
    to a style. As PyTorch's, a name that matches no submodule is skipped with a UserWarning (a
    plan written for a family of models names layers some members lack), and no plan warns and
    does nothing. ``device_mesh`` is 1-D, or N-D
    with ``tp_mesh_dim`` (index or name, default the last dim) naming the tensor-parallel dim;
    None: the current mesh (``with mesh:``). A user's ``ParallelStyle`` whose
    ``_apply(module, device_mesh)`` has PyTorch's two arguments gets the tp dim's 1-D mesh.
    ``src_data_rank``: k (default 0) scatters the parameter values of the rank at mesh
    coordinate (k, ..., k) (PyTorch's group rank on every dim: on a 1-D mesh its k-th rank);
    None keeps each rank's own copy of the parameters (no communication)."""
    device_mesh = _current_mesh_or(device_mesh, "parallelize_module")
    tp = _tp_dim(device_mesh, tp_mesh_dim)
    if parallelize_plan is None:
        warnings.warn("parallelize_module: no parallelize_plan given, so this call does nothing",
                      stacklevel=2)
        return module
    if isinstance(parallelize_plan, ParallelStyle):
        return _apply_style(parallelize_plan, module, device_mesh, tp, src_data_rank)
    if not isinstance(parallelize_plan, dict):
        raise TypeError(f"parallelize_module: parallelize_plan must be a ParallelStyle or a dict "
                        f"of submodule names to styles, got {type(parallelize_plan).__name__}")
    for path, style in parallelize_plan.items():
        if not isinstance(style, ParallelStyle):
            raise TypeError(f"parallelize_module: the plan for {path!r} is not a ParallelStyle: "
                            f"{style!r}")
        targets = _matches(module, path) if path else [module]  # "": the module itself
        if not targets:
            warnings.warn(f"parallelize_module: no submodule of {type(module).__name__} matches "
                          f"{path!r}; skipping this plan entry", stacklevel=2)
        for sub in targets:
            _apply_style(style, sub, device_mesh, tp, src_data_rank)
    return module
