"""Parallel styles (torch.distributed.tensor.parallel.style's names).

A style says how one module is laid out on the tensor-parallel ("tp") dim of a mesh: which
parameters are sharded, and how its inputs and outputs are converted with ``DTensor.from_local``,
``redistribute`` and ``to_local`` in forward hooks. On a mesh of more than one dim every placement
on the other dims is Replicate (see ``parallelize_module``'s ``tp_mesh_dim``).

Writing a style: subclass ``ParallelStyle`` and implement ``_apply(self, module, device_mesh)``
(PyTorch's contract); ``parallelize_module`` gives it a 1-D mesh (the tp dim's sub-mesh that
holds this rank when the mesh is N-D) and sets ``self.src_data_rank`` first. This package's own
styles take an extra keyword ``tp_mesh_dim`` (see ``ParallelStyle``).
"""

from abc import ABC, abstractmethod

import torch
from torch import nn

from dtensor._api import DTensor, distribute_tensor
from dtensor.placement_types import Placement, Replicate, Shard

__all__ = [
    "ParallelStyle",
    "ColwiseParallel",
    "RowwiseParallel",
    "SequenceParallel",
    "PrepareModuleInput",
    "PrepareModuleOutput",
    "PrepareModuleInputOutput",
]


# ---- placements on the tp dim of a mesh --------------------------------------------------------

def _full(mesh, tp, layout):
    """Placements for every mesh dim: ``layout`` on the tp dim, Replicate on the others."""
    out = [Replicate()] * mesh.ndim
    out[tp] = layout
    return out


def _same(a, b, ndim):
    """Placement equality with negative Shard dims counted from the end of an ``ndim``-D tensor."""
    if isinstance(a, Shard) and isinstance(b, Shard):
        return a.dim % max(ndim, 1) == b.dim % max(ndim, 1)
    return a == b


def _annotate(x, mesh, tp, layout):
    """A plain tensor becomes this rank's piece of a DTensor laid out ``layout`` on the tp dim; a
    DTensor is kept as it is."""
    if isinstance(x, DTensor):
        return x
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor to lay out as {layout!r}, got {type(x).__name__}")
    return DTensor.from_local(x, mesh, _full(mesh, tp, layout))


def _relayout(x, tp, layout):
    """``x`` redistributed so that its tp-dim placement is ``layout`` (other dims unchanged)."""
    placements = list(x.placements)
    if _same(placements[tp], layout, x.dim()):
        return x
    placements[tp] = layout
    return x.redistribute(x.device_mesh, placements)


def _distribute_params(module, mesh, tp, layouts, src_data_rank):
    """Replaces each parameter ``name`` of ``module`` by a DTensor laid out ``layouts[name]`` on
    the tp dim, keeping ``requires_grad`` (so optimizers built afterwards see DTensors)."""
    for name, layout in layouts.items():
        p = module._parameters.get(name)
        if p is None:
            continue
        if isinstance(p, DTensor):
            raise ValueError(f"{type(module).__name__}.{name} is already distributed (was the "
                             f"module parallelized twice?)")
        dt = distribute_tensor(p.detach(), mesh, _full(mesh, tp, layout),
                               src_data_rank=src_data_rank)
        module.register_parameter(name, nn.Parameter(dt, requires_grad=p.requires_grad))


def _unsupported(style, module, supported):
    return NotImplementedError(
        f"{style}: unsupported module type {type(module).__name__} (supported: {supported})")


def _first_input_hook(mesh, tp, input_layout, desired):
    def hook(_module, inputs):
        x = _relayout(_annotate(inputs[0], mesh, tp, input_layout), tp, desired)
        return (x,) + tuple(inputs[1:])
    return hook


def _output_hook(tp, output_layout, use_local_output):
    def hook(_module, _inputs, out):
        out = _relayout(out, tp, output_layout)
        return out.to_local() if use_local_output else out
    return hook


def _tp(device_mesh, tp_mesh_dim):
    """The tp dim of ``device_mesh``: ``tp_mesh_dim`` (an index), or its last dim when None."""
    return device_mesh.ndim - 1 if tp_mesh_dim is None else tp_mesh_dim % device_mesh.ndim


class ParallelStyle(ABC):
    """Base class of the styles (PyTorch's contract): ``_apply(module, device_mesh)`` parallelizes
    ``module`` in place and returns it; ``src_data_rank`` (default 0, set by
    ``parallelize_module``) is the mesh rank whose parameter values are scattered (None: each
    rank keeps its own copy).

    Extension: this package's styles take ``_apply(module, device_mesh, *, tp_mesh_dim=None)``,
    an N-D mesh with the tp dim's index (default the last dim); ``parallelize_module`` passes
    ``tp_mesh_dim`` to any ``_apply`` that declares it, and the tp dim's 1-D sub-mesh to others."""

    src_data_rank = 0

    @abstractmethod
    def _apply(self, module, device_mesh):
        ...


class ColwiseParallel(ParallelStyle):
    """Column-wise sharding of ``nn.Linear`` (weight and bias Shard(0): the output features are
    split) and ``nn.Embedding`` (weight Shard(1)). A plain input is read as ``input_layouts``
    (default Replicate) and redistributed to Replicate; the output is redistributed to
    ``output_layouts`` (default Shard(-1)) and returned as the local piece if
    ``use_local_output``."""

    def __init__(self, *, input_layouts=None, output_layouts=None, use_local_output=True):
        self.input_layouts = input_layouts or Replicate()
        self.output_layouts = output_layouts or Shard(-1)
        self.use_local_output = use_local_output

    def _apply(self, module, device_mesh, *, tp_mesh_dim=None):
        tp_mesh_dim, src_data_rank = _tp(device_mesh, tp_mesh_dim), self.src_data_rank
        if isinstance(module, nn.Linear):
            layouts = {"weight": Shard(0), "bias": Shard(0)}
        elif isinstance(module, nn.Embedding):
            layouts = {"weight": Shard(1)}
        else:
            raise _unsupported("ColwiseParallel", module, "nn.Linear, nn.Embedding")
        _distribute_params(module, device_mesh, tp_mesh_dim, layouts, src_data_rank)
        module.register_forward_pre_hook(
            _first_input_hook(device_mesh, tp_mesh_dim, self.input_layouts, Replicate()))
        module.register_forward_hook(
            _output_hook(tp_mesh_dim, self.output_layouts, self.use_local_output))
        return module


class RowwiseParallel(ParallelStyle):
    """Row-wise sharding of ``nn.Linear`` (weight Shard(1): the input features are split; bias
    Replicate) and ``nn.Embedding`` (weight Shard(0): the vocabulary is split). A plain input is
    read as ``input_layouts`` (default Shard(-1) for Linear, Replicate for Embedding) and
    redistributed to what the module needs (Shard(-1), resp. Replicate). The Partial output is
    redistributed to ``output_layouts``: Replicate (default, an all-reduce) or Shard(d) (a
    reduce-scatter); ``use_local_output`` returns the local piece."""

    def __init__(self, *, input_layouts=None, output_layouts=None, use_local_output=True):
        self.input_layouts = input_layouts
        self.output_layouts = output_layouts or Replicate()
        self.use_local_output = use_local_output

    def _apply(self, module, device_mesh, *, tp_mesh_dim=None):
        tp_mesh_dim, src_data_rank = _tp(device_mesh, tp_mesh_dim), self.src_data_rank
        if isinstance(module, nn.Linear):
            layouts, desired = {"weight": Shard(1), "bias": Replicate()}, Shard(-1)
        elif isinstance(module, nn.Embedding):
            layouts, desired = {"weight": Shard(0)}, Replicate()
        else:
            raise _unsupported("RowwiseParallel", module, "nn.Linear, nn.Embedding")
        _distribute_params(module, device_mesh, tp_mesh_dim, layouts, src_data_rank)
        module.register_forward_pre_hook(_first_input_hook(
            device_mesh, tp_mesh_dim, self.input_layouts or desired, desired))
        module.register_forward_hook(
            _output_hook(tp_mesh_dim, self.output_layouts, self.use_local_output))
        return module


class SequenceParallel(ParallelStyle):
    """Sequence parallelism, as PyTorch's: the module's parameters are replicated and its
    computation runs on the input sharded on ``sequence_dim``. Meant for norms (``nn.LayerNorm``,
    RMSNorm) and ``nn.Dropout``, where that needs no communication; any module is accepted, and
    one that mixes positions along the sequence (attention) stays exact, the engine
    communicating what it needs. A plain input is read as Shard(sequence_dim), a DTensor input
    is redistributed to it; the output stays as computed, Shard(sequence_dim) for a norm (the
    local piece if ``use_local_output``)."""

    def __init__(self, *, sequence_dim=1, use_local_output=False):
        self.sequence_dim = sequence_dim
        self.use_local_output = use_local_output

    def _apply(self, module, device_mesh, *, tp_mesh_dim=None):
        tp_mesh_dim = _tp(device_mesh, tp_mesh_dim)
        # As PyTorch's: each rank's own parameters become the replicas (from_local, no check and
        # no collective), since norms start from a fixed init (ones, zeros).
        for sub in module.modules():
            for name, p in list(sub._parameters.items()):
                if p is None:
                    continue
                if isinstance(p, DTensor):
                    raise ValueError(f"{type(sub).__name__}.{name} is already distributed (was "
                                     f"the module parallelized twice?)")
                dt = DTensor.from_local(p.detach(), device_mesh,
                                        _full(device_mesh, tp_mesh_dim, Replicate()),
                                        run_check=False)
                sub.register_parameter(name, nn.Parameter(dt, requires_grad=p.requires_grad))
        seq = Shard(self.sequence_dim)
        module.register_forward_pre_hook(_first_input_hook(device_mesh, tp_mesh_dim, seq, seq))
        use_local = self.use_local_output
        module.register_forward_hook(
            lambda _m, _i, out: out.to_local() if use_local else out)
        return module


def _as_tuple(layouts):
    return (layouts,) if isinstance(layouts, Placement) or layouts is None else tuple(layouts)


class PrepareModuleInput(ParallelStyle):
    """Lays out a module's inputs at run time: each positional input with a layout in
    ``input_layouts`` (``None``: left alone) is read as that layout if plain, then redistributed
    to ``desired_input_layouts``; keyword inputs likewise by ``input_kwarg_layouts`` /
    ``desired_input_kwarg_layouts``. ``use_local_output`` passes the local pieces on."""

    def __init__(self, *, input_layouts=None, desired_input_layouts=None,
                 input_kwarg_layouts=None, desired_input_kwarg_layouts=None,
                 use_local_output=False):
        self.input_layouts = None if input_layouts is None else _as_tuple(input_layouts)
        self.desired_input_layouts = (None if desired_input_layouts is None
                                      else _as_tuple(desired_input_layouts))
        if self.input_layouts is not None and (
                self.desired_input_layouts is None
                or len(self.input_layouts) != len(self.desired_input_layouts)):
            # AssertionError as PyTorch's (its check is an assert).
            raise AssertionError("PrepareModuleInput: input_layouts and desired_input_layouts "
                                 "should have same length!")
        self.input_kwarg_layouts = dict(input_kwarg_layouts or {})
        self.desired_input_kwarg_layouts = dict(desired_input_kwarg_layouts or {})
        if set(self.input_kwarg_layouts) != set(self.desired_input_kwarg_layouts):
            raise ValueError("PrepareModuleInput: input_kwarg_layouts and "
                             "desired_input_kwarg_layouts must name the same keywords")
        self.use_local_output = use_local_output

    def _prepare(self, x, mesh, tp, layout, desired):
        if layout is None:
            return x
        x = _annotate(x, mesh, tp, layout)
        if desired is not None:
            x = _relayout(x, tp, desired)
        return x.to_local() if self.use_local_output else x

    def _prepare_args(self, inputs, mesh, tp):
        if self.input_layouts is None:
            return tuple(inputs)
        if len(inputs) != len(self.input_layouts):
            raise ValueError(f"PrepareModuleInput: module inputs and input_layouts should have "
                             f"same length! (the module got {len(inputs)} positional inputs, "
                             f"input_layouts has {len(self.input_layouts)})")
        return tuple(self._prepare(x, mesh, tp, lay, want) for x, lay, want in
                     zip(inputs, self.input_layouts, self.desired_input_layouts))

    def _apply(self, module, device_mesh, *, tp_mesh_dim=None):
        tp_mesh_dim = _tp(device_mesh, tp_mesh_dim)
        if not self.input_kwarg_layouts:
            module.register_forward_pre_hook(
                lambda _m, inputs: self._prepare_args(inputs, device_mesh, tp_mesh_dim))
            return module
        # Keyword inputs through a pre-hook that sees them (as PyTorch's), never a wrapped
        # forward: an instance attribute closing over the original bound method survives
        # copy.deepcopy, so a copy ran the original module's forward and weights.
        def prepare(_m, args, kwargs):
            args = self._prepare_args(args, device_mesh, tp_mesh_dim)
            kwargs = {k: self._prepare(v, device_mesh, tp_mesh_dim,
                                       self.input_kwarg_layouts.get(k),
                                       self.desired_input_kwarg_layouts.get(k))
                      for k, v in kwargs.items()}
            return args, kwargs

        module.register_forward_pre_hook(prepare, with_kwargs=True)
        return module


class PrepareModuleOutput(ParallelStyle):
    """Lays out a module's outputs at run time: each output with a layout in ``output_layouts``
    (``None``: left alone) is read as that layout if plain, then redistributed to
    ``desired_output_layouts``; ``use_local_output`` returns the local pieces."""

    def __init__(self, *, output_layouts, desired_output_layouts, use_local_output=True):
        self.output_layouts = _as_tuple(output_layouts)
        self.desired_output_layouts = _as_tuple(desired_output_layouts)
        if len(self.output_layouts) != len(self.desired_output_layouts):
            raise AssertionError("PrepareModuleOutput: output_layouts and "
                                 "desired_output_layouts should have same length!")
        self.use_local_output = use_local_output

    def _prepare(self, outputs, mesh, tp):
        single = not isinstance(outputs, tuple)
        outputs = (outputs,) if single else outputs
        if len(outputs) != len(self.output_layouts):
            raise ValueError(f"PrepareModuleOutput: the module returned {len(outputs)} outputs "
                             f"but output_layouts has {len(self.output_layouts)}")
        prepared = []
        for out, layout, desired in zip(outputs, self.output_layouts,
                                        self.desired_output_layouts):
            if layout is not None:
                out = _relayout(_annotate(out, mesh, tp, layout), tp, desired or layout)
                out = out.to_local() if self.use_local_output else out
            prepared.append(out)
        return prepared[0] if single else tuple(prepared)

    def _apply(self, module, device_mesh, *, tp_mesh_dim=None):
        tp_mesh_dim = _tp(device_mesh, tp_mesh_dim)
        module.register_forward_hook(
            lambda _m, _i, outputs: self._prepare(outputs, device_mesh, tp_mesh_dim))
        return module


class PrepareModuleInputOutput(ParallelStyle):
    """``PrepareModuleInput`` and ``PrepareModuleOutput`` on one module: the inputs are laid out
    by ``input_layouts`` / ``desired_input_layouts`` (and the keyword ones), passed on as local
    pieces if ``use_local_input``; the outputs by ``output_layouts`` /
    ``desired_output_layouts``, returned as local pieces if ``use_local_output``."""

    def __init__(self, *, input_layouts=None, desired_input_layouts=None,
                 input_kwarg_layouts=None, desired_input_kwarg_layouts=None,
                 use_local_input=False, output_layouts, desired_output_layouts,
                 use_local_output=True):
        self.prepare_module_input = PrepareModuleInput(
            input_layouts=input_layouts,
            desired_input_layouts=desired_input_layouts,
            input_kwarg_layouts=input_kwarg_layouts,
            desired_input_kwarg_layouts=desired_input_kwarg_layouts,
            use_local_output=use_local_input,
        )
        self.prepare_module_output = PrepareModuleOutput(
            output_layouts=output_layouts,
            desired_output_layouts=desired_output_layouts,
            use_local_output=use_local_output,
        )

    def _apply(self, module, device_mesh, *, tp_mesh_dim=None):
        self.prepare_module_input._apply(module, device_mesh, tp_mesh_dim=tp_mesh_dim)
        self.prepare_module_output._apply(module, device_mesh, tp_mesh_dim=tp_mesh_dim)
        return module
