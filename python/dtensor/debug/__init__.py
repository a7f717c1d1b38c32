"""Debugging: CommDebugMode (counts collectives), FlopCounterMode (counts FLOPs per rank),
visualize_sharding, cache statistics, explain."""

from dtensor import _C
from dtensor.debug._comm_mode import CommDebugMode
from dtensor.debug._flop_counter import FlopCounterMode

__all__ = [
    "CommDebugMode",
    "FlopCounterMode",
    "explain",
    "fallback_counts",
    "propagation_cache_stats",
    "reset_fallback_counts",
    "set_propagation_cache_capacity",
    "visualize_sharding",
]


def visualize_sharding(dtensor, header=""):
    """Prints which rank holds which block of ``dtensor``, once: on the rank at coordinate 0 of
    every mesh dim, as PyTorch (other ranks, and ranks outside the mesh, print nothing)."""
    coordinate = dtensor.device_mesh.get_coordinate()
    if coordinate is None or any(c != 0 for c in coordinate):
        return
    text = _C.visualize(dtensor)
    print((header + "\n" if header else "") + text)


def fallback_counts():
    """Calls per ATen op (by name) that ran by the replicate fallback: ops with no sharding rule,
    gathered to Replicate and computed whole on every rank (NOTE [replicate fallback])."""
    return dict(_C.fallback_counts())


def reset_fallback_counts():
    _C.reset_fallback_counts()


def propagation_cache_stats():
    """Hits, misses, size and capacity of the sharding propagation cache."""
    return _C.propagation_cache_stats()


def set_propagation_cache_capacity(capacity):
    _C.set_propagation_cache_capacity(capacity)


def explain(op, *args):
    """What dispatching ``op`` (e.g. ``"aten::mm"``) on ``args`` would do, without running it."""
    return _C.explain(op, list(args))
