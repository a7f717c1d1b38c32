"""PyTorch's module name for context parallelism (torch.distributed.tensor.experimental._attention
holds both the ring attention and the API): the engine's ring attention lives in
``_ring_attention.py`` and the API in ``_context_parallel.py``; this module gathers their names,
so ``dtensor.as_torch`` maps PyTorch's module here and imports written for PyTorch work."""

from dtensor.experimental._context_parallel import (_disable_context_parallel_dispatcher,
                                                    _enable_context_parallel_dispatcher,
                                                    context_parallel, context_parallel_unshard)
from dtensor.experimental._ring_attention import (_ContextParallelOptions, _cp_options,
                                                  _RotateMethod, set_rotate_method)

__all__ = ["_ContextParallelOptions", "_RotateMethod", "_cp_options",
           "_disable_context_parallel_dispatcher", "_enable_context_parallel_dispatcher",
           "context_parallel", "context_parallel_unshard", "set_rotate_method"]
