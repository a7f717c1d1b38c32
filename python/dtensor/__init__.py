"""dtensor: a native C++ DTensor engine with torch.distributed.tensor's Python API.

Change ``from torch.distributed.tensor import ...`` to ``from dtensor import ...``. Distributed
tensors are torch.Tensors: torch ops on them run in the C++ engine (sharding propagation,
planned redistributes, the local op) with no per-op Python.

Where the package comes from
----------------------------
Only from its staged folder: ``eval "$(./x pythonpath)"`` (or ``./x run``) builds the extension
and lays the package out in ``out/python`` (``out/python-opt`` with ``--opt``), the extension
``dtensor/_C.so`` beside these files; Bazel's py_test targets get the same layout from their
runfiles. The package never looks into Bazel's output folders (``bazel-bin``, ``bazel-out``).

Global changes to torch made by importing ``dtensor``
-----------------------------------------------------
A distributed tensor is a plain ``torch.Tensor`` object (its C++ TensorImpl holds the local
piece and the layout), not a Python subclass, so the DTensor API has to live on
``torch.Tensor`` itself. Plain tensors behave as before: the added names raise on them, the
wrapped ones fall through to torch's own. Removing any of these would change the API
(torch.distributed.tensor's names), so they stay; all are set in ``dtensor/_api.py``:

- ``torch.Tensor.to_local`` (method): ``DTensor.to_local``, this rank's piece, differentiable.
  Reason: distributed tensors are of type ``torch.Tensor``; there is no subclass to carry it.
- ``torch.Tensor.full_tensor`` (method): ``DTensor.full_tensor``, the global tensor on every
  rank. Same reason.
- ``torch.Tensor.redistribute`` (method): ``DTensor.redistribute``, a new layout on the same
  mesh. Same reason.
- ``torch.Tensor.placements`` (property): ``DTensor.placements``. Same reason. On a plain
  tensor it raises AttributeError, so ``hasattr(t, "placements")`` stays False.
- ``torch.Tensor.device_mesh`` (property): ``DTensor.device_mesh``. Same reason, and the same
  AttributeError on a plain tensor.
- ``torch.Tensor.__repr__``: a distributed tensor prints PyTorch's DTensor repr,
  ``DTensor(local_tensor=..., device_mesh=..., placements=(...))``; plain tensors go to torch's
  own ``__repr__`` unchanged. Reason: torch's printer runs data ops on the tensor (e.g.
  ``masked_select``) that have no sharding rule, so ``print(dtensor)`` would raise; PyTorch's
  DTensor prints its own repr too.
- ``torch.nn.Parameter.__new__``: wraps torch's own; when the data is a distributed tensor with
  ``requires_grad``, the new parameter keeps its gradient in the parameter's placements
  (``_C.keep_grad_layout``: a replicated weight used with a batch-sharded input gets its Partial
  gradient reduced before accumulation, as ``distribute_tensor``'s leaves do). Plain
  parameters are built exactly as before. Reason: ``nn.Parameter(dtensor)`` is how modules and
  ``dtensor.parallel`` make distributed parameters, and the gradient layout must be fixed when
  the parameter is made.
- ``torch.Tensor.__deepcopy__``: a distributed tensor is deep-copied as a clone of every rank's
  piece in the same layout (with its ``requires_grad`` and a copy of its ``grad``); plain tensors
  go to torch's own. Reason: torch 1.13 deep-copies through the tensor's storage, which a
  distributed tensor has none of, so ``copy.deepcopy(model)`` and
  ``optimizer.load_state_dict`` (which deep-copies the state) raised on distributed state.

- ``torch.Tensor.__reduce_ex__``: a distributed tensor pickles (``pickle``, ``torch.save``) as its
  local piece and its spec (mesh, placements, global shape and stride), and unpickles on the same
  rank of the same job; plain tensors go to torch's own. Reason: torch pickles a tensor through
  its storage, which a distributed tensor has none of; PyTorch's DTensor pickles. The rebuild
  function, DeviceMesh and the placement classes are also added to
  ``torch.serialization.add_safe_globals`` (the documented allowlist), so that ``torch.load``'s
  default ``weights_only=True`` loads them, as it loads PyTorch's DTensors.

- ``torch.distributed.Backend.DTENSOR``: the backend name "dtensor", registered through
  ``Backend.register_backend`` (PyTorch's API for third-party backends), so that
  ``init_process_group(backend="dtensor")`` runs torch.distributed's collectives on the engine
  (``dtensor/_c10d_backend.py``). Reason: it is the documented way to plug in; nothing of torch's
  own backends changes.
- ``torch._dynamo.variables.builder.VariableBuilder.wrap_tensor``: wraps Dynamo's own; a
  distributed tensor is a graph break (it runs eagerly in the engine), plain tensors are wrapped
  as before. Patched when torch imports that module (a finder on ``sys.meta_path``), so importing
  ``dtensor`` does not import Dynamo. Reason: Dynamo cannot trace these C++ tensors and failed
  on them; NOTE [distributed tensors under torch.compile] in ``dtensor/_compile.py``. With it, a
  ``warnings`` filter drops Dynamo's warning for the extension's own functions (graph breaks by
  design) and only that one.

Loading the extension ``dtensor._C`` also registers, in torch's C++ dispatcher (not Python
attributes, listed for completeness): a boxed fallback kernel on the ``PrivateUse1`` dispatch
key plus explicit ``aten`` kernels at that key for the ops with CompositeExplicitAutograd
kernels (only tensors made by this package carry that key; the engine's dispatch), a
fallthrough on ``AutogradPrivateUse1`` for ops with no autograd kernel (custom ops reach the
engine, as ATen's own fallthrough does for AutogradCPU), and the operator namespace
``torch.ops.dtensor_c10d`` (the functional collectives). ``DTensor`` (an
``isinstance`` check over ``torch.Tensor``) and ``AsyncCollectiveTensor`` are subclasses, not
patches.
"""

import os
import threading

import torch  # noqa: F401  (loads libtorch before the extension)

try:
    from dtensor import _C
except ImportError as e:
    _dir = __path__[0]  # noqa: F821  (the package's own __path__)
    _why = (f"{_dir} has no built extension _C.so"
            if not any(f.startswith("_C") for f in os.listdir(_dir)) else f"{e}")
    raise ImportError(
        f"dtensor: cannot import the extension dtensor._C ({_why}). Import the package from its "
        f"staged folder, where the built _C.so lies beside it, not from python/ in the source "
        f"tree: run `eval \"$(./x pythonpath)\"` in the repository, or start the script with "
        f"`./x run script.py`."
    ) from e

from dtensor import _c10d_backend
from dtensor import _compile
from dtensor import _functional_collectives  # noqa: F401
from dtensor import checkpoint  # noqa: F401
from dtensor import debug  # noqa: F401
from dtensor import random  # noqa: F401
from dtensor import symmetric_memory  # noqa: F401
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
from dtensor.random import manual_seed

_c10d_backend.register()  # torch.distributed's backend "dtensor" (NOTE [dtensor c10d backend])
_compile.install()  # NOTE [distributed tensors under torch.compile]

__all__ = [
    "DTensor",
    "DeviceMesh",
    "Partial",
    "Placement",
    "Replicate",
    "Shard",
    "checkpoint",
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
    naming the redistribute to write, and an op with no sharding rule raises instead of running
    by the replicate fallback."""
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
            # Peers waiting for this rank fail now, not at the timeout (NOTE [leaving a group]).
            first = str(e).split("\n", 1)[0]
            contexts[rank].leave(f"{type(e).__name__}: {first}")
        finally:
            del scope

    # One name for every rank's thread: collectives compare the issuing thread's name across
    # ranks (NOTE [issuing thread] in collectives/communicator.h).
    threads = [threading.Thread(target=body, args=(r,), name="dtensor-rank")
               for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for e in errors:
        if e is not None:
            raise e
    return results
