"""fully_shard and FSDPModule: PyTorch's FSDP2 API over the dtensor engine.

NOTE [fully_shard]
==================
What is implemented (PyTorch's names and meanings):

* ``fully_shard(module, mesh=, reshard_after_forward=, shard_placement_fn=, mp_policy=,
  offload_policy=, ignored_params=)``, called on submodules, then the root. Each call makes one
  parameter group: the parameters of the module's subtree not managed by an inner call (nor in
  ``ignored_params``). They become ``nn.Parameter(distributed tensor)`` placed ``Shard(0)`` (or
  ``shard_placement_fn``'s ``Shard(d)``) on a 1-D mesh and ``(Replicate(), Shard(0))`` on a 2-D
  mesh (HSDP: shard on the last mesh dim, replicate on the first), with torch.chunk's uneven and
  empty pieces. The module's class becomes ``FSDP<Class>`` (FSDPModule first in the MRO). A
  list of modules makes one group of them all (torchtitan's ``[norm, output]``; NOTE
  [fully_shard on a list]); ``register_fsdp_forward_method`` runs FSDP's forward hooks around
  another method (``generate``).
* Forward pre-hook: one all-gather per group (``_param_group.py``'s flat buffer, in
  ``param_dtype``) fills plain unsharded ``nn.Parameter``s of the full shape, registered on the
  modules for compute; the forward runs on plain tensors (no per-op distributed dispatch).
  Post-forward: reshard when ``reshard_after_forward`` (free the unsharded storage, register the
  sharded parameters). A hook on the outputs' gradients all-gathers again before the group's
  backward if resharded; after the group's backward (an autograd function on the inputs that
  require grad, else the root's end-of-backward callback) one reduce-scatter (sum) of the
  unsharded gradients, plus one all-reduce (sum) over the replicate dim for HSDP, divided by the
  data-parallel size (``set_gradient_divide_factor`` overrides), gives ``param.grad``: a
  distributed tensor in the parameter's placements and dtype, accumulated into an existing one.
* ``reshard_after_forward=k`` (an int dividing the shard group's size): after forward each rank
  keeps 1/k of the group's parameters and backward all-gathers over k ranks (NOTE [reshard after
  forward to a smaller group] in ``_param_group.py``); 1 is False and the group's size True.
* Root: the first FSDP module to run forward. ``reshard_after_forward=None`` (the default) is
  True for non-root groups and False for the root, as PyTorch (the root's parameters would be
  all-gathered again at once for backward); an explicit True/False holds for the root too.
* ``FSDPModule``: ``unshard(async_op)`` (a handle with ``wait()``), ``reshard()``,
  ``set_requires_gradient_sync`` (unsharded gradients accumulate, in the reduce dtype, until a
  backward with sync reduces them together), ``set_requires_all_reduce`` (HSDP: reduce-scatter
  each backward, all-reduce across replicas later; NOTE [HSDP accumulation without
  all-reduce]), ``set_reshard_after_forward``,
  ``set_reshard_after_backward``, ``set_gradient_divide_factor`` (this module's group only, as
  PyTorch), ``set_unshard_in_backward``, ``set_all_reduce_hook`` (runs on the reduced sums,
  before the division), ``set_is_last_backward``, ``set_modules_to_forward_prefetch`` /
  ``set_modules_to_backward_prefetch`` (explicit prefetch: the targets' all-gathers are issued
  asynchronously after this module's own unshard and copied out at their pre-forward /
  pre-backward). Without an explicit backward list, PyTorch's implicit backward prefetch: the
  group that ran post-forward before this one is all-gathered at this one's pre-backward (NOTE
  [implicit backward prefetch]).
* ``state_dict()`` returns the sharded distributed tensors with no communication (a pre-hook
  registers the sharded parameters first, as PyTorch's); ``load_state_dict`` copies into them,
  and with ``assign=True`` the parameters it registers become FSDP's (a post-hook; a state dict
  of another layout is refused naming the parameter). Dtypes changed after ``fully_shard``
  (``model.double()``) are read at the first forward, as PyTorch's lazy init does.
* A module that runs several times before one backward is all-gathered again for each use's
  backward after the previous one resharded it (the group's state decides, as PyTorch's), and
  its gradients from every use are reduced and summed. Hooks registered with
  ``register_post_accumulate_grad_hook`` on sharded parameters run once their reduced gradient
  is set (optimizer in backward), as PyTorch's.
* Activation checkpointing (NOTE [activation checkpointing]): ``checkpoint_wrapper`` under
  ``fully_shard`` (torchtitan's order) and ``torch.utils.checkpoint`` around an FSDP module,
  non-reentrant (early stop on or off) or reentrant, train as without it and make the same
  collectives: a recomputed forward uses the parameters its pre-backward unsharded, and a
  forward run inside backward does not reshard before its own backward.
* ``torch.compile`` of FSDP modules (``block.compile()`` per block, as torchtitan, and of the
  whole model): FSDP's hooks run eagerly around the compiled forwards (NOTE [FSDP hooks under
  torch.compile]), as PyTorch's by default.
* FSDP over TP (NOTE [FSDP over TP] in ``_fsdp_param.py``): parameters that
  ``parallelize_module`` distributed on the "tp" dims of a mesh are sharded again on its "dp"
  dims; sharded parameters live on the (dp, tp) mesh with PyTorch's placements.
* The runtime's per-step work per parameter is C++ (NOTE [FSDP runtime in C++] in
  fsdp/flat_params.h): per group and dtype one call copies the pieces into one flat buffer and
  issues the all-gather, one call copies every parameter out of its result, one call builds the
  reduce-scatter input and issues it, and one gives the gradient pieces as views of its result
  (NOTE [FSDP flat buffers]; symmetric memory on the shm backend, NOTE [FSDP buffers in
  symmetric memory] in ``_param_group.py``). Python keeps the hooks and the state machine, as
  PyTorch's FSDP2 does over its C++ copy-in / copy-out ops.
* ``MixedPrecisionPolicy``: unsharded parameters in ``param_dtype``, forward inputs cast to it
  (``cast_forward_inputs``), outputs cast to ``output_dtype``, gradients reduced in
  ``reduce_dtype`` (default ``param_dtype``), sharded parameters and gradients in the original
  dtype.

Not implemented yet:

* Separate CUDA streams for communication (PyTorch's all-gather and reduce-scatter streams): on
  a CUDA mesh the engine's NCCL calls run on the issuing thread's current stream (NOTE [nccl
  stream order]), so they are ordered with compute instead of overlapping it. On CPU meshes the
  asynchronous collectives (prefetched all-gathers, reduce-scatters in flight) run on the
  group's worker thread beside compute.
* All-gather extensions (``fsdp_pre_all_gather``), custom all-gather / reduce-scatter comms;
  ``set_all_reduce_hook``'s ``stream`` belongs to the CUDA streams above (``share_comm_ctx``,
  ``set_post_optim_event`` and ``set_allocate_memory_from_process_group_for_comm`` are accepted:
  with every collective on the current stream, what they ask for holds already).

Decisions where PyTorch is silent or its mechanism is CUDA-specific:

* ``CPUOffloadPolicy`` (NOTE [CPU offload] in ``_fsdp_param.py``): on a CUDA mesh the sharded
  parameters and gradients are on the CPU (pinned when ``pin_memory``), on the mesh's CPU twin
  rather than on the CUDA mesh with CPU local tensors as PyTorch's; the all-gather copies each
  piece in from the CPU and the reduced gradient pieces are copied back. On a CPU mesh the
  sharded state is on the CPU already (nothing moves).
* Reductions are sums followed by a division by the factor (PyTorch may use ReduceOp.AVG or
  NCCL's PreMulSum); in float32 the results equal one process's mean to rounding.
* The unsharded parameter keeps one storage object for its lifetime: freed with
  ``untyped_storage().resize_(0)`` at reshard and refilled in place at unshard under
  ``torch.autograd._unsafe_preserve_version_counter``, PyTorch's own mechanism, so tensors saved
  for backward in an earlier forward see the refilled data.
* ``mesh=None``: the current mesh (``with mesh:``), else a 1-D CPU mesh over the world.
* A 0-dim parameter (a temperature), which PyTorch cannot chunk, stays whole on every rank,
  placed ``Replicate()``, its gradient averaged; a dim of size 1 is ``Shard`` as in PyTorch (rank 0
  holds it: NOTE [size-1 dims under FSDP] in ``_fsdp_param.py``).
* A group whose parameters have several dtypes (or compute / reduce dtypes) works: one
  all-gather and one reduce-scatter per dtype (NOTE [mixed dtypes in a group]); PyTorch refuses
  such a group (pytorch/pytorch#156784).
* Every collective of a group names its module (NOTE [collective purpose]): ranks that run
  different modules (an expert skipped on one rank, or another order) fail on every rank with
  an error naming both modules; PyTorch hangs (pytorch/pytorch#158719).
"""

import functools
import warnings

import torch
from torch import nn

from dtensor import _C
from dtensor._api import DTensor
from dtensor.device_mesh import DeviceMesh, _mesh_resources, init_device_mesh
from dtensor.fsdp._api import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
from dtensor.fsdp._fsdp_param import FSDPParam
from dtensor.fsdp._fsdp_state import _STATE_ATTR, FSDPState, _state_of
from dtensor.fsdp._param_group import FSDPParamGroup
from dtensor.placement_types import Shard

__all__ = ["FSDPModule", "UnshardHandle", "fully_shard", "register_fsdp_forward_method",
           "share_comm_ctx"]


def _default_mesh():
    if _mesh_resources.mesh_stack:
        return _mesh_resources.mesh_stack[-1]
    # As PyTorch: the accelerator's device type where there is one.
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    return init_device_mesh(device_type, (_C.group_size("world"),))


def _managed_modules(module):
    """The module and its submodules, not descending into modules with fully_shard applied."""
    out, seen = [], set()

    def visit(m):
        if m in seen or (m is not module and _state_of(m) is not None):
            return
        seen.add(m)
        out.append(m)
        for child in m.children():
            visit(child)

    visit(module)
    return out


def fully_shard(module, *, mesh=None, reshard_after_forward=None, shard_placement_fn=None,
                mp_policy=MixedPrecisionPolicy(), offload_policy=OffloadPolicy(),
                ignored_params=None):
    """Shards the parameters of ``module`` (one module, or a list of modules that then share one
    group: NOTE [fully_shard on a list]) not managed by an inner ``fully_shard`` across ``mesh``
    and installs the hooks of NOTE [fully_shard]; returns ``module``, whose class (each
    module's) now also derives from ``FSDPModule``."""
    modules = list(module) if isinstance(module, (list, tuple)) else [module]
    for m in modules:
        if isinstance(m, (nn.ModuleList, nn.ModuleDict)):
            raise ValueError(f"fully_shard does not support containers that do not implement "
                             f"forward ({type(m).__name__}): pass its modules, or a list of "
                             f"them to group them")
        if not isinstance(m, nn.Module):
            raise ValueError(f"fully_shard: expects a module or a list of modules, got "
                             f"{type(m).__name__}")
        if _state_of(m) is not None:
            raise RuntimeError("fully_shard has already been applied to this module")
    if not modules or len(set(map(id, modules))) != len(modules):
        raise ValueError("fully_shard: expects a non-empty list of distinct modules")
    mesh = mesh if mesh is not None else _default_mesh()
    if not isinstance(mesh, DeviceMesh) or mesh.ndim not in (1, 2):
        raise ValueError(f"fully_shard: expects a 1-D mesh (FSDP) or a 2-D mesh (HSDP), got "
                         f"{mesh}")
    reshard_after_forward = _post_forward_setting(reshard_after_forward,
                                                  mesh.size(mesh.ndim - 1))
    # NOTE [CPU offload] in _fsdp_param.py (on a CPU mesh nothing moves).
    offload = offload_policy if isinstance(offload_policy, CPUOffloadPolicy) else None
    ignored = set(ignored_params or ())
    uses, order, managed = {}, [], []
    for root in modules:
        managed += [m for m in _managed_modules(root) if m not in managed]
    for m in managed:
        for name, p in m.named_parameters(recurse=False):
            if p in ignored:
                continue
            if p not in uses:
                uses[p] = []
                order.append(p)
            uses[p].append((m, name))
    if not isinstance(reshard_after_forward, (bool, type(None))) and any(
            isinstance(p, DTensor) for p in order):
        raise NotImplementedError("fully_shard: reshard_after_forward as an int with "
                                  "parameters already distributed (FSDP over TP) is not "
                                  "supported (PyTorch's FSDP2 refuses it too)")
    fsdp_params = []
    for p in order:
        placement = shard_placement_fn(p) if shard_placement_fn is not None else None
        placement = placement if placement is not None else Shard(0)
        if not isinstance(placement, Shard):
            raise ValueError(f"fully_shard: shard_placement_fn must return Shard(d) or None, "
                             f"got {placement}")
        fsdp_params.append(FSDPParam(p, uses[p], mesh, placement.dim, offload))
    group = None
    if fsdp_params:
        group = FSDPParamGroup(fsdp_params, mesh,
                               True if reshard_after_forward is None else reshard_after_forward,
                               mp_policy)
        # Until the root names it (lazy_init).
        group.name = ", ".join(type(m).__name__ for m in modules)
    state = FSDPState(modules, group, mp_policy, reshard_after_forward is None,
                      torch.device(mesh._mesh.local_device()))
    for m in modules:
        m.__dict__[_STATE_ATTR] = state
        m.__class__ = _fsdp_class(m.__class__)
    return module


def _post_forward_setting(value, shard_size):
    """``reshard_after_forward`` as PyTorch's reads it: None or a bool as given; an int k must
    divide the shard group's size S, and reshards to k ranks after forward (NOTE [reshard after
    forward to a smaller group] in _param_group.py), 1 meaning False and S meaning True."""
    if value is None or isinstance(value, bool):
        return value
    if not isinstance(value, int):
        raise ValueError(f"reshard_after_forward should be a bool or an int representing the "
                         f"group size to reshard to, not {value!r}")
    if value < 1 or value > shard_size or shard_size % value != 0:
        raise ValueError(f"If passing reshard_after_forward as an int, it should be a factor "
                         f"of {shard_size}, not {value}")
    if value == 1:
        warnings.warn("reshard_after_forward=1 (int) means resharding parameters to world "
                      "size 1, instead of reshard_after_forward=True (bool)", stacklevel=3)
        return False
    return True if value == shard_size else value


@functools.lru_cache(maxsize=None)
def _fsdp_class(cls):
    """``FSDP<Class>``: FSDPModule ahead of the module's own class in the MRO, as PyTorch."""
    return type(f"FSDP{cls.__name__}", (FSDPModule, cls), {"_orig_cls": cls})


class UnshardHandle:
    """Returned by ``FSDPModule.unshard(async_op=True)``; ``wait()`` completes the unshard."""

    def __init__(self, group):
        self._group = group

    def wait(self):
        if self._group is not None:
            self._group.wait_for_unshard()
            self._group = None


class FSDPModule:
    """The methods a module gains from ``fully_shard`` (PyTorch's)."""

    def __new__(cls, *args, **kwargs):
        # Constructing an FSDP class (e.g. nn.Sequential slicing) builds the original class.
        orig = cls.__mro__[2]
        self = orig.__new__(orig, *args, **kwargs)
        self.__init__(*args, **kwargs)
        return self

    def _fsdp_state(self):
        return _state_of(self)

    def _fsdp_states(self, recurse):
        """The states of this module (and its submodules), each once (a list shares one)."""
        modules = self.modules() if recurse else [self]
        states = [s for s in (_state_of(m) for m in modules) if s is not None]
        return list({id(s): s for s in states}.values())

    def reshard(self):
        """Frees the unsharded parameters and registers the sharded ones (not recursive)."""
        group = self._fsdp_state().group
        if group is not None:
            group.reshard()

    def unshard(self, async_op=False):
        """All-gathers this module's parameters (not recursive); with ``async_op`` returns a
        handle whose ``wait()`` completes it (else the next pre-forward does)."""
        group = self._fsdp_state().group
        if group is not None:
            group.lazy_init()
            group.unshard(async_op=async_op)
        handle = UnshardHandle(group)
        if async_op:
            return handle
        handle.wait()
        return None

    def set_is_last_backward(self, is_last_backward):
        self._fsdp_state().ctx.is_last_backward = is_last_backward

    def set_requires_gradient_sync(self, requires_gradient_sync, *, recurse=True):
        """False: backward keeps unsharded gradients (no communication) until a backward with
        sync reduces them with its own."""
        for s in self._fsdp_states(recurse):
            if s.group is not None:
                s.group.reduce_grads = requires_gradient_sync
                s.group.all_reduce_grads = requires_gradient_sync  # as PyTorch's

    def set_requires_all_reduce(self, requires_all_reduce, *, recurse=True):
        """HSDP: False reduce-scatters each backward's gradients over the shard dim but defers
        the all-reduce across replicas (and the sharded gradients) to a backward with it on
        (NOTE [HSDP accumulation without all-reduce] in _param_group.py). No effect on a 1-D
        mesh."""
        for s in self._fsdp_states(recurse):
            if s.group is not None:
                s.group.all_reduce_grads = requires_all_reduce

    def set_reshard_after_forward(self, reshard_after_forward, recurse=True):
        if not isinstance(reshard_after_forward, bool):
            raise ValueError(f"reshard_after_forward should be a bool, got "
                             f"{type(reshard_after_forward)}")
        for s in self._fsdp_states(recurse):
            s.auto_reshard_after_forward = False
            if s.group is not None:
                s.group.reshard_after_forward = reshard_after_forward

    def set_reshard_after_backward(self, reshard_after_backward, *, recurse=True):
        for s in self._fsdp_states(recurse):
            if s.group is not None:
                s.group.reshard_after_backward = reshard_after_backward

    def set_gradient_divide_factor(self, factor):
        """Gradients of this module's group are divided by ``factor`` instead of the
        data-parallel size."""
        group = self._fsdp_state().group
        if group is not None:
            group.gradient_divide_factor = factor

    def set_reduce_scatter_divide_factor(self, factor):
        """PyTorch's former name of set_gradient_divide_factor (deprecated there too)."""
        warnings.warn("set_reduce_scatter_divide_factor is deprecated: use "
                      "set_gradient_divide_factor", FutureWarning, stacklevel=2)
        self.set_gradient_divide_factor(factor)

    def set_force_sum_reduction_for_comms(self, enable):
        """Accepted for PyTorch's API: the engine's reductions are always sums followed by one
        division (NOTE [fully_shard]'s decisions), which is what True asks for."""

    def set_unshard_in_backward(self, unshard_in_backward):
        """False: this module's parameters are not all-gathered for backward (nor prefetched),
        for modules whose backward does not read them (an embedding), as PyTorch's; their
        gradients are reduce-scattered as usual."""
        group = self._fsdp_state().group
        if group is not None:
            group.unshard_in_backward = unshard_in_backward

    def set_all_reduce_hook(self, hook, *, stream=None):
        """``hook(output)`` runs on each reduced gradient buffer of this module's group (the
        reduce-scatter's output, after HSDP's all-reduce across replicas), before the division
        and before the sharded gradients are set; changes in place carry into them (a custom
        all-reduce across replicas over another group, as PyTorch's). The buffer holds sums: the
        engine divides after the hook (PyTorch's may have averaged already, depending on the
        backend's ReduceOp). ``stream`` (CUDA) is not supported: the engine's collectives run on
        the current stream."""
        if stream is not None:
            raise NotImplementedError("set_all_reduce_hook: stream is not supported (FSDP's "
                                      "collectives run on the current CUDA stream)")
        group = self._fsdp_state().group
        if group is not None:
            group.all_reduce_hook = hook

    def set_post_optim_event(self, event):
        """Accepted for PyTorch's API: PyTorch's root makes its all-gather streams wait for
        ``event`` instead of the current stream. The engine's all-gathers run on the current
        stream (CPU: after the optimizer step in program order), which already orders them after
        any such event."""

    def set_allocate_memory_from_process_group_for_comm(self, enable):
        """Accepted for PyTorch's API: the engine's flat buffers already come from the backend's
        symmetric memory where it has it (NOTE [FSDP buffers in symmetric memory])."""

    def set_modules_to_forward_prefetch(self, modules):
        """After this module's pre-forward unshard, issue these modules' all-gathers."""
        self._fsdp_state().forward_prefetch = [_checked_state(m) for m in modules]

    def set_modules_to_backward_prefetch(self, modules):
        """After this module's pre-backward unshard, issue these modules' all-gathers."""
        self._fsdp_state().backward_prefetch = [_checked_state(m) for m in modules]

    def __deepcopy__(self, memo):
        raise AssertionError("FSDP does not support deepcopy. Please use state dict for "
                             "serialization.")


def register_fsdp_forward_method(module, method_name):
    """Makes ``module.<method_name>`` run FSDP's pre-forward and post-forward around it, as
    ``forward`` does (a ``generate`` or ``encode`` that uses the parameters without calling
    forward), as PyTorch's; a no-op for a module that is not an FSDPModule."""
    if not isinstance(module, FSDPModule):
        return
    if not hasattr(module, method_name):
        raise ValueError(f"{type(module)} does not have a method {method_name}")
    orig = getattr(module, method_name)

    @functools.wraps(orig)
    def wrapped(self, *args, **kwargs):
        state = _state_of(self)
        args, kwargs = state._pre_forward(self, args, kwargs)
        return state._post_forward(self, args, orig(*args, **kwargs))

    setattr(module, method_name, wrapped.__get__(module, type(module)))


def share_comm_ctx(modules):
    """PyTorch's: share the communication context (CUDA streams) of several FSDP roots (pipeline
    parallel's model chunks). Accepted after checking its arguments: every FSDP collective of
    the engine runs on the current stream, so the roots share it already."""
    for m in modules:
        if not isinstance(m, FSDPModule):
            raise ValueError(f"Expects list of FSDPModules but got {m}")


def _checked_state(module):
    state = _state_of(module)
    if state is None:
        raise ValueError(f"expects an FSDPModule, got {type(module).__name__}")
    return state
