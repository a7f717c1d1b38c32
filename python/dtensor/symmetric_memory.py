"""Symmetric memory: tensors every rank of a group addresses directly (PyTorch's
``torch.distributed._symmetric_memory``; NOTE [symmetric memory] in collectives/symmetric_memory.h).

    t = dtensor.symmetric_memory.empty(1024, dtype=torch.float32)
    handle = dtensor.symmetric_memory.rendezvous(t, group)   # collective on the group
    peer = handle.get_buffer((handle.rank + 1) % handle.world_size, [1024], torch.float32)
    handle.barrier()

``empty`` allocates in this rank's shared-memory segment (CPU); ``rendezvous`` maps every peer's
(each rank must allocate the same size) and returns the handle: ``rank``, ``world_size``,
``buffer_ptrs``, ``get_buffer(rank, sizes, dtype, storage_offset=0)``, ``barrier(channel=0)``,
``put_signal(dst_rank, channel=0)``, ``wait_signal(src_rank, channel=0)``. The engine's collectives
on the shm backend use symmetric tensors directly, without staging copies (NOTE [symmetric
collectives]): functional collectives, DTensor redistributes and torch.distributed on the "dtensor"
backend all gain from tensors allocated here. ``group`` takes every form the functional collectives
take (a name, ranks, a ProcessGroup, a DeviceMesh, (mesh, dim)).
"""

import torch

from dtensor import _C
from dtensor import _functional_collectives as _fc

__all__ = ["empty", "rendezvous", "is_symm_mem_tensor"]


def empty(*size, dtype=None, device=None):
    """An uninitialised tensor of ``size`` in symmetric memory (CPU only)."""
    if len(size) == 1 and isinstance(size[0], (list, tuple, torch.Size)):
        size = tuple(size[0])
    if device is not None and torch.device(device).type != "cpu":
        raise ValueError(f"dtensor.symmetric_memory.empty: device {device} is not supported: "
                         f"symmetric memory is host shared memory (CPU)")
    return _C.symmetric_empty(list(size), dtype or torch.get_default_dtype())


def rendezvous(tensor, group):
    """Collective on ``group``: maps every peer's buffer; returns the handle (the same one again
    for the same tensor)."""
    return _C.symmetric_rendezvous(tensor, _fc._group_name(group))


def is_symm_mem_tensor(tensor):
    """Whether ``tensor`` lies in memory from ``empty``."""
    return _C.is_symmetric(tensor)
