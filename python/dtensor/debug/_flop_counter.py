"""FlopCounterMode: torch.utils.flop_counter.FlopCounterMode's API (PyTorch 2.x; torch 1.13 has
none) for distributed and plain tensors.

NOTE [FLOP counter] (dtensor/flop_counter.h): the count is deterministic, from shapes only. On
distributed tensors the engine's dispatch kernel counts the op on this rank's local pieces (their
shapes after any redistribute), so the figure is what this rank computes; on plain tensors this
TorchDispatchMode counts each ATen call with the same formula (``dtensor._C.op_flops``: the op
table's entry and rule, as the propagator prices compute, NOTE [compute in the cost model]). A
single-process run and a rank's share are therefore counted alike. Counted: the matmul family (2
x the product of its factor sizes: mm, addmm, bmm, baddbmm, mv, addmv, dot, ...) and elementwise
ops (one per output element; PyTorch's counter leaves those out, so compare matmul ops by name).
Counts are kept under "Global" (no per-module breakdown; ``mods`` and ``depth`` are accepted for
PyTorch's signature). A counter belongs to the thread that enters it: with ranks as threads each
rank counts its own.
"""

import collections

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from dtensor import _C

__all__ = ["FlopCounterMode"]


def _cpp_name(func):
    schema = func._schema
    return schema.name + ("." + schema.overload_name if schema.overload_name else "")


def _packet(cpp_name):
    """The OpOverloadPacket (torch.ops.aten.mm) of "aten::mm" / "aten::add.Tensor"."""
    ns, rest = cpp_name.split("::", 1)
    return getattr(getattr(torch.ops, ns), rest.split(".", 1)[0])


class FlopCounterMode(TorchDispatchMode):
    """Counts FLOPs while active::

        with FlopCounterMode(display=False) as counter:
            model(x).sum().backward()
        counter.get_total_flops(); counter.get_flop_counts()["Global"][torch.ops.aten.mm]
    """

    def __init__(self, mods=None, depth=2, display=True, custom_mapping=None):
        super().__init__()
        if custom_mapping:
            raise NotImplementedError("FlopCounterMode: custom_mapping is not supported; the "
                                      "engine's op table gives every op's FLOPs")
        self.depth = depth
        self.display = display
        self._plain = collections.Counter()  # cpp name -> FLOPs on plain tensors
        self._engine = collections.Counter()  # cpp name -> FLOPs of finished engine counters
        self._counter = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        flat, _ = tree_flatten((args, {k: v for k, v in kwargs.items() if k != "out"}))
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        # Distributed tensors are counted by the engine on their local pieces.
        if tensors and not any(_C.is_dtensor(t) for t in tensors):
            flops = _C.op_flops(_cpp_name(func), tensors)
            if flops:
                self._plain[_cpp_name(func)] += int(flops)
        return out

    def __enter__(self):
        self._plain.clear()
        self._engine.clear()
        self._counter = _C.FlopCounter()
        return super().__enter__()

    def __exit__(self, *exc):
        result = super().__exit__(*exc)
        self._counter.stop()
        self._engine.update({k: int(v) for k, v in self._counter.by_op().items()})
        self._counter = None
        if self.display:
            print(self.get_table())
        return result

    def _by_name(self):
        counts = collections.Counter(self._plain)
        counts.update(self._engine)
        if self._counter is not None:  # still counting
            counts.update({k: int(v) for k, v in self._counter.by_op().items()})
        return counts

    def get_total_flops(self):
        return sum(self._by_name().values())

    def get_flop_counts(self):
        """{"Global": {torch.ops.aten.mm: FLOPs, ...}} as PyTorch's (no per-module entries)."""
        return {"Global": {_packet(name): n for name, n in sorted(self._by_name().items())}}

    def get_table(self, depth=None):
        rows = [f"{'Module':<10} {'FLOP':>16}", f"{'Global':<10} {self.get_total_flops():>16,}"]
        for name, n in sorted(self._by_name().items()):
            rows.append(f"  {name[6:] if name.startswith('aten::') else name:<8} {n:>16,}")
        return "\n".join(rows)
