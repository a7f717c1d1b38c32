"""PipelineStage: one stage of a pipeline on this rank (torch.distributed.pipelining's name).

NOTE [pipeline stages]: a stage is a module with its index among the pipeline's stages, placed on
the pipeline group's rank (index mod group size), as PyTorch places them. Its forward takes the
previous stage's outputs as they arrive (NOTE [pipeline transfers]): distributed tensors laid out
as they left, on this stage's mesh; its backward runs autograd from the next stage's gradients of
those outputs (or from the loss on the last stage) and sends its inputs' gradients back. A
stage's inputs are leaves: autograd graphs end at stage boundaries, the gradient crosses as data.
The ranks of every stage are those of the first moved by one offset (the pipeline dim of a mesh
from init_device_mesh); each rank's counterpart on another stage is its pipeline group's member
there.
"""

import time

import torch
import torch.distributed as dist

from dtensor import _C
from dtensor.pipelining import _transfer


def _group_ranks(group):
    """The pipeline group's ranks in group order: a ProcessGroup (mesh.get_group("pp")), a 1-D
    DeviceMesh, or None (every rank of the job)."""
    from dtensor.device_mesh import DeviceMesh
    if group is None:
        return list(range(_C.world_size()))
    if isinstance(group, DeviceMesh):
        if group.ndim != 1:
            raise ValueError(f"PipelineStage: the pipeline group is a 1-D mesh, got {group}")
        return [int(r) for r in group.mesh.tolist()]
    return [int(r) for r in dist.get_process_group_ranks(group)]


def _param_meshes(module):
    """The meshes of the module's distributed parameters and their named slices (FSDP x TP lays
    parameters out on (dp, tp) while activations live on its tp slice): where activations may
    arrive, each with its dim names."""
    out = []
    for p in module.parameters():
        if not _C.is_dtensor(p):
            continue
        mesh = p.device_mesh
        candidates = [mesh]
        if mesh.ndim > 1 and mesh.mesh_dim_names:
            candidates += [mesh[n] for n in mesh.mesh_dim_names]
        for m in candidates:
            if all(m != o for o in out):
                out.append(m)
    return out


def _shapes(args):
    """(shape, dtype) per tensor of one microbatch's inputs or outputs (global shapes for
    distributed tensors); None when not given."""
    if args is None:
        return None
    args = args if isinstance(args, (tuple, list)) else (args,)
    return tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else None for a in args)


def _fmt(shapes):
    return ", ".join("None" if s is None else f"{list(s[0])} {str(s[1]).replace('torch.', '')}"
                     for s in shapes)


def _fsdp_modules(module):
    from dtensor.fsdp import FSDPModule
    return [m for m in module.modules() if isinstance(m, FSDPModule)]


class PipelineStage:
    """``submodule`` as stage ``stage_index`` of ``num_stages`` on this rank. ``group``: the
    pipeline group (``mesh.get_group("pp")``, a 1-D DeviceMesh, or None for every rank).
    ``input_args``/``output_args`` are not needed (shapes travel with the tensors, NOTE [pipeline
    transfers]); when given (one microbatch's inputs or outputs: tensors or a tuple of them), each
    microbatch's received inputs and its outputs must match their shapes and dtypes, or the
    step fails naming both stages."""

    def __init__(self, submodule, stage_index, num_stages, device=None, input_args=None,
                 output_args=None, group=None, dw_builder=None):
        if dw_builder is not None:
            raise NotImplementedError("PipelineStage: dw_builder")
        if not 0 <= stage_index < num_stages:
            raise ValueError(f"PipelineStage: stage_index {stage_index} is not in "
                             f"[0, {num_stages})")
        self.submod = submodule
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.device = torch.device(device if device is not None else "cpu")
        self.pp_ranks = _group_ranks(group)
        self.group_size = len(self.pp_ranks)
        if _C.rank() not in self.pp_ranks:
            raise ValueError(f"PipelineStage: rank {_C.rank()} is not in the pipeline group "
                             f"{self.pp_ranks}")
        self.group_rank = self.pp_ranks.index(_C.rank())
        if stage_index % self.group_size != self.group_rank:
            raise ValueError(f"PipelineStage: stage {stage_index} belongs on pipeline rank "
                             f"{stage_index % self.group_size}, this is rank {self.group_rank}")
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1
        self._meshes = _param_meshes(submodule)
        self._expected_in = _shapes(input_args)
        self._expected_out = _shapes(output_args)
        self._n_microbatches = None
        self._local = {}
        self._cache = {}      # microbatch -> (inputs, outputs) kept for the backward
        self._grads_out = {}  # microbatch -> (outputs, their gradients), between I and W
        self._sent = []       # asynchronous sends, waited for at the end of a step
        # What the last step cost beyond compute: bytes this rank sent per direction ("f":
        # activations, "b": their gradients; payload and headers) and seconds it waited in
        # receives (./x bench pp's bubble).
        self.bytes_sent = {"f": 0, "b": 0}
        self.recv_wait_s = 0.0
        self.output_chunks = {}
        self.losses = {}

    def _peer(self, stage):
        return self.pp_ranks[stage % self.group_size]

    def _channel(self, a, b, direction):
        return f"pp{a}>{b}{direction}"

    def _send(self, tensors, stage, direction, mb):
        meta = (self.stage_index, mb, self._n_microbatches)
        if self._peer(stage) == _C.rank():  # a stage of this rank: handed over, not sent
            self._local.setdefault((stage, direction), []).append((meta, [
                None if t is None else t.detach().requires_grad_(t.requires_grad)
                for t in tensors]))
            return
        pending, nbytes = _transfer.send(tensors, self._peer(stage), self.device.type,
                                         self._channel(self.stage_index, stage, direction),
                                         meta)
        self._sent += pending
        self.bytes_sent[direction] += nbytes

    def _recv(self, stage, direction, mb):
        t0 = time.perf_counter()
        if self._peer(stage) == _C.rank():
            meta, out = self._local[(self.stage_index, direction)].pop(0)
        else:
            meta, out = _transfer.recv(self._peer(stage), self._meshes, self.device.type,
                                       self._channel(stage, self.stage_index, direction))
        self.recv_wait_s += time.perf_counter() - t0
        what = "activations" if direction == "f" else "gradients"
        if meta[2] != self._n_microbatches:
            raise RuntimeError(f"PipelineStage {self.stage_index} (rank {_C.rank()}) runs "
                               f"{self._n_microbatches} microbatches a step, stage {meta[0]} "
                               f"runs {meta[2]}: their schedules differ")
        if meta[1] != mb:
            raise RuntimeError(f"PipelineStage {self.stage_index} (rank {_C.rank()}) awaits the "
                               f"{what} of microbatch {mb}, stage {meta[0]} sent microbatch "
                               f"{meta[1]}: their schedules differ")
        return out

    def _start_step(self, n_microbatches, local):
        # local: what this rank's stages hand each other this step, by (receiving stage,
        # direction), shared by the schedule's stages and new each step.
        self._n_microbatches = n_microbatches
        self._local = local
        self.bytes_sent = {"f": 0, "b": 0}
        self.recv_wait_s = 0.0

    def _check(self, tensors, expected, what, mb):
        # what: "inputs" (received from the previous stage) or "outputs" (for the next stage).
        if expected is None:
            return
        got = _shapes(tuple(tensors))
        if got != expected:
            other = self.stage_index + (-1 if what == "inputs" else 1)
            verb = "sent" if what == "inputs" else "would receive"
            raise RuntimeError(
                f"PipelineStage {self.stage_index} (rank {_C.rank()}) declared its microbatch "
                f"{what} as {_fmt(expected)} ({what[:-1]}_args); for microbatch {mb} stage "
                f"{other} {verb} {_fmt(got)}")

    def forward_one_chunk(self, mb, args=(), kwargs=None, train=True):
        """Microbatch ``mb``'s forward: ``args`` on the first stage, else what the previous stage
        sent. Sends the outputs on (not from the last stage); returns them."""
        if self.is_first:
            inputs = tuple(args)
        else:
            inputs = tuple(self._recv(self.stage_index - 1, "f", mb))
            self._check(inputs, self._expected_in, "inputs", mb)
        with torch.set_grad_enabled(train):
            try:
                out = self.submod(*inputs, **(kwargs or {}))
            except Exception as e:
                raise RuntimeError(f"PipelineStage {self.stage_index} (rank {_C.rank()}): the "
                                   f"forward of microbatch {mb} raised {type(e).__name__}: "
                                   f"{e}") from e
        outs = out if isinstance(out, tuple) else (out,)
        self._check(outs, self._expected_out, "outputs", mb)
        if train:
            self._cache[mb] = (inputs, outs)
        if not self.is_last:
            self._send(list(outs), self.stage_index + 1, "f", mb)
        return out

    def _grad_outputs(self, mb, loss):
        inputs, outs = self._cache[mb]
        if self.is_last:
            if loss is None:
                raise RuntimeError("PipelineStage: the last stage's backward needs a loss (give "
                                   "the schedule a loss_fn)")
            return [loss], [None]
        grads = self._recv(self.stage_index + 1, "b", mb)
        pairs = [(o, g) for o, g in zip(outs, grads)
                 if g is not None and isinstance(o, torch.Tensor) and o.requires_grad]
        return [o for o, _ in pairs], [g for _, g in pairs]

    def _sync_fsdp(self, last):
        # FSDP's gradient reduction (and resharding) runs once per step, at the last microbatch's
        # backward, as PyTorch's schedules drive it; earlier ones accumulate unreduced.
        for m in _fsdp_modules(self.submod):
            m.set_requires_gradient_sync(last, recurse=False)
            m.set_is_last_backward(last)

    def _send_input_grads(self, mb, inputs):
        if self.is_first:
            return
        grads = [x.grad if isinstance(x, torch.Tensor) and x.requires_grad else None
                 for x in inputs]
        self._send(grads, self.stage_index - 1, "b", mb)

    def backward_one_chunk(self, mb, loss=None, last_backward=False):
        """Microbatch ``mb``'s whole backward (input and weight gradients); sends the inputs'
        gradients to the previous stage."""
        self._sync_fsdp(last_backward)
        outs, grads = self._grad_outputs(mb, loss)
        inputs, _ = self._cache.pop(mb)
        if outs:
            torch.autograd.backward(outs, grads)
        self._send_input_grads(mb, inputs)

    def backward_input(self, mb, loss=None):
        """Zero-bubble's first half: the inputs' gradients only, sent on at once; the graph is
        kept for backward_weight."""
        self._sync_fsdp(False)
        outs, grads = self._grad_outputs(mb, loss)
        inputs, _ = self._cache.pop(mb)
        leaves = [x for x in inputs if isinstance(x, torch.Tensor) and x.requires_grad]
        if outs and leaves:
            got = torch.autograd.grad(outs, leaves, grads, retain_graph=True, allow_unused=True)
            for x, g in zip(leaves, got):
                x.grad = g
        self._grads_out[mb] = (outs, grads)
        self._send_input_grads(mb, inputs)

    def backward_weight(self, mb, last_backward=False):
        """Zero-bubble's second half: the parameters' gradients of microbatch ``mb``,
        accumulated into their ``.grad`` (NOTE [zero bubble with FSDP])."""
        self._sync_fsdp(last_backward)
        outs, grads = self._grads_out.pop(mb)
        leaves = self._weight_leaves()
        if outs and leaves:
            torch.autograd.backward(outs, grads, inputs=leaves)

    def _weight_leaves(self):
        # NOTE [zero bubble with FSDP]: the graph's leaves for a fully_shard'ed module are its
        # unsharded parameters, which FSDP registers only between unshard and reshard; by the
        # deferred weight pass other microbatches' forwards may have resharded them. So the weight
        # pass differentiates the unsharded parameter objects themselves (FSDP keeps one per
        # parameter for the module's life, refilling its storage at each unshard; its
        # pre-backward hook, on the stage's outputs, unshards again), and accumulates into their
        # .grad as a whole backward would: FSDP's post-backward then keeps the gradient unreduced
        # or, at the step's last weight pass, reduce-scatters the sum, as PyTorch's schedules drive
        # FSDP. The input pass runs with gradient sync off and computes no parameter gradient.
        from dtensor.fsdp._fsdp_state import _state_of
        sharded, leaves = set(), []
        for m in _fsdp_modules(self.submod):
            group = _state_of(m).group
            for fp in group.fsdp_params if group is not None else ():
                sharded.add(id(fp.sharded_param))
                if fp.unsharded_param is not None and fp.unsharded_param.requires_grad:
                    leaves.append(fp.unsharded_param)
        fsdp = {id(t) for t in leaves} | sharded
        leaves += [p for p in self.submod.parameters() if p.requires_grad and id(p) not in fsdp]
        return leaves

    def scale_grads(self, factor):
        for p in self.submod.parameters():
            if p.grad is not None:
                p.grad.div_(factor)

    def _finish_step(self):
        _transfer.wait(self._sent)  # the asynchronous sends completed (their peers received)
        self._sent.clear()
        self._cache.clear()
        self._grads_out.clear()
