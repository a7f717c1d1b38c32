"""FSDP's parameter groups: one all-gather before compute and one reduce-scatter after backward
for all parameters of one ``fully_shard`` call (NOTE [fully_shard] in ``_fully_shard.py``).

The flat buffers' layout (PyTorch's: padded pieces per rank, NOTE [FSDP flat buffers]) and the
per-parameter copies around each collective are the C++ runtime's (fsdp/flat_params.h, NOTE
[FSDP runtime in C++]): one call per group and phase. This module keeps the state machine.
"""

import enum

import torch
from torch import nn

from dtensor import _C
from dtensor import _functional_collectives as funcol
from dtensor._api import DTensor, distribute_tensor
from dtensor.device_mesh import DeviceMesh, _root_mesh
from dtensor.placement_types import Replicate, Shard, _StridedShard


# The reduce-scatter inputs in symmetric memory, shared by every group of a shard group and
# dtype, and the free all-gather inputs in symmetric memory per shard group and dtype (NOTE [FSDP
# buffers in symmetric memory]).
_SHARED_SCRATCH = {}
# (job, shard group, dtype) -> the pending-reduce list (a root's) whose last reduce-scatter reads
# that scratch: a reduce of another root finishes them before overwriting it.
_SCRATCH_READERS = {}
_GATHER_POOL = {}


class ShardedState(enum.Enum):
    SHARDED = "sharded"
    SHARDED_POST_FORWARD = "sharded post forward"  # NOTE [reshard after forward to a smaller group]
    UNSHARDED = "unsharded"


class TrainingState(enum.Enum):
    IDLE = "idle"
    FORWARD = "forward"
    PRE_BACKWARD = "pre_backward"
    POST_BACKWARD = "post_backward"


def _storage_tensor(t):
    """The tensor whose storage holds ``t``'s data on this rank: its piece for a distributed one."""
    if not _C.is_dtensor(t):
        return t
    with torch.no_grad():
        return _C.to_local(t, None)


def _fsdp_tp_mesh(mesh, tp_mesh, what):
    """The mesh FSDP over TP lays sharded parameters out on: the root's dims of ``mesh`` (data
    parallel) then of ``tp_mesh``, both sliced from one root by name, data parallel outer (as
    PyTorch requires)."""
    root = _root_mesh(tp_mesh)
    names = (mesh.mesh_dim_names or ()) + (tp_mesh.mesh_dim_names or ())
    if (root == tp_mesh or _root_mesh(mesh) != root or not root.mesh_dim_names
            or len(set(names)) != len(names)):
        raise ValueError(f"fully_shard: {what} is distributed on {tp_mesh}; FSDP over it needs "
                         f"fully_shard's mesh and that mesh sliced by name from one mesh "
                         f"(world['dp'] and world['tp']), got {mesh}")
    where = [root.mesh_dim_names.index(n) for n in names]
    if where != sorted(where):
        raise NotImplementedError(f"fully_shard: the data-parallel dims {mesh.mesh_dim_names} "
                                  f"must come before the tensor-parallel dims "
                                  f"{tp_mesh.mesh_dim_names} in {root}")
    return root[names]


def _cpu_twin(mesh):
    """``mesh``'s ranks and dim names on the CPU (NOTE [CPU offload])."""
    return DeviceMesh._wrap(mesh._mesh.with_device_type("cpu"), "cpu")


def _set_param(module, name, param):
    """Registers ``param`` as ``module.<name>`` without nn.Module.__setattr__'s checks (a plain
    unsharded parameter replaces a distributed one and back), as PyTorch's unsafe_setattr_param."""
    module._parameters[name] = param


class FSDPParam:
    """One parameter managed by FSDP: its sharded ``nn.Parameter`` (a distributed tensor,
    registered on the module between forwards) and its unsharded ``nn.Parameter`` (a plain
    tensor of the full shape, registered for compute; its storage is freed when resharded and
    refilled by the next all-gather, so autograd's saved references to it stay valid)."""

    def __init__(self, param, uses, mesh, shard_dim, offload=None):
        # uses: [(module, attribute name)] where this parameter is registered (shared ones twice).
        # NOTE [size-1 dims under FSDP]: as PyTorch's FSDP2, a parameter is placed Shard(0) (or
        # shard_placement_fn's dim) with torch.chunk's pieces even when that dim has size 1
        # (ViT's cls_token (1, 1, d), a (1,) bias of Linear(d, 1)): rank 0 holds all of it and
        # the others empty pieces. The engine's rules keep such a Shard through ops (NOTE
        # [size-1 factors] in sharding_prop/rule.h), so the optimizer steps it in place. A 0-dim
        # parameter (a temperature) has no dim to shard: it is kept whole on every rank (placed
        # Replicate: it joins the group's all-gather as every rank's full copy and its gradient
        # is averaged over the ranks by the group's reduce-scatter, each rank sending the full
        # gradient), where PyTorch cannot chunk it.
        self.uses = uses
        # NOTE [CPU offload]: a CPUOffloadPolicy on a CUDA mesh keeps the sharded parameters
        # and their gradients on the CPU, as PyTorch's FSDP2: the optimizer steps there, the
        # all-gather's copy-in moves each piece to the device, and the reduced gradient pieces
        # are copied back. Where PyTorch places them on the CUDA mesh with CPU local tensors,
        # here they live on that mesh's CPU twin (the same ranks and dim names on the CPU),
        # since a mesh's device type decides where its local tensors live (NOTE [mesh device]).
        # Their collectives (clip_grad_norm_'s norms) run on the job's backend: shm for CPU
        # tensors under cuda_ipc, through the device under nccl (NOTE [nccl and CPU tensors]).
        self.offload = offload  # a CPUOffloadPolicy or None
        self.replicated = param.dim() == 0
        if not self.replicated:
            shard_dim %= param.dim()
        self.shard_dim = 0 if self.replicated else shard_dim
        self.shard_size = mesh.size(mesh.ndim - 1)
        self.shard_rank = mesh.get_local_rank(mesh.ndim - 1)
        self.global_size = param.shape
        self.orig_dtype = param.dtype
        fsdp_placements = ((Replicate(),) if mesh.ndim == 2 else ()) + (
            Replicate() if self.replicated else Shard(self.shard_dim),)
        # NOTE [FSDP over TP]: a parameter that is already distributed (parallelize_module on the
        # "tp" dims) is sharded again, over the data-parallel dims, as PyTorch's FSDP2 does: FSDP
        # works on its TP piece (which is what the all-gather rebuilds, and what the unsharded
        # parameter wraps, a distributed tensor on the TP mesh for compute), and the sharded
        # parameter lives on the (dp, tp) mesh with the data-parallel placements first. Where both
        # shard one tensor dim, TP splits first (_StridedShard, NOTE [strided shards]). HSDP over
        # TP (3-D, as torchtitan's dp_replicate x dp_shard x tp): the mesh is (replicate, shard,
        # tp...) and the placements (Replicate(), the shard dim's, TP's).
        self.tp_mesh = self.tp_placements = None
        if isinstance(param, DTensor):
            if self.replicated:
                raise NotImplementedError(f"fully_shard: a tensor-parallel parameter of shape "
                                          f"{tuple(param.shape)} has no dim")
            if any(p.is_partial() for p in param.placements):
                raise ValueError(f"fully_shard: a parameter placed {param.placements} (Partial)")
            self.tp_mesh, self.tp_placements = param.device_mesh, tuple(param.placements)
            mesh_nd = _fsdp_tp_mesh(mesh, self.tp_mesh, f"a parameter of shape "
                                    f"{tuple(param.shape)}")
            tp_split = 1
            for m, p in enumerate(self.tp_placements):
                if p.is_shard(self.shard_dim):
                    tp_split *= self.tp_mesh.size(m)
            first = (_StridedShard(self.shard_dim, tp_split) if tp_split > 1
                     else Shard(self.shard_dim))
            self.placements = fsdp_placements[:-1] + (first,) + self.tp_placements
            self.mesh = _cpu_twin(mesh_nd) if offload is not None else mesh_nd
            param = _C.to_local(param, None)  # FSDP shards the TP piece from here on
        else:
            self.placements = fsdp_placements
            self.mesh = _cpu_twin(mesh) if offload is not None else mesh
        self.orig_size = param.shape  # the TP piece's shape under FSDP over TP
        # The flat-buffer arithmetic is the C++ runtime's (NOTE [FSDP flat buffers] in
        # fsdp/flat_params.h).
        layout = _C.FsdpFlatParams([self.flat_param()], self.shard_size)
        self.chunk = layout.chunk(0)  # slices per rank's padded piece
        self.local_slices = layout.local_slices(0, self.shard_rank)
        dim_size = 1 if self.replicated else param.shape[self.shard_dim]
        # No communication: every rank keeps its own piece of its own copy (PyTorch's rule; the
        # ranks must hold the same values, e.g. the same seed or a loaded checkpoint).
        if self.tp_mesh is None and offload is None:
            sharded = distribute_tensor(param.detach(), mesh, list(self.placements),
                                        src_data_rank=None)
        else:
            piece = param.detach()
            if not self.replicated:
                piece = piece.narrow(self.shard_dim, min(self.shard_rank * self.chunk, dim_size),
                                     self.local_slices)
            piece = piece.contiguous()
            if offload is not None:
                piece = piece.to("cpu")
                if offload.pin_memory and torch.cuda.is_available():
                    piece = piece.pin_memory()
            sharded = DTensor.from_local(piece, self.mesh, list(self.placements),
                                         shape=self.global_size,
                                         stride=self._global_stride())
        self.sharded_param = nn.Parameter(sharded, requires_grad=param.requires_grad)
        if tuple(self.sharded_param.placements) != tuple(self.placements):
            # nn.Parameter detaches: were detach to move the pieces (it kept no Shard of a
            # size-1 dim before NOTE [size-1 factors]), FSDP's flat buffers would be wrong.
            raise RuntimeError(
                f"fully_shard: a parameter of shape {tuple(self.global_size)} placed "
                f"{self.placements} on {self.mesh} became {self.sharded_param.placements} "
                f"when made an nn.Parameter")
        self.unsharded_param = None
        self._unsharded_data = None  # between unsharded_dst and finish_unshard at first unshard
        self.accumulated_grad = None  # unsharded gradient kept while gradient sync is off
        self.param_dtype = None
        self.reduce_dtype = None
        for module, name in uses:
            _set_param(module, name, self.sharded_param)

    def reset_sharded_param(self):
        """Re-reads the registered sharded parameter, as PyTorch's FSDPParam.reset_sharded_param:
        ``load_state_dict(..., assign=True)`` registers new parameter objects, which from then on
        are the ones all-gathered and given gradients (else the optimizer built on them would never
        see a gradient, and forward would keep the old values). The new one must have the same
        mesh, placements and shape (a state dict of this layout); its dtype becomes the original
        dtype. Called after load_state_dict and at lazy init."""
        module, name = self.uses[0]
        new = module._parameters.get(name)
        if new is None or new is self.sharded_param or new is self.unsharded_param:
            return
        if (not isinstance(new, DTensor) or new.device_mesh != self.mesh
                or tuple(new.placements) != tuple(self.placements)
                or tuple(new.shape) != tuple(self.global_size)):
            what = (f"{type(new).__name__} of shape {tuple(new.shape)}" if not
                    isinstance(new, DTensor) else f"shape {tuple(new.shape)} placed "
                    f"{tuple(new.placements)} on {new.device_mesh}")
            raise ValueError(f"fully_shard: parameter {name!r} was replaced by a {what}; FSDP "
                             f"expects shape {tuple(self.global_size)} placed "
                             f"{tuple(self.placements)} on {self.mesh} (load a state dict of "
                             f"this layout, or load without assign=True)")
        if not isinstance(new, nn.Parameter):
            new = nn.Parameter(new, requires_grad=self.sharded_param.requires_grad)
        self.sharded_param = new
        for m, n in self.uses:
            _set_param(m, n, new)

    def _global_stride(self):
        return torch.empty(self.global_size, device="meta").stride()

    def init_dtypes(self, mp_policy):
        """PyTorch's clamping: no cast where the dtype already matches. The original dtype is the
        sharded parameter's now (``model.double()`` after fully_shard changes it in place)."""
        self.orig_dtype = self.sharded_param.dtype
        param_dtype, reduce_dtype = mp_policy.param_dtype, mp_policy.reduce_dtype
        if reduce_dtype == param_dtype:
            reduce_dtype = None
        if param_dtype == self.orig_dtype:
            param_dtype = None
        self.param_dtype, self.reduce_dtype = param_dtype, reduce_dtype

    @property
    def compute_dtype(self):
        return self.param_dtype or self.orig_dtype

    @property
    def grad_reduce_dtype(self):
        return self.reduce_dtype or self.compute_dtype

    # ---- all-gather ---------------------------------------------------------------------------

    def flat_param(self):
        """This parameter in the C++ runtime's flat layout (NOTE [FSDP flat buffers] in
        fsdp/flat_params.h): unsharded shape, shard dim, replicated."""
        return (tuple(self.orig_size), self.shard_dim, self.replicated)

    def all_gather_input(self):
        """This rank's piece, which the all-gather's copy-in reads."""
        return _C.to_local(self.sharded_param, None)

    def unsharded_dst(self, dtype, device):
        """The tensor the all-gather's copy-out fills: the unsharded parameter's own storage (never
        a view of the all-gather output: freeing or refilling a storage shared with the buffer at
        an offset wrote past its end, seen with FSDP over TP, hidden dim 3), allocated at the
        first unshard and re-allocated in place after each reshard."""
        if self.unsharded_param is None:
            self._unsharded_data = torch.empty(self.orig_size, dtype=dtype, device=device)
            return self._unsharded_data
        local = _storage_tensor(self.unsharded_param)
        local.untyped_storage().resize_(local.numel() * local.element_size())
        return local

    def finish_unshard(self):
        """After the copy-out: the unsharded ``nn.Parameter`` (made at the first unshard)."""
        if self.unsharded_param is None:
            data, self._unsharded_data = self._unsharded_data, None
            if self.tp_mesh is not None:
                data = DTensor.from_local(data, self.tp_mesh, list(self.tp_placements),
                                          shape=self.global_size, stride=self._global_stride())
            self.unsharded_param = nn.Parameter(data,
                                                requires_grad=self.sharded_param.requires_grad)
        else:
            self.unsharded_param.requires_grad_(self.sharded_param.requires_grad)

    def to_unsharded(self):
        for module, name in self.uses:
            _set_param(module, name, self.unsharded_param)

    def to_sharded(self):
        for module, name in self.uses:
            _set_param(module, name, self.sharded_param)
        if self.unsharded_param is not None:
            _storage_tensor(self.unsharded_param).untyped_storage().resize_(0)

    # ---- gradients ----------------------------------------------------------------------------

    def take_unsharded_grad(self):
        """The unsharded gradient of this backward plus any accumulated without sync, in the
        reduce dtype; clears both. None when there is none."""
        grad = None
        if self.unsharded_param is not None and self.unsharded_param.grad is not None:
            grad = self.unsharded_param.grad
            if self.tp_mesh is not None:
                # The gradient of a TP parameter: its piece in the parameter's TP placements.
                if tuple(grad.placements) != self.tp_placements:
                    grad = grad.redistribute(self.tp_mesh, list(self.tp_placements))
                grad = _C.to_local(grad, None)
            grad = grad.to(self.grad_reduce_dtype)
            self.unsharded_param.grad = None
        if self.accumulated_grad is not None:
            grad = self.accumulated_grad if grad is None else self.accumulated_grad + grad
            self.accumulated_grad = None
        return grad

    def accumulate_unsharded_grad(self):
        """Gradient sync off: keeps the unsharded gradient (in the reduce dtype) for a later
        backward that reduces, so the unsharded parameter's storage may be freed."""
        grad = self.take_unsharded_grad()
        self.accumulated_grad = grad

    def add_sharded_grad(self, piece):
        """Sets (or accumulates into) the sharded parameter's gradient from this rank's reduced
        ``piece`` (its local shape); the gradient keeps the parameter's dtype and placements.
        ``piece`` is a view of this reduce's own result (never the shared scratch): it may stay."""
        # Offloaded (NOTE [CPU offload]): the piece moves to the CPU, where the parameter is.
        local = piece.to(device="cpu" if self.offload is not None else piece.device,
                         dtype=self.orig_dtype)
        grad = DTensor.from_local(local, self.mesh, list(self.placements),
                                  shape=self.global_size, stride=self._global_stride())
        p = self.sharded_param
        if p.grad is None:
            p.grad = grad
        else:
            with torch.no_grad():
                p.grad.add_(grad)


def finish_reduces(pending):
    """NOTE [reduce-scatter in flight]: a group's gradient reduce-scatter is issued
    asynchronously at its post-backward, so it runs while autograd computes the gradients of the
    groups before it (PyTorch's reduce-scatter stream does the same on CUDA); it is finished (the
    HSDP all-reduce, the division, the sharded gradients) at the next group's reduce-scatter,
    whose copy-in reuses the same scratch (NOTE [FSDP buffers in symmetric memory]), and at the
    end of backward (the root's callback), so the gradients are complete when backward returns. ``pending`` is
    the root's list (one per model, per rank): every rank finishes them at the same points, in
    the same order."""
    while pending:
        group, layout, params, out = pending.pop(0)
        group._finish_reduce(layout, params, out)


class FSDPParamGroup:
    """The parameters of one ``fully_shard`` call: unshard (one all-gather), reshard (free),
    post-backward (one reduce-scatter, and one all-reduce across replicas for HSDP)."""

    def __init__(self, fsdp_params, mesh, reshard_after_forward, mp_policy):
        self.fsdp_params = fsdp_params
        self.mesh = mesh
        self.reshard_after_forward = reshard_after_forward
        self.reshard_after_backward = True
        self.pending_reduces = []  # the root's list, set at lazy init (finish_reduces)
        self.reduce_grads = True  # set_requires_gradient_sync
        self.all_reduce_grads = True  # set_requires_all_reduce (HSDP)
        self.unshard_in_backward = True  # set_unshard_in_backward
        self.all_reduce_hook = None  # set_all_reduce_hook
        self.force_sum_reduction_for_comms = False  # accepted; reductions are always sums
        # Per bucket (_layout's key), the summed reduce-scatter outputs not yet all-reduced
        # across replicas: (layout, params, tensor) (NOTE [HSDP accumulation without all-reduce]).
        self._partial_reduces = {}
        self.gradient_divide_factor = None  # None: the data-parallel size
        self.mp_policy = mp_policy
        self.sharded_state = ShardedState.SHARDED
        self.training_state = TrainingState.IDLE
        self._pending = None  # issued, not yet copied-out all-gathers: [(params, tensor)]
        # Between forward and backward with reshard_after_forward=k: per bucket (params, piece)
        # (NOTE [reshard after forward to a smaller group]); the k-rank group's name.
        self._post_forward_pieces = None
        self._post_forward_group = None
        self._layouts = {}  # the C++ runtime's flat layouts per bucket (_layout)
        # The module's name under the root (set at the root's lazy init; its class before).
        self.name = None
        shard_dim = mesh.ndim - 1
        self._shard_group = (mesh, shard_dim)
        self._replicate_group = (mesh, 0) if mesh.ndim == 2 else None
        for p in fsdp_params:
            p.init_dtypes(mp_policy)

    def _purpose(self):
        """NOTE [collective purpose]: every collective of this group names its module, so ranks
        that reach different groups (a module skipped on some ranks, as with unused experts, or
        run in another order) fail on every rank naming both modules, instead of exchanging one
        group's parameters for another's of the same size."""
        return funcol._purpose(f"FSDP {self.name or 'module'}")

    def lazy_init(self):
        """The registered parameters and their dtypes again (the user may have loaded a state
        dict with assign=True or changed parameter dtypes since fully_shard)."""
        for p in self.fsdp_params:
            p.reset_sharded_param()
            p.init_dtypes(self.mp_policy)

    @property
    def is_unsharded(self):
        return self.sharded_state == ShardedState.UNSHARDED

    @staticmethod
    def _by_dtype(items, dtype_of):
        """NOTE [mixed dtypes in a group]: ``items`` split by dtype, in the order each dtype first
        appears (the parameters' order, equal on every rank): one all-gather (or reduce-scatter)
        per dtype, so a group may hold parameters of several dtypes (PyTorch's FSDP2 refuses them,
        pytorch/pytorch#156784). One dtype, the usual case, is one collective as before."""
        buckets = {}
        for item in items:
            buckets.setdefault(dtype_of(item), []).append(item)
        return list(buckets.values())

    def _symmetric(self):
        """NOTE [FSDP buffers in symmetric memory]: each all-gather and reduce-scatter reads one
        flat buffer (NOTE [FSDP flat buffers] in fsdp/flat_params.h). On the shm
        backend (CPU processes) those buffers are symmetric memory rendezvoused on the shard
        group (NOTE [symmetric collectives]): peers read them directly, each byte copied once
        instead of staged through the segment. The all-gather inputs come from a pool per
        (shard group, dtype): taken at issue, returned when the all-gather is waited for (a
        symmetric call returns only when no peer still reads its input), so as many exist as
        all-gathers are in flight at once (the current group's and a prefetched one: two), not
        one per group (a second copy of every sharded parameter, seen in ./x bench fsdp's tensor
        peak). The reduce-scatter input is one scratch per (shard group, dtype) shared by every
        group of every root (one reduce-scatter runs at a time: a group's reduce first finishes
        those in flight that read it, its own root's and, through _SCRATCH_READERS, another
        root's, as when two separately sharded models share one backward), sized to the largest.
        The choices depend on
        the backend, the mesh and the order of issues and waits only, equal on every rank, as
        rendezvous is collective."""
        return (self.mesh.device_type == "cpu" and self.mesh.size(self.mesh.ndim - 1) > 1
                and funcol.context().backend == "shm")

    def _symmetric_key(self, dtype):
        return (funcol.context().job, funcol._group_name(self._shard_group), dtype)

    def _flat(self, numel, dtype, shared):
        """A flat buffer of ``numel`` elements: the reduce-scatter scratch (``shared``) or an
        all-gather input (symmetric: from the pool, returned by _release)."""
        if not self._symmetric():
            # On the mesh's device (NOTE [mesh device]): the all-gather's and the
            # reduce-scatter's inputs, which the backend (NCCL on CUDA) reads.
            return torch.empty(numel, dtype=dtype, device=self.mesh._mesh.local_device())
        from dtensor import symmetric_memory

        key = self._symmetric_key(dtype)
        if shared:
            buf = _SHARED_SCRATCH.get(key)
            if buf is None or buf.numel() < numel:
                buf = _SHARED_SCRATCH[key] = symmetric_memory.empty(numel, dtype=dtype)
                symmetric_memory.rendezvous(buf, self._shard_group)
            return buf[:numel]
        free = _GATHER_POOL.setdefault(key, [])
        fits = [i for i, b in enumerate(free) if b.numel() >= numel]
        if fits:  # the smallest that fits (by position: tensors compare by value)
            buf = free.pop(min(fits, key=lambda i: free[i].numel()))
        else:
            buf = symmetric_memory.empty(numel, dtype=dtype)
            symmetric_memory.rendezvous(buf, self._shard_group)
        return buf

    def _release(self, buf):
        """Returns an all-gather input to the pool once its all-gather was waited for."""
        if buf is not None and self._symmetric():
            _GATHER_POOL.setdefault(self._symmetric_key(buf.dtype), []).append(buf)

    def _layout(self, params):
        """The C++ runtime's flat layout of ``params`` (one bucket of this group), kept per
        bucket: the buckets are the same every step."""
        key = tuple(id(p) for p in params)
        layout = self._layouts.get(key)
        if layout is None:
            layout = _C.FsdpFlatParams([p.flat_param() for p in params], params[0].shard_size)
            self._layouts[key] = layout
        return layout

    def unshard(self, async_op=False):
        """Issues the group's all-gathers, one per compute dtype (no-op when unsharded or
        already issued): copy-in and all-gather in one C++ call (NOTE [FSDP runtime in C++])."""
        if self.is_unsharded or self._pending is not None:
            return
        if self._post_forward_pieces is not None:
            self._pending = self._unshard_post_forward(async_op)
            return
        pending = []
        group = funcol._group_name(self._shard_group)
        with torch.no_grad(), self._purpose():
            for params in self._by_dtype(self.fsdp_params, lambda p: p.compute_dtype):
                layout = self._layout(params)
                buf = self._flat(layout.per_rank_numel, params[0].compute_dtype, False)
                out = _C.fsdp_all_gather(layout, [p.all_gather_input() for p in params],
                                         buf[:layout.per_rank_numel], group, async_op)
                pending.append((layout, params, out, buf))
        self._pending = pending

    def _wait_pending(self):
        pending, self._pending = self._pending or [], None
        done = []
        for layout, params, out, buf in pending:
            done.append((layout, params, funcol.wait_tensor(out)))
            self._release(buf)
        return done

    def wait_for_unshard(self):
        """Copies the issued all-gathers out into the unsharded parameters (one C++ call per
        all-gather) and registers them."""
        if self._pending is None:
            return
        for layout, params, out in self._wait_pending():
            layout.copy_out(out, [p.unsharded_dst(out.dtype, out.device) for p in params])
            for p in params:
                p.finish_unshard()
        for p in self.fsdp_params:
            p.to_unsharded()
        self.sharded_state = ShardedState.UNSHARDED

    def reshard(self):
        """Registers the sharded parameters and frees the unsharded ones (no communication).
        After forward with reshard_after_forward=k, keeps the piece for the backward
        all-gather over k ranks (NOTE [reshard after forward to a smaller group])."""
        if self._pending is not None:  # an unshard that nobody waited for
            self._wait_pending()
        post_forward = (self.training_state == TrainingState.FORWARD and self.is_unsharded
                        and self.post_forward_size() is not None)
        self._post_forward_pieces = self._post_forward_copy() if post_forward else None
        for p in self.fsdp_params:
            p.to_sharded()
        self.sharded_state = (ShardedState.SHARDED_POST_FORWARD if post_forward
                              else ShardedState.SHARDED)

    def post_forward_size(self):
        """k when reshard_after_forward is an int k (a divisor of the shard group's size,
        checked by fully_shard), else None."""
        k = self.reshard_after_forward
        return None if isinstance(k, bool) else k

    def _post_forward_copy(self):
        """NOTE [reshard after forward to a smaller group]: reshard_after_forward=k, as
        PyTorch's: after forward each rank keeps 1/k of the group's gathered flat buffer
        instead of 1/S, so backward all-gathers over k ranks (a node's, say) instead of S. The
        k-rank groups are the mesh's ranks in blocks of k (PyTorch's ``mesh.view(-1, k)``);
        member j of a block keeps rows [j * S/k, (j + 1) * S/k) of the gathered layout (row r is
        shard rank r's padded pieces), copied from the unsharded parameters (NOTE [FSDP flat
        buffers]), so the block's all-gather rebuilds the whole buffer, which the copy-out
        reads as after the forward all-gather. The registered parameters are the sharded ones
        meanwhile (PyTorch registers ones on the k-rank mesh); the choice depends on the mesh
        and k only, equal on every rank."""
        k = self.post_forward_size()
        size = self.mesh.size(self.mesh.ndim - 1)
        if self._post_forward_group is None:
            blocks = self.mesh.mesh.flatten().view(-1, k).tolist()
            self._post_forward_group = funcol._group_name(blocks)
        j = self.fsdp_params[0].shard_rank % k
        rows = size // k
        pieces = []
        with torch.no_grad():
            for params in self._by_dtype(self.fsdp_params, lambda p: p.compute_dtype):
                layout = self._layout(params)
                full = [p.unsharded_param for p in params]
                piece = torch.empty(rows * layout.per_rank_numel, dtype=full[0].dtype,
                                    device=full[0].device)
                layout.copy_rows(full, piece, j * rows, rows)
                pieces.append((params, piece))
        return pieces

    def _unshard_post_forward(self, async_op):
        """The backward all-gather over the k-rank block from the kept pieces."""
        pending = []
        with torch.no_grad(), self._purpose():
            for params, piece in self._post_forward_pieces:
                out = funcol.all_gather_into_tensor(piece, 0, self._post_forward_group,
                                                    async_op=async_op)
                pending.append((self._layout(params), params, out, None))
        self._post_forward_pieces = None
        return pending

    def post_backward(self):
        """After the group's backward: reduce the unsharded gradients into the sharded ones (or
        keep them when gradient sync is off) and reshard. Idempotent per backward."""
        self.training_state = TrainingState.POST_BACKWARD
        if not self.reduce_grads:
            for p in self.fsdp_params:
                p.accumulate_unsharded_grad()
            if self.reshard_after_backward:
                self.reshard()
            return
        with_grad = []
        for p in self.fsdp_params:
            g = p.take_unsharded_grad()
            if g is not None:
                with_grad.append((p, g))
        if self.reshard_after_backward:
            self.reshard()
        if with_grad:
            self._reduce(with_grad)

    def _reduce(self, with_grad):
        """Per reduce dtype (NOTE [mixed dtypes in a group]): one reduce-scatter (sum) over the
        shard dim, issued asynchronously and finished later (NOTE [reduce-scatter in flight])."""
        finish_reduces(self.pending_reduces)  # they share the reduce-scatter scratch
        group = funcol._group_name(self._shard_group)
        with torch.no_grad(), self._purpose():
            buckets = self._by_dtype(with_grad, lambda pg: pg[1].dtype)
            for bucket in buckets:
                if self._symmetric():
                    # The scratch is shared by every root too (two models in one backward): the
                    # reduces in flight that read it, another root's included, finish first.
                    key = self._symmetric_key(bucket[0][1].dtype)
                    finish_reduces(_SCRATCH_READERS.get(key, []))
                    _SCRATCH_READERS[key] = self.pending_reduces
                params = [p for p, _ in bucket]
                layout = self._layout(params)
                size = params[0].shard_size
                flat = self._flat(size * layout.per_rank_numel, bucket[0][1].dtype, True)
                out = _C.fsdp_reduce_scatter(layout, [g for _, g in bucket], flat, group, True)
                self.pending_reduces.append((self, layout, params, out))
            if self._replicate_group is not None and self.all_reduce_grads:
                # Partial sums of parameters without a gradient in this backward are all-reduced
                # now too (in the dict's order, equal on every rank).
                now = {tuple(id(p) for p, _ in b) for b in buckets}
                for key, (layout, params, _) in self._partial_reduces.items():
                    if key not in now:
                        self.pending_reduces.append((self, layout, params, None))

    def _finish_reduce(self, layout, params, out):
        """The rest of one reduce: the all-reduce (sum) over the replicate dim for HSDP, the
        division by the divide factor, and the sharded gradients."""
        factor = self.gradient_divide_factor
        with torch.no_grad(), self._purpose():
            out = None if out is None else funcol.wait_tensor(out)
            if self._replicate_group is not None:
                # NOTE [HSDP accumulation without all-reduce]: set_requires_all_reduce(False), as
                # PyTorch's: the reduce-scatter over the shard dim runs every backward; its
                # output is summed here, and the all-reduce across replicas, the division and
                # the sharded gradients wait for a backward with all-reduce (gradient
                # accumulation that sends 1/shard of the bytes). ``out`` is None for a bucket
                # with a partial sum only. The choice is the user's, equal on every rank.
                key = tuple(id(p) for p in params)
                partial = self._partial_reduces.pop(key, None)
                if partial is not None:
                    out = partial[2] if out is None else out + partial[2]
                if not self.all_reduce_grads:
                    self._partial_reduces[key] = (layout, params, out)
                    return
                out = funcol.wait_tensor(funcol.all_reduce(out, "sum", self._replicate_group))
            if self.all_reduce_hook is not None:
                self.all_reduce_hook(out)
            out = out / (self.mesh.size() if factor is None else factor)
            for p, piece in zip(params, layout.pieces_of(out, params[0].shard_rank)):
                p.add_sharded_grad(piece)
                # As PyTorch's foreach_reduce: the sharded parameter's post-accumulate-grad hooks
                # (optimizer in backward) see its new gradient; autograd never accumulates into
                # it, so it would not call them.
                for hook in (getattr(p.sharded_param, "_post_accumulate_grad_hooks", None)
                             or {}).values():
                    hook(p.sharded_param)

    def finalize_backward(self):
        """End of the last backward: drop a prefetched all-gather nobody used."""
        if self._pending is not None:
            self._wait_pending()
