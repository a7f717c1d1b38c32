"""FSDP's hooks for one ``fully_shard`` call (FSDPState): forward pre/post, pre-backward and the
root's end-of-backward callback, over the parameter group of ``_param_group.py`` (NOTE
[fully_shard] in ``_fully_shard.py``; PyTorch's ``_fsdp_state.py``)."""

import functools

import torch
from torch.autograd import Variable
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from dtensor._api import DTensor
from dtensor.fsdp._fsdp_param import TrainingState
from dtensor.fsdp._param_group import finish_reduces


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
    that holds FSDP modules) traces the module's call with its hooks (and a method registered
    with register_fsdp_forward_method calls them). FSDP's hooks communicate
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
        # post-forward out until the root's next forward starts over).
        self.to_run = set()
        if len(modules) == 1:
            modules[0].register_forward_pre_hook(self._pre_forward, prepend=True,
                                                 with_kwargs=True)
            modules[0].register_forward_hook(self._post_forward, prepend=False)
        else:
            for m in modules:
                m.register_forward_pre_hook(self._group_pre_forward, prepend=True,
                                            with_kwargs=True)
                m.register_forward_hook(functools.partial(self._group_post_forward, m),
                                        prepend=False)
        if group is not None:
            modules = {m for p in group.fsdp_params for m, _ in p.uses}
            for m in modules:
                m.register_state_dict_pre_hook(lambda *a, **k: self._to_sharded())
                m._register_load_state_dict_pre_hook(lambda *a, **k: self._to_sharded())
                m.register_load_state_dict_post_hook(lambda *a: self._reset_sharded_params())

    @_eager
    def _group_pre_forward(self, module, args, kwargs):
        if self.to_run:
            return None  # another module of the list started the group's forward
        self.to_run.update(self.modules)
        return self._pre_forward(module, args, kwargs)

    @_eager
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

    @_eager
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

    @_eager
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
        finish_reduces(self.ctx.pending_reduces)
        self.ctx.callback_queued = False
