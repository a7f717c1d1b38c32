"""dtensor: a native C++ DTensor engine with torch.distributed.tensor's Python API.

Change ``from torch.distributed.tensor import ...`` to ``from dtensor import ...``. Distributed
tensors are torch.Tensors: torch ops on them run in the C++ engine (sharding propagation,
planned redistributes, the local op) with no per-op Python.
"""

import os
import threading

import torch  # noqa: F401  (loads libtorch before the extension)

# From the source tree (PYTHONPATH=<repo>/python, what `./x pythonpath` prints) the extension is
# Bazel's output, not a file beside this one: look for it there too.
_built = os.path.join(os.path.dirname(__file__), "..", "..", "bazel-bin", "python", "dtensor")
if not any(f.startswith("_C") for f in os.listdir(os.path.dirname(__file__))) and os.path.isdir(
        _built):
    __path__.append(os.path.realpath(_built))  # noqa: F821  (the package's own __path__)

from dtensor import _C
from dtensor import _functional_collectives  # noqa: F401
from dtensor import debug  # noqa: F401
from dtensor._api import (
    DTensor,
    distribute_module,
    distribute_tensor,
    empty,
    full,
    ones,
    rand,
    randn,
    zeros,
)
from dtensor.device_mesh import DeviceMesh, init_device_mesh
from dtensor.placement_types import Partial, Placement, Replicate, Shard

__all__ = [
    "DTensor",
    "DeviceMesh",
    "Partial",
    "Placement",
    "Replicate",
    "Shard",
    "debug",
    "distribute_module",
    "distribute_tensor",
    "empty",
    "full",
    "init_device_mesh",
    "manual_seed",
    "ones",
    "rand",
    "randn",
    "replicate_plain_tensors",
    "run_threads",
    "strict_mode",
    "zeros",
]


def manual_seed(seed):
    """Seeds this rank's generator for random ops on distributed tensors (needed when ranks are
    threads; in a process per rank, torch.manual_seed does it)."""
    torch.manual_seed(seed)
    _C.manual_seed(seed)


class _Guard:
    def __init__(self, make, enabled):
        self._make, self._enabled, self._guard = make, enabled, None

    def __enter__(self):
        self._guard = self._make(self._enabled)
        return self

    def __exit__(self, *exc):
        self._guard = None
        return False


def strict_mode(enabled=True):
    """``with dtensor.strict_mode():`` an op needing an implicit redistribute raises instead,
    naming the redistribute to write."""
    return _Guard(_C.set_strict, enabled)


def replicate_plain_tensors(enabled=True):
    """``with dtensor.replicate_plain_tensors():`` plain tensors mixed with distributed ones are
    read as replicated (every rank must pass the same values)."""
    return _Guard(_C.replicate_plain_tensors, enabled)


def run_threads(world_size, fn, backend="threads"):
    """Simulation mode: runs ``fn(rank)`` for every rank as a thread of this process (collectives
    on the in-process ``threads`` backend); returns the results by rank, re-raises the first
    error."""
    contexts = _C.thread_contexts(world_size, backend)
    results, errors = [None] * world_size, [None] * world_size

    def body(rank):
        scope = _C.ThreadRank(contexts[rank])
        try:
            results[rank] = fn(rank)
        except BaseException as e:  # noqa: BLE001  (re-raised below)
            errors[rank] = e
        finally:
            del scope

    threads = [threading.Thread(target=body, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in errors:
        if e is not None:
            raise e
    return results
