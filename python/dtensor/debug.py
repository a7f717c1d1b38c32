"""Debugging: CommDebugMode (counts collectives), visualize_sharding, cache statistics, explain."""

from dtensor import _C

__all__ = [
    "CommDebugMode",
    "explain",
    "fallback_counts",
    "propagation_cache_stats",
    "reset_fallback_counts",
    "set_propagation_cache_capacity",
    "visualize_sharding",
]

# Our collective kinds under the names PyTorch's CommDebugMode reports.
_NAMES = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather_into_tensor",
    "reduce_scatter": "reduce_scatter_tensor",
    "all_to_all": "all_to_all_single",
    "broadcast": "broadcast",
    "barrier": "barrier",
}


class CommDebugMode:
    """Counts the collectives this rank issues inside ``with CommDebugMode() as m:``.

    ``get_comm_counts()`` is keyed by collective name (``"all_reduce"``,
    ``"all_gather_into_tensor"``, ``"reduce_scatter_tensor"``, ``"all_to_all_single"``);
    ``get_comm_counts_by_op()`` by (ATen op that caused it, name).
    """

    def __init__(self):
        self._counter = None
        self._result = None

    def __enter__(self):
        self._counter = _C.CommCounter()
        self._result = None
        return self

    def __exit__(self, *exc):
        # Stop counting: later collectives belong to no block.
        self._result = self._snapshot()
        self._counter = None
        return False

    def _snapshot(self):
        c = self._counter
        if c is None:
            if self._result is None:
                raise RuntimeError("CommDebugMode: use it as a context manager first")
            return self._result
        return {
            "total": c.total(),
            "kinds": {_NAMES.get(k, k): n for k, n in c.kinds().items()},
            "by_op": dict(c.counts_by_cause()),
            "text": str(c),
        }

    def get_total_counts(self):
        return self._snapshot()["total"]

    def get_comm_counts(self):
        return dict(self._snapshot()["kinds"])

    def get_comm_counts_by_op(self):
        return dict(self._snapshot()["by_op"])

    def __str__(self):
        return self._snapshot()["text"]


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
