"""Seeding random ops on distributed tensors, under torch.distributed.tensor._random's
user-facing names (``manual_seed``, ``is_rng_supported_mesh``)."""

from dtensor import _C
from dtensor.device_mesh import _DEVICE_TYPES

__all__ = ["is_rng_supported_mesh", "manual_seed"]


def is_rng_supported_mesh(device_mesh):
    """Whether random ops on ``device_mesh`` are supported: True on every device type the
    engine runs meshes on. NOTE [random on CPU meshes]: PyTorch 2.11 answers False (with a
    warning) for a CPU mesh, where its DTensor random ops may not match one device; the
    engine draws a distributed tensor's random values as one device would on CPU and CUDA
    alike, so it answers True, and ``manual_seed`` seeds a CPU mesh's ranks too (PyTorch's
    only warns there)."""
    return device_mesh.device_type in _DEVICE_TYPES


def manual_seed(seed, device_mesh=None):
    """Seeds this rank's generator for random ops on distributed tensors (needed when ranks are
    threads; in a process per rank, torch.manual_seed does it). ``device_mesh``, as PyTorch's
    ``manual_seed(seed, device_mesh)``: it must hold the calling rank (RuntimeError otherwise);
    the seed is the rank's, for every mesh."""
    if device_mesh is not None and device_mesh.get_coordinate() is None:
        raise RuntimeError(
            "manual_seed requires the current rank to be a part of the device mesh otherwise "
            "DTensor RNG state on the rank will not be initialized and the behavior of DTensor "
            "random ops is undefined.")
    _C.seed_process_default(seed)  # torch.manual_seed, never amid another thread rank's draw
    _C.manual_seed(seed)
