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
* A user's ``ParallelStyle`` implements PyTorch's ``_apply(module, device_mesh)``; on an N-D mesh
  it is given the tp dim's 1-D sub-mesh that holds this rank. This package's styles also take
  ``_apply(..., tp_mesh_dim=...)`` (the whole mesh and the tp dim).
* ``device_mesh=None`` uses the current mesh (``with mesh:``), as PyTorch.
* ``RowwiseParallel`` on ``nn.Embedding`` reads a plain input as Replicate by default.
* The built-in styles have no ``_prepare_input_fn`` / ``_prepare_output_fn`` /
  ``_partition_*_fn`` hooks; a subclass that overrides one (torchao's float8 styles) raises
  NotImplementedError naming it, instead of being silently skipped: override ``_apply``.
* ``loss_parallel`` also takes ``label_smoothing``, an N-D mesh (one mesh dim shards the class
  dim), and leaves inputs not sharded on the class dim to the engine (PyTorch raises).
"""

from dtensor.parallel.api import parallelize_module
from dtensor.parallel.loss import loss_parallel
from dtensor.parallel.style import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
)

__all__ = [
    "ColwiseParallel",
    "ParallelStyle",
    "PrepareModuleInput",
    "PrepareModuleInputOutput",
    "PrepareModuleOutput",
    "RowwiseParallel",
    "SequenceParallel",
    "loss_parallel",
    "parallelize_module",
]
