"""One parameter under FSDP: its sharded and unsharded ``nn.Parameter``s, their registration on
the modules that use it, and its gradients (NOTE [fully_shard] in ``_fully_shard.py``; the group
that all-gathers and reduce-scatters them together is ``_param_group.py``'s, as PyTorch's
``_fsdp_param.py`` / ``_fsdp_param_group.py``)."""

import enum
import warnings

import torch
from torch import nn

from dtensor import _C
from dtensor._api import DTensor, distribute_tensor
from dtensor.device_mesh import DeviceMesh, _mesh_resources, _root_mesh
from dtensor.placement_types import Replicate, Shard, _StridedShard


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
    # A name _flatten made on a slice of the root (world["dp", "cp"]._flatten("dp_cp")) stands
    # for the root's dims it merges (NOTE [flattened dims]).
    flat = _mesh_resources.flattened.get(root._mesh, {})
    dims = [d for n in names for d in (flat[n][0] if n in flat else (n,))]
    if (root == tp_mesh or _root_mesh(mesh) != root or not root.mesh_dim_names
            or len(set(dims)) != len(dims)
            or any(d not in root.mesh_dim_names for d in dims)):
        raise ValueError(f"fully_shard: {what} is distributed on {tp_mesh}; FSDP over it needs "
                         f"fully_shard's mesh and that mesh sliced by name (or flattened) from "
                         f"one mesh (world['dp'] and world['tp']), got {mesh}")
    where = [root.mesh_dim_names.index(d) for d in dims]
    if where != sorted(where):
        raise NotImplementedError(f"fully_shard: the data-parallel dims {mesh.mesh_dim_names} "
                                  f"must come before the tensor-parallel dims "
                                  f"{tp_mesh.mesh_dim_names} in {root}")
    with warnings.catch_warnings():  # slicing a flattened dim from the root: our own use
        warnings.simplefilter("ignore")
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
            first = (_StridedShard(self.shard_dim, split_factor=tp_split) if tp_split > 1
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
            # A meta parameter (a model built on the meta device, materialized after
            # fully_shard: torchtitan's to_empty, transformers' loading) stays meta until then,
            # as PyTorch's offload moves only real pieces.
            if offload is not None and not piece.is_meta:
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
