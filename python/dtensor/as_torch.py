"""The opt-in that runs unmodified code written against torch's names on this engine.

``import dtensor.as_torch`` (or ``dtensor.as_torch.install()``) makes every module imported
afterwards that names PyTorch's DTensor API get this package's equivalents:

==========================================  =============================================
torch's module                              resolves to
==========================================  =============================================
``torch.distributed.tensor``                ``dtensor``
``torch.distributed.tensor.placement_types`` ``dtensor.placement_types``
``torch.distributed.tensor.parallel``       ``dtensor.parallel`` (``.api``, ``.style``, ``.loss``
                                            too)
``torch.distributed.tensor.debug``          ``dtensor.debug``
``torch.distributed.tensor.experimental``   ``dtensor.experimental``
``torch.distributed.tensor.device_mesh``    ``dtensor.device_mesh``
``torch.distributed.device_mesh``           ``dtensor.device_mesh``
``torch.distributed.fsdp``'s FSDP2 names    ``dtensor.fsdp``'s (``fully_shard``, ``FSDPModule``,
                                            ``MixedPrecisionPolicy``, ``CPUOffloadPolicy``,
                                            ``OffloadPolicy``, ``UnshardHandle``,
                                            ``register_fsdp_forward_method``,
                                            ``share_comm_ctx``)
``torch.distributed.DeviceMesh``,           ``dtensor.DeviceMesh``, ``dtensor.init_device_mesh``
``torch.distributed.init_device_mesh``
==========================================  =============================================

Both ``sys.modules`` entries and the attributes on the parent packages are swapped, so
``import torch.distributed.tensor as T``, ``from torch.distributed.tensor import Shard`` and
``torch.distributed.tensor.Shard`` all give the engine's names.

NOTE [torch names on the engine]
--------------------------------
What it cannot cover, by construction:

* Modules imported before the opt-in keep what they bound: ``from torch.distributed.tensor
  import DTensor`` run earlier holds PyTorch's class. That includes torch's own modules: torch
  imports ``torch.distributed.device_mesh`` with ``import torch.distributed`` (so
  ``torch.distributed.distributed_c10d`` and friends keep PyTorch's DeviceMesh), and the opt-in
  itself first imports PyTorch's ``torch.distributed.tensor`` and ``torch.distributed.fsdp`` so
  that their private modules (``torch.distributed.tensor._api``, ``._ops``, ``._dtensor_spec``,
  ``._redistribute``, ``torch.distributed.fsdp._fully_shard`` ...) are whole and consistent:
  they stay PyTorch's and keep PyTorch's classes. Distributed tensors of this engine are not
  PyTorch DTensors, so PyTorch's private helpers do not work on them.
* Private names (a dotted part starting with ``_``) under the aliased packages are torch's: a
  private module not imported yet is loaded from torch's files (it then sees the engine's
  public names). Public submodules the engine does not have (``torch.distributed.tensor.
  parallel.ddp``, ``.fsdp``, ``.input_reshard``) are loaded from torch's files too.
  ``import torch.distributed.tensor._api as m`` (the ``import ... as`` form of a name both
  have) gives the engine's ``dtensor._api``; ``from torch.distributed.tensor._api import X``
  gives torch's.
* Names PyTorch has and this engine does not raise ImportError / AttributeError as the
  engine's modules do, or stay PyTorch's (FSDP1's ``FullyShardedDataParallel``).
* ``torch.distributed._functional_collectives``, ``torch.distributed.checkpoint`` and
  ``torch.distributed._composable`` are not aliased (``dtensor.checkpoint`` is the engine's).
* Two private helpers get the engine's meaning (NOTE [private helpers for the engine's
  tensors]): ``torch.distributed.tensor._utils.compute_local_shape_and_global_offset`` on an
  engine mesh, and ``torch.Tensor._local_tensor`` on an engine tensor.

Processes: the opt-in is per process. ``python -m dtensor.as_torch script.py args`` (or
``-m module args``) opts in and runs the script as ``__main__``; it also sets
``DTENSOR_AS_TORCH=1`` in the environment. Children started by ``multiprocessing`` with the
``spawn`` method from an opted-in process opt in before they unpickle anything (their command
line imports ``dtensor.as_torch`` first); ``fork`` children inherit the opt-in.
``./x run --as-torch`` (or ``DTENSOR_AS_TORCH=1 ./x run``) starts every rank this way; under
torchrun: ``torchrun --nproc_per_node N -m dtensor.as_torch script.py``.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

__all__ = ["ALIASES", "FSDP_NAMES", "install", "installed", "main"]

# torch's module -> the engine's module it resolves to after install().
ALIASES = {
    "torch.distributed.tensor": "dtensor",
    "torch.distributed.tensor.placement_types": "dtensor.placement_types",
    "torch.distributed.tensor.parallel": "dtensor.parallel",
    "torch.distributed.tensor.parallel.style": "dtensor.parallel.style",
    "torch.distributed.tensor.parallel.api": "dtensor.parallel.api",
    "torch.distributed.tensor.parallel.loss": "dtensor.parallel.loss",
    "torch.distributed.tensor.debug": "dtensor.debug",
    "torch.distributed.tensor.experimental": "dtensor.experimental",
    "torch.distributed.tensor.device_mesh": "dtensor.device_mesh",
    "torch.distributed.device_mesh": "dtensor.device_mesh",
}

# torch.distributed.fsdp's FSDP2 names, set to dtensor.fsdp's (FSDP1's names stay PyTorch's).
FSDP_NAMES = ("fully_shard", "FSDPModule", "MixedPrecisionPolicy", "CPUOffloadPolicy",
              "OffloadPolicy", "UnshardHandle", "register_fsdp_forward_method", "share_comm_ctx")

# Public names on torch.distributed itself that torch binds from torch.distributed.device_mesh.
_DIST_NAMES = ("DeviceMesh", "init_device_mesh")

ENV = "DTENSOR_AS_TORCH"

_installed = False
_real_paths = {}  # aliased torch package -> its own (torch's) __path__


def installed():
    """Whether install() ran in this process."""
    return _installed


class _TorchFilesFinder(importlib.abc.MetaPathFinder):
    """Names under an aliased torch package that the engine does not have (private ones such as
    ``torch.distributed.tensor._utils``, or ``torch.distributed.tensor.parallel.ddp``) are found
    in torch's own files: the aliased parent's ``__path__`` is the engine's, where they are not.
    """

    def find_spec(self, fullname, path=None, target=None):
        parent, _, _ = fullname.rpartition(".")
        real = _real_paths.get(parent)
        if real is None or fullname in ALIASES:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, real)


def _engine_attr_collisions(torch_pkg, engine_mod):
    """torch's submodules of ``torch_pkg`` that are not imported yet and whose leaf name is an
    attribute of the engine module: loading one later would set it over the engine's attribute
    (the import system binds a submodule on its parent), so install() imports them first."""
    import pkgutil

    out = []
    for info in pkgutil.iter_modules(_real_paths.get(torch_pkg, [])):
        full = f"{torch_pkg}.{info.name}"
        if full in ALIASES or full in sys.modules:
            continue
        if hasattr(engine_mod, info.name):
            out.append(full)
    return out


def _multiprocessing_children_opt_in():
    """``multiprocessing``'s spawn children run ``python -c 'from multiprocessing.spawn import
    spawn_main; ...'``; with this their command line imports ``dtensor.as_torch`` first (before
    the parent's ``__main__`` and the pickled target are loaded), from the folder this package
    was loaded from."""
    from multiprocessing import spawn

    if getattr(spawn.get_command_line, "_dtensor_as_torch", False):
        return
    original = spawn.get_command_line
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    boot = (f"import sys; sys.path.append({here!r}) if {here!r} not in sys.path else None; "
            f"import dtensor.as_torch; ")

    def get_command_line(**kwds):
        cmd = list(original(**kwds))
        if "-c" in cmd:
            i = cmd.index("-c") + 1
            cmd[i] = boot + cmd[i]
        return cmd

    get_command_line._dtensor_as_torch = True
    spawn.get_command_line = get_command_line


# NOTE [private helpers for the engine's tensors]: two private pieces of PyTorch's DTensor that
# libraries built on it call (Hugging Face transformers' tp_plan loading calls both) are given
# the engine's meaning here, and only under the opt-in:
# * torch.distributed.tensor._utils.compute_local_shape_and_global_offset(shape, mesh,
#   placements): for an engine mesh, torch's own arithmetic runs on this rank's coordinate and
#   the placements translated to torch's classes (any other mesh goes to torch's function
#   unchanged). Modules that imported the function before the opt-in keep torch's.
# * torch.Tensor._local_tensor: on a distributed tensor of the engine, its local piece
#   (to_local()); on any other tensor AttributeError, as before.
def _torch_placement(p, torch_pt):
    from dtensor import placement_types as pt

    if isinstance(p, pt._StridedShard):
        return torch_pt._StridedShard(p.dim, split_factor=p.split_factor)
    if isinstance(p, pt.Shard):
        return torch_pt.Shard(p.dim)
    if isinstance(p, pt.Partial):
        return torch_pt.Partial(p.reduce_op)
    if isinstance(p, pt.Replicate):
        return torch_pt.Replicate()
    return p


def _give_private_helpers(torch_utils, torch_pt):
    import torch

    import dtensor
    from dtensor import _C

    original = torch_utils.compute_local_shape_and_global_offset
    if not getattr(original, "_dtensor_as_torch", False):
        def compute_local_shape_and_global_offset(global_shape, mesh, placements,
                                                  skip_offset=False):
            if not isinstance(mesh, dtensor.DeviceMesh):
                return original(global_shape, mesh, placements, skip_offset)
            coordinate = mesh.get_coordinate()
            if coordinate is None:
                return (0,), ()
            return torch_utils._compute_local_shape_and_global_offset(
                global_shape, mesh.shape, list(coordinate),
                [_torch_placement(p, torch_pt) for p in placements], skip_offset)

        compute_local_shape_and_global_offset._dtensor_as_torch = True
        compute_local_shape_and_global_offset.__doc__ = original.__doc__
        torch_utils.compute_local_shape_and_global_offset = compute_local_shape_and_global_offset

    if "_local_tensor" not in vars(torch.Tensor):
        def _local_tensor(self):
            if not _C.is_dtensor(self):
                raise AttributeError("'Tensor' object has no attribute '_local_tensor'")
            return self.to_local()

        torch.Tensor._local_tensor = property(_local_tensor)


def install():
    """Opts this process in (idempotent); see the module docstring for what it covers."""
    global _installed
    if _installed:
        return
    if sys.modules.get("torch.distributed.tensor") is not None and \
            sys.modules.get("torch.distributed.tensor") is sys.modules.get("dtensor"):
        _installed = True  # done by another copy of this module (``python -m``'s __main__)
        return
    import torch
    import torch.distributed as dist
    # torch's own DTensor and FSDP packages, whole, before their public names are swapped: their
    # private modules keep PyTorch's classes (NOTE [torch names on the engine]).
    import torch.distributed.tensor  # noqa: F401
    import torch.distributed.tensor._utils  # noqa: F401
    import torch.distributed.tensor.placement_types as torch_placements
    import torch.distributed.fsdp as torch_fsdp

    import dtensor
    import dtensor.fsdp as engine_fsdp
    for engine_name in ALIASES.values():
        importlib.import_module(engine_name)

    for torch_name in ALIASES:
        spec = sys.modules.get(torch_name)
        spec = getattr(spec, "__spec__", None) if spec is not None else None
        if spec is None:
            try:
                spec = importlib.util.find_spec(torch_name)
            except (ImportError, ValueError):
                spec = None
        if spec is not None and spec.submodule_search_locations is not None:
            _real_paths[torch_name] = list(spec.submodule_search_locations)

    for torch_name, engine_name in ALIASES.items():
        for full in _engine_attr_collisions(torch_name, sys.modules[engine_name]):
            importlib.import_module(full)

    # torch's submodules already imported under an aliased package (its private ones): bound on
    # the engine's package too, where the engine has no such name, so that `import
    # torch.distributed.tensor._utils as u` finds them as it does without the opt-in.
    loaded = [(name, mod) for name, mod in list(sys.modules.items())
              if name.rpartition(".")[0] in ALIASES and name not in ALIASES]
    # torch's own modules, for their private names (torch.distributed.checkpoint does `from
    # torch.distributed.tensor import _DTensorSpec`): looked up on the engine's module after the
    # swap, a private name the engine does not have is torch's.
    real_modules = {name: sys.modules[name] for name in ALIASES if name in sys.modules}
    for torch_name, engine_name in ALIASES.items():
        engine = sys.modules[engine_name]
        if torch_name in _real_paths and not hasattr(engine, "__path__"):
            # torch's is a package and the engine's a plain module: an empty __path__ lets the
            # import system ask _TorchFilesFinder for torch's submodules instead of failing with
            # "is not a package".
            engine.__path__ = []
        sys.modules[torch_name] = engine
        parent, _, leaf = torch_name.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], leaf, engine)

    for name, mod in loaded:
        parent, _, leaf = name.rpartition(".")
        engine = sys.modules[ALIASES[parent]]
        if mod is not None and not hasattr(engine, leaf):
            setattr(engine, leaf, mod)
    for torch_name, real in real_modules.items():
        engine = sys.modules[ALIASES[torch_name]]
        if real is engine:
            continue
        for attr, value in list(vars(real).items()):
            if attr.startswith("_") and not attr.startswith("__") and not hasattr(engine, attr):
                setattr(engine, attr, value)

    for name in FSDP_NAMES:
        setattr(torch_fsdp, name, getattr(engine_fsdp, name))
    for name in _DIST_NAMES:
        setattr(dist, name, getattr(dtensor, name))

    _give_private_helpers(sys.modules["torch.distributed.tensor._utils"], torch_placements)

    if not any(isinstance(f, _TorchFilesFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TorchFilesFinder())
    _multiprocessing_children_opt_in()
    os.environ[ENV] = "1"
    _installed = True
    del torch


def main(argv=None):
    """``python -m dtensor.as_torch script.py args`` / ``python -m dtensor.as_torch -m module
    args``: opts in, then runs the script (or module) as ``__main__`` with ``sys.argv`` as it
    would see it."""
    import runpy

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m dtensor.as_torch script.py [args...]\n"
              "       python -m dtensor.as_torch -m module [args...]\n"
              "Runs the script with torch.distributed.tensor's names resolving to the dtensor "
              "engine's (NOTE [torch names on the engine]).", file=sys.stderr)
        return 0 if argv else 2
    install()
    if argv[0] == "-m":
        if len(argv) < 2:
            print("python -m dtensor.as_torch -m: a module name is needed", file=sys.stderr)
            return 2
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        script_dir = os.path.dirname(os.path.abspath(argv[0]))
        if not sys.flags.safe_path and script_dir not in sys.path:
            sys.path.insert(0, script_dir)  # as `python script.py` does
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    # ``python -m dtensor.as_torch``: this file runs as __main__; the importable module
    # dtensor.as_torch is the one that installs (one set of state per process).
    from dtensor import as_torch as _module
    sys.exit(_module.main())
else:
    # The module is the opt-in: importing it installs.
    install()
