"""FSDP's policies (torch.distributed.fsdp's names and meanings): MixedPrecisionPolicy,
OffloadPolicy, CPUOffloadPolicy."""

from dataclasses import dataclass

import torch

__all__ = ["CPUOffloadPolicy", "MixedPrecisionPolicy", "OffloadPolicy"]


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """Mixed precision at module boundaries, as PyTorch's.

    ``param_dtype``: the dtype of the unsharded parameters used for compute (the all-gather runs
    in it); None: the parameters' own dtype. ``reduce_dtype``: the dtype gradients are reduced
    in; None: ``param_dtype`` (the dtype they are computed in). ``output_dtype``: floating-point
    forward outputs are cast to it; None: no cast. ``cast_forward_inputs``: floating-point
    forward inputs are cast to ``param_dtype``. Sharded parameters and their gradients keep the
    parameters' original dtype.
    """

    param_dtype: torch.dtype | None = None
    reduce_dtype: torch.dtype | None = None
    output_dtype: torch.dtype | None = None
    cast_forward_inputs: bool = True


@dataclass
class OffloadPolicy:
    """No offloading (the default), as PyTorch's base class."""


@dataclass
class CPUOffloadPolicy(OffloadPolicy):
    """Sharded parameters and gradients live on the CPU; the optimizer steps there.
    ``pin_memory``: pin them (on a CUDA mesh; NOTE [CPU offload] in ``_fsdp_param.py``).
    On a CPU mesh the sharded state is on the CPU already."""

    pin_memory: bool = True
