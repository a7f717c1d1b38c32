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
* FSDP over TP (NOTE [FSDP over TP] in ``_param_group.py``): parameters that
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
* All-gather extensions (``fsdp_pre_all_gather``), custom all-gather / reduce-scatter comms,
  ``share_comm_ctx``; ``set_post_optim_event`` and ``set_all_reduce_hook``'s ``stream`` belong to
  the CUDA streams above.

Decisions where PyTorch is silent or its mechanism is CUDA-specific:

* ``CPUOffloadPolicy`` (NOTE [CPU offload] in ``_param_group.py``): on a CUDA mesh the sharded
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
  holds it: NOTE [size-1 dims under FSDP] in ``_param_group.py``).
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
from torch.autograd import Variable
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from dtensor import _C
from dtensor._api import DTensor
from dtensor.device_mesh import DeviceMesh, _mesh_resources, init_device_mesh
from dtensor.fsdp._api import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
from dtensor.fsdp._param_group import FSDPParam, FSDPParamGroup, TrainingState, finish_reduces
from dtensor.placement_types import Shard

__all__ = ["FSDPModule", "UnshardHandle", "fully_shard", "register_fsdp_forward_method"]

_STATE_ATTR = "_dtensor_fsdp_state"


def _state_of(module):
    return module.__dict__.get(_STATE_ATTR)


class _SharedContext:
    """What the root shares with every FSDP state under it for one model."""

    def __init__(self):
        self.all_states = []
        self.is_last_backward = True
        self.callback_queued = False
        # The states that ran post-forward in this forward, in order (implicit backward prefetch).
        self.post_forward_order = []
        # Reduce-scatters in flight (NOTE [reduce-scatter in flight] in _param_group.py).
        self.pending_reduces = []


class _RegisterPostBackward(torch.autograd.Function):
    """Identity on the module's inputs that require grad; its backward runs once the module's
    backward has produced the inputs' gradients, i.e. after the group's parameter gradients."""

    @staticmethod
    def forward(ctx, state, *inputs):
        ctx.state = state
        return inputs

    @staticmethod
    def backward(ctx, *grads):
        if ctx.state.group is not None:
            ctx.state.group.post_backward()
        return (None,) + grads


def _cast_floating(dtype, x):
    if isinstance(x, torch.Tensor) and torch.is_floating_point(x) and x.dtype != dtype:
        return x.to(dtype)
    return x


def _to_device(device, x):
    if isinstance(x, torch.Tensor) and not isinstance(x, DTensor) and x.device != device:
        return x.to(device, non_blocking=True)
    return x


def _eager(hook):
    """NOTE [FSDP hooks under torch.compile]: ``module.compile()`` (or torch.compile of a module
    that holds FSDP modules) traces the module's call with its hooks. FSDP's hooks communicate
    and swap the registered parameters, so they run eagerly, as PyTorch's FSDP2 runs its own by
    default (``torch._dynamo.config.skip_fsdp_hooks``): Dynamo breaks the graph around them and
    compiles the forward on the unsharded plain parameters between. Outside compilation the hook
    is called directly (no Dynamo import, no wrapper cost)."""

    @functools.wraps(hook)
    def run(*args, **kwargs):
        if torch.compiler.is_compiling():
            return torch._dynamo.disable(hook, recursive=True)(*args, **kwargs)
        return hook(*args, **kwargs)

    return run


class FSDPState:
    """The hooks of one ``fully_shard`` call: forward pre/post, pre-backward, root callback."""

    def __init__(self, modules, group, mp_policy, auto_reshard_after_forward, device):
        self.modules = modules  # one, or the list fully_shard was given
        self.device = device  # the mesh's device for this rank (NOTE [mesh device])
        self.group = group
        self.mp_policy = mp_policy
        self.auto_reshard_after_forward = auto_reshard_after_forward
        self.is_root = None
        self.ctx = _SharedContext()
        self.training_state = TrainingState.IDLE
        self.forward_prefetch = []
        self.backward_prefetch = None  # None: implicit (NOTE [implicit backward prefetch])
        self.post_forward_indices = []  # where this state stands in ctx.post_forward_order
        # NOTE [fully_shard on a list]: several modules share one group and one state, as
        # PyTorch's: the pre-forward runs before the first of them to run forward, the
        # post-forward after the last (a module of the list that does not run leaves the
        # post-forward out until the root's next forward or the end of backward starts over).
        self.to_run = set()
        if len(modules) == 1:
            modules[0].register_forward_pre_hook(_eager(self._pre_forward), prepend=True,
                                                 with_kwargs=True)
            modules[0].register_forward_hook(_eager(self._post_forward), prepend=False)
        else:
            for m in modules:
                m.register_forward_pre_hook(_eager(self._group_pre_forward), prepend=True,
                                            with_kwargs=True)
                m.register_forward_hook(
                    _eager(functools.partial(self._group_post_forward, m)), prepend=False)
        if group is not None:
            modules = {m for p in group.fsdp_params for m, _ in p.uses}
            for m in modules:
                m.register_state_dict_pre_hook(lambda *a, **k: self._to_sharded())
                m._register_load_state_dict_pre_hook(lambda *a, **k: self._to_sharded())
                m.register_load_state_dict_post_hook(lambda *a: self._reset_sharded_params())

    def _group_pre_forward(self, module, args, kwargs):
        if self.to_run:
            return None  # another module of the list started the group's forward
        self.to_run.update(self.modules)
        return self._pre_forward(module, args, kwargs)

    def _group_post_forward(self, module, _, inputs, output):
        self.to_run.discard(module)
        return None if self.to_run else self._post_forward(module, inputs, output)

    def _reset_sharded_params(self):
        """After load_state_dict: the parameters it registered (assign=True) are FSDP's."""
        self.group.lazy_init()

    def _to_sharded(self):
        if self.group is not None and self.group.is_unsharded:
            self.group.reshard()

    def lazy_init(self):
        """Makes the first state to run forward the root of every state in its subtree."""
        if self.is_root is not None:
            return
        if len(self.modules) > 1:
            raise RuntimeError(f"fully_shard: the root must be one module; the list "
                               f"{[type(m).__name__ for m in self.modules]} ran forward first "
                               f"(call fully_shard on the module that holds them)")
        self.is_root = True
        names = {}  # state -> its modules' names in the root's tree
        for name, m in self.modules[0].named_modules():
            state = _state_of(m)
            if state is None:
                continue
            if state not in names:
                names[state] = []
                if state is not self:
                    if state.is_root is not None:
                        raise RuntimeError(f"fully_shard: {name} ran forward before the root; "
                                           f"FSDP requires running forward through the root "
                                           f"module first")
                    state.is_root = False
                state.ctx = self.ctx
                self.ctx.all_states.append(state)
            names[state].append(name or "the root")
        for state, state_names in names.items():
            if state.group is not None:
                # Its name in the root's tree names its collectives (NOTE [collective purpose]).
                state.group.name = ", ".join(state_names)
                state.group.pending_reduces = self.ctx.pending_reduces
                state.group.lazy_init()
        if self.group is not None and self.auto_reshard_after_forward:
            self.group.reshard_after_forward = False

    def _pre_forward(self, module, args, kwargs):
        if self._recomputing():
            if not self.group.is_unsharded:  # resharded by hand since its pre-backward
                self.group.unshard()
                self.group.wait_for_unshard()
            return args, kwargs
        self.lazy_init()
        if self.is_root and torch.is_grad_enabled():
            self.ctx.post_forward_order.clear()
            for state in self.ctx.all_states:
                state.post_forward_indices.clear()
        if self.is_root:
            for state in self.ctx.all_states:
                state.to_run.clear()  # a list whose modules did not all run last time
        self.training_state = TrainingState.FORWARD
        if self.is_root and self.device.type != "cpu":
            # As PyTorch's root pre-forward: plain tensor inputs move to the mesh's device.
            move = functools.partial(_to_device, self.device)
            args, kwargs = tree_map(move, args), tree_map(move, kwargs)
        if self.mp_policy.cast_forward_inputs and self.mp_policy.param_dtype is not None:
            cast = functools.partial(_cast_floating, self.mp_policy.param_dtype)
            args, kwargs = tree_map(cast, args), tree_map(cast, kwargs)
        if self.group is not None:
            self.group.training_state = TrainingState.FORWARD
            self.group.unshard()
            self.group.wait_for_unshard()
            args, kwargs = self._register_post_backward(args, kwargs)
        for target in self.forward_prefetch:
            if target.group is not None:
                target.group.unshard(async_op=True)
        return args, kwargs

    def _recomputing(self):
        """NOTE [activation checkpointing]: is this forward one that non-reentrant
        torch.utils.checkpoint recomputes in this module's backward (the FSDP module inside the
        checkpointed function)? Then its pre-backward unsharded the parameters and its
        post-backward, registered by the original forward, will reduce and reshard: the
        recompute only computes, as PyTorch's. The group's state decides, not only the module's:
        a reentrant checkpoint's recompute of a module already used once in this backward finds
        the group after that use's post-backward, and its original forward ran under no_grad,
        so it must register its own post-backward (PyTorch's state check skips it, and that use's
        gradients would stay unreduced). Checkpointing the module's inside (checkpoint_wrapper
        under fully_shard, as torchtitan does) recomputes without FSDP's hooks at all; a
        reentrant recompute runs as a forward inside backward (_post_forward)."""
        return (self.group is not None and self.training_state == TrainingState.PRE_BACKWARD
                and self.group.training_state == TrainingState.PRE_BACKWARD)

    def _register_post_backward(self, args, kwargs):
        if not torch.is_grad_enabled():
            return args, kwargs
        flat, spec = tree_flatten((args, kwargs))
        where = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor) and x.requires_grad]
        if not where:
            return args, kwargs  # the root's end-of-backward callback runs post_backward
        outs = _RegisterPostBackward.apply(self, *[flat[i] for i in where])
        for i, t in zip(where, outs):
            flat[i] = t
        return tree_unflatten(flat, spec)

    def _post_forward(self, module, inputs, output):
        if self._recomputing():
            return output
        # A forward run inside backward (reentrant checkpointing recomputes the module there
        # after a forward under no_grad): its backward follows at once, so the parameters stay
        # unsharded until post-backward, and it is no use of the forward's prefetch order.
        in_backward = torch._C._current_graph_task_id() != -1
        if self.group is not None:
            if self.group.reshard_after_forward and not in_backward:
                self.group.reshard()
            self.group.training_state = TrainingState.IDLE
            if torch.is_grad_enabled() and not in_backward:
                self.post_forward_indices.append(len(self.ctx.post_forward_order))
                self.ctx.post_forward_order.append(self)
        if torch.is_grad_enabled():
            for t in tree_flatten(output)[0]:
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    t.register_hook(self._pre_backward)
        self.training_state = TrainingState.IDLE
        if self.mp_policy.output_dtype is not None:
            output = tree_map(functools.partial(_cast_floating, self.mp_policy.output_dtype),
                              output)
        return output

    def _pre_backward(self, grad):
        if not self.ctx.callback_queued:
            self.ctx.callback_queued = True
            Variable._execution_engine.queue_callback(self._root_post_backward)
        self.training_state = TrainingState.PRE_BACKWARD
        if self.group is not None:
            # As PyTorch: the group's state decides. Another output of the same forward finds it
            # in PRE_BACKWARD; a module run twice before one backward finds it resharded by the
            # later call's post-backward (POST_BACKWARD) and unshards it again for the earlier.
            if self.group.training_state == TrainingState.PRE_BACKWARD:
                return grad
            self.group.training_state = TrainingState.PRE_BACKWARD
            if self.group.unshard_in_backward:
                self.group.unshard()
                self.group.wait_for_unshard()
        for target in self._backward_prefetch_targets():
            if target.group is not None and target.group.unshard_in_backward:
                target.group.unshard(async_op=True)
        return grad

    def _backward_prefetch_targets(self):
        """NOTE [implicit backward prefetch]: PyTorch's default. Backward runs the groups in the
        reverse of their post-forward order, so once this group is unsharded for backward, the
        group that ran post-forward just before it is the next to need its parameters: its
        all-gather is issued now (asynchronously) and waited for at its own pre-backward, so it
        runs while this group computes. An explicit set_modules_to_backward_prefetch list
        replaces it (an empty list turns prefetching off)."""
        if self.backward_prefetch is not None:
            return self.backward_prefetch
        if not self.post_forward_indices:
            return []
        index = self.post_forward_indices.pop()
        return [self.ctx.post_forward_order[index - 1]] if index > 0 else []

    def _root_post_backward(self):
        """End of backward: post_backward for groups whose inputs needed no gradient (or that
        were not used), then every state back to idle."""
        for state in self.ctx.all_states:
            group = state.group
            if group is not None:
                if group.training_state != TrainingState.POST_BACKWARD:
                    group.post_backward()  # idempotent: a group with no gradient just reshards
                group.training_state = TrainingState.IDLE
                if self.ctx.is_last_backward:
                    group.finalize_backward()
            state.training_state = TrainingState.IDLE
            state.to_run.clear()
        finish_reduces(self.ctx.pending_reduces)
        self.ctx.callback_queued = False


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
    # NOTE [CPU offload] in _param_group.py (on a CPU mesh nothing moves).
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
        group = self._fsdp_state().group
        if group is not None:
            group.force_sum_reduction_for_comms = enable

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


def _checked_state(module):
    state = _state_of(module)
    if state is None:
        raise ValueError(f"expects an FSDPModule, got {type(module).__name__}")
    return state
