"""FSDP2: PyTorch's ``torch.distributed.fsdp.fully_shard`` over the dtensor engine.

``fully_shard(layer)`` for each block, then ``fully_shard(model)``: parameters become sharded
distributed tensors, all-gathered per group around forward and backward, with gradients
reduce-scattered into sharded gradients. See NOTE [fully_shard] in ``_fully_shard.py`` for what
is implemented and what is not yet.
"""

from dtensor.fsdp._api import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
from dtensor.fsdp._fully_shard import (FSDPModule, UnshardHandle, fully_shard,
                                       register_fsdp_forward_method, share_comm_ctx)

__all__ = [
    "CPUOffloadPolicy",
    "FSDPModule",
    "MixedPrecisionPolicy",
    "OffloadPolicy",
    "UnshardHandle",
    "fully_shard",
    "register_fsdp_forward_method",
    "share_comm_ctx",
]
