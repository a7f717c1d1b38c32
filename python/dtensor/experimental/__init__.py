"""torch.distributed.tensor.experimental's names: ``local_map``, ``implicit_replication`` and
``register_sharding``."""

from dtensor.experimental._func_map import local_map
from dtensor.experimental._register_sharding import register_sharding
from dtensor.experimental._ring_attention import set_rotate_method
from dtensor.experimental._context_parallel import context_parallel, context_parallel_unshard

__all__ = ["implicit_replication", "local_map", "register_sharding"]
__all__ += ["context_parallel", "context_parallel_unshard", "set_rotate_method"]


def implicit_replication():
    """``with implicit_replication():`` plain tensors mixed with distributed ones are read as
    replicated (every rank must pass the same values). PyTorch's name for
    ``dtensor.replicate_plain_tensors()``."""
    import dtensor
    return dtensor.replicate_plain_tensors()
