"""FSDP's parameter groups: one all-gather before compute and one reduce-scatter after backward
for all parameters of one ``fully_shard`` call (NOTE [fully_shard] in ``_fully_shard.py``).

The flat buffers' layout (PyTorch's: padded pieces per rank, NOTE [FSDP flat buffers]) and the
per-parameter copies around each collective are the C++ runtime's (fsdp/flat_params.h, NOTE
[FSDP runtime in C++]): one call per group and phase. This module keeps the state machine.
"""

import torch

from dtensor import _C
from dtensor import _functional_collectives as funcol
from dtensor.fsdp._fsdp_param import ShardedState, TrainingState


# The reduce-scatter inputs in symmetric memory, shared by every group of a shard group and
# dtype, and the free all-gather inputs in symmetric memory per shard group and dtype (NOTE [FSDP
# buffers in symmetric memory]).
_SHARED_SCRATCH = {}
# (job, shard group, dtype) -> the pending-reduce list (a root's) whose last reduce-scatter reads
# that scratch: a reduce of another root finishes them before overwriting it.
_SCRATCH_READERS = {}
_GATHER_POOL = {}


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
        # Per bucket (_bucket_key), the summed reduce-scatter outputs not yet all-reduced
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

    @staticmethod
    def _bucket_key(params):
        """One bucket's key (its parameters, in order): _layout's cache and the HSDP partial
        sums are kept per bucket."""
        return tuple(id(p) for p in params)

    def _layout(self, params):
        """The C++ runtime's flat layout of ``params`` (one bucket of this group), kept per
        bucket: the buckets are the same every step."""
        key = self._bucket_key(params)
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
        # Partial sums wait for a backward with all-reduce, this group's gradients or not (NOTE
        # [HSDP accumulation without all-reduce]).
        if with_grad or (self.all_reduce_grads and self._partial_reduces):
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
                now = {self._bucket_key([p for p, _ in b]) for b in buckets}
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
                key = self._bucket_key(params)
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
