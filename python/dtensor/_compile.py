"""NOTE [distributed tensors under torch.compile]

A distributed tensor here is a C++ tensor without storage, not a Python subclass, so Dynamo
cannot trace it: making its fake copy reads the storage and failed with
``InternalTorchDynamoError: ... Cannot access storage of DTensorImpl``, so a tensor-parallel
model under ``torch.compile`` (torchtitan compiles each block after ``parallelize_module``)
did not run at all.

Decision: Dynamo meets a distributed tensor as it meets a sparse tensor, as a graph break.
Code that touches distributed tensors runs eagerly in the engine (each op sharded as without
compile); the code between, on plain tensors, is compiled. With TP's default
``use_local_output=True`` a block's norms, activations and attention math on the local pieces
compile, and the parallel linears run eagerly; a model that keeps distributed tensors
everywhere (``use_local_output=False``) runs as without compile. ``fullgraph=True`` raises
Dynamo's graph-break error with this explanation. This is not PyTorch's behaviour (its DTensor
is traced into the graph, collectives included); it is what this engine can promise without a
silent wrong answer: every result equals the eager engine's.

How: Dynamo wraps each tensor it reads (inputs, parameters, globals, results of calls that
ran eagerly) with ``VariableBuilder.wrap_tensor``; this module makes that raise Dynamo's own
graph break (``unimplemented``) for a distributed tensor. Importing Dynamo costs seconds, so
it is not imported here: the patch is applied when torch imports that module (a finder on
``sys.meta_path`` wraps its loader), or at once if it is already imported. torch 1.13 has no
Dynamo and nothing is patched. Dynamo's warning for each of the extension's functions it meets
("Dynamo does not know how to trace the builtin `dtensor._C...`, ... file an issue on GitHub")
is filtered out: those calls are graph breaks by design, still counted and logged by Dynamo
(``TORCH_LOGS=graph_breaks``).
"""

import importlib.abc
import importlib.util
import sys
import warnings

_BUILDER = "torch._dynamo.variables.builder"
_EXPLANATION = ("Distributed tensors of the dtensor engine are C++ tensors Dynamo cannot "
                "trace; code that touches them runs eagerly in the engine, the rest compiles "
                "(NOTE [distributed tensors under torch.compile])")


def _patch(builder):
    cls = builder.VariableBuilder
    if getattr(cls.wrap_tensor, "_dtensor_graph_break", False):
        return
    from torch._dynamo.exc import unimplemented

    from dtensor import _C

    wrap = cls.wrap_tensor

    def wrap_tensor(self, value):
        if _C.is_dtensor(value):
            source = getattr(self.source, "name", "a value")
            source = source() if callable(source) else source  # a method in older torch
            try:
                unimplemented(gb_type="dtensor: distributed tensor", context=str(source),
                              explanation=_EXPLANATION, hints=[])
            except TypeError:  # older torch: unimplemented(msg)
                unimplemented(f"dtensor: distributed tensor {source}: {_EXPLANATION}")
        return wrap(self, value)

    wrap_tensor._dtensor_graph_break = True
    cls.wrap_tensor = wrap_tensor


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _BUILDER:
            return None
        sys.meta_path.remove(self)  # once; and so that find_spec below finds torch's own
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader)
        return spec


def install():
    warnings.filterwarnings("ignore", message=r"Dynamo does not know how to trace the builtin "
                                              r"`dtensor\._C\.")
    if _BUILDER in sys.modules:
        _patch(sys.modules[_BUILDER])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
