"""The engine as a torch.distributed backend: ``init_process_group(backend="dtensor")``.

NOTE [dtensor c10d backend]: PyTorch's RFC on c10d extensions (pytorch#39662) lets a library plug
its collectives into torch.distributed through ``Backend.register_backend(name, creator)``; the
creator gets (store, rank, size, timeout) and returns a ``ProcessGroup``. torch 1.13 lets a
Python subclass of ``ProcessGroup`` stand in (its C++ trampoline forwards the virtual calls, so
DistributedDataParallel's C++ reducer reaches it too), and ``_create_work_from_future`` makes its
``Work``. Each method runs the engine's functional collective (shm between processes of one
host, Gloo across hosts by ``DTENSOR_BACKEND=c10d``, NCCL on CUDA) and writes the result into the
caller's tensors, as c10d's collectives do; the returned work is already complete.

The engine's own rank context joins the job once per process, as a client of the TCPStore that
``init_process_group``'s env:// rendezvous hosts at MASTER_ADDR:MASTER_PORT (so env:// is
needed). A group of ``new_group(ranks, backend="dtensor")`` learns its members' global ranks
through the group's store and makes the engine group of those ranks. ``send``/``recv`` raise:
the engine has no point-to-point collectives.
"""

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup, _create_work_from_future

from dtensor import _C
from dtensor import _functional_collectives as fc

__all__ = ["DTensorProcessGroup", "create"]

_OPS = [
    (dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.AVG, "avg"), (dist.ReduceOp.PRODUCT, "product"),
    (dist.ReduceOp.MIN, "min"), (dist.ReduceOp.MAX, "max"), (dist.ReduceOp.BAND, "band"),
    (dist.ReduceOp.BOR, "bor"), (dist.ReduceOp.BXOR, "bxor"),
]


def _op_name(op):
    for c10d_op, name in _OPS:
        if op == c10d_op:
            return name
    raise ValueError(f"dtensor backend: unsupported reduce op {op}")


def _done(result):
    fut = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def _engine_context(timeout):
    """This process's engine context: the one already made, else a new one joined through the
    env:// store (every rank a client of it: torch's rank 0 already hosts it)."""
    if fc._context is not None or _C.has_context():
        return fc.context()
    if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
        raise RuntimeError("dtensor backend: init_process_group must use the env:// rendezvous "
                           "(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), as torchrun and "
                           "./x launch set it")
    key, old = "TORCHELASTIC_USE_AGENT_STORE", os.environ.get("TORCHELASTIC_USE_AGENT_STORE")
    os.environ[key] = "True"  # the store is hosted already: join as a client (launch_env.cc)
    try:
        return fc.init_from_env("", int(timeout.total_seconds() * 1000))
    finally:
        if old is None:
            del os.environ[key]
        else:
            os.environ[key] = old


class DTensorProcessGroup(ProcessGroup):
    """A c10d ProcessGroup whose collectives run on the engine (NOTE [dtensor c10d backend])."""

    def __init__(self, store, rank, size, timeout=timedelta(minutes=5)):
        super().__init__(rank, size)
        ctx = _engine_context(timeout)
        store.set(f"dtensor_global_rank_{rank}", str(ctx.rank))
        ranks = [int(store.get(f"dtensor_global_rank_{r}")) for r in range(size)]
        if size == ctx.world_size and ranks == list(range(size)):
            self._group = fc.WORLD
        else:
            self._group = fc.new_group(ranks, "c10d")
        self._ranks = ranks
        self._buffers = {}

    def getBackendName(self):  # noqa: N802  (c10d's name)
        return "dtensor"

    def _get_backend_name(self):
        return "dtensor"

    # ---- collectives: results written into the caller's tensors -----------------------------

    def broadcast(self, tensors, opts):
        for t in tensors:
            t.copy_(fc.broadcast(t.contiguous(), opts.rootRank, self._group, async_op=False))
        return _done(tensors)

    def _scratch(self, t):
        """A reused buffer of t's numel, dtype and device: collectives write into it with no
        fresh memory (whose first touch costs a page fault per 4 KiB)."""
        key = (t.dtype, t.device)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < t.numel():
            buf = self._buffers[key] = torch.empty(t.numel(), dtype=t.dtype, device=t.device)
        return buf[:t.numel()]

    def allreduce(self, tensors, opts):
        op = _op_name(opts.reduceOp)
        for t in tensors:
            if t.is_contiguous():  # in place, no copy (NOTE [in-place all_reduce])
                _C.all_reduce_into(t, t, op, self._group)
                continue
            out = self._scratch(t)
            _C.all_reduce_into(t.contiguous(), out, op, self._group)
            t.copy_(out.view(t.shape))
        return _done(tensors)

    def allreduce_coalesced(self, tensors, opts):
        return self.allreduce(tensors, opts)

    def reduce(self, tensors, opts):
        op = _op_name(opts.reduceOp)
        for t in tensors:
            out = fc.all_reduce(t.contiguous(), op, self._group, async_op=False)
            if self.rank() == opts.rootRank:
                t.copy_(out)
        return _done(tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        for outs, t in zip(output_tensors, input_tensors):
            gathered = fc.all_gather_into_tensor(t.contiguous().unsqueeze(0), 0, self._group,
                                                 async_op=False)
            for o, g in zip(outs, gathered.unbind(0)):
                o.copy_(g)
        return _done(output_tensors)

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        return self.allgather(output_lists, input_list, opts)

    def _allgather_base(self, output, input, opts=None):
        if output.is_contiguous():  # straight into the caller's tensor (in place too)
            _C.all_gather_into(input.contiguous(), output, self._group)
            return _done([output])
        output.copy_(fc.all_gather_into_tensor(input.contiguous(), 0, self._group, async_op=False)
                     .view(output.shape))
        return _done([output])

    def reduce_scatter(self, output_tensors, input_tensors, opts):
        op = _op_name(opts.reduceOp)
        for o, ins in zip(output_tensors, input_tensors):
            stacked = torch.stack([t.contiguous() for t in ins])
            o.copy_(fc.reduce_scatter_tensor(stacked, op, 0, self._group,
                                            async_op=False).squeeze(0))
        return _done(output_tensors)

    def _reduce_scatter_base(self, output, input, opts):
        op = _op_name(opts.reduceOp)
        output.copy_(fc.reduce_scatter_tensor(input.contiguous(), op, 0, self._group,
                                              async_op=False)
                     .view(output.shape))
        return _done([output])

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        out = fc.all_to_all_single(input.contiguous(), output_split_sizes or None,
                                   input_split_sizes or None, self._group, async_op=False)
        output.copy_(out.view(output.shape))
        return _done([output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        flat = torch.cat([t.contiguous().reshape(-1) for t in input_tensors])
        out = fc.all_to_all_single(flat, [o.numel() for o in output_tensors],
                                   [t.numel() for t in input_tensors], self._group, async_op=False)
        for o, piece in zip(output_tensors, out.split([o.numel() for o in output_tensors])):
            o.copy_(piece.view(o.shape))
        return _done(output_tensors)

    def gather(self, output_tensors, input_tensors, opts):
        for t in input_tensors:
            gathered = fc.all_gather_into_tensor(t.contiguous().unsqueeze(0), 0, self._group,
                                                 async_op=False)
            if self.rank() == opts.rootRank:
                for o, g in zip(output_tensors[0], gathered.unbind(0)):
                    o.copy_(g)
        return _done(output_tensors)

    def scatter(self, output_tensors, input_tensors, opts):
        for i, o in enumerate(output_tensors):
            if self.rank() == opts.rootRank:
                whole = torch.stack([t.contiguous() for t in input_tensors[i]])
            else:
                whole = torch.empty((self.size(),) + tuple(o.shape), dtype=o.dtype,
                                    device=o.device)
            whole = fc.broadcast(whole, opts.rootRank, self._group, async_op=False)
            o.copy_(whole[self.rank()])
        return _done(output_tensors)

    def barrier(self, opts=None):
        # The engine's barrier: no tensor of the caller's making (a CPU one would not reach an
        # NCCL group: NOTE [mesh device]).
        _C.barrier(fc._group_name(self._group))
        return _done([])

    def send(self, tensors, dst, tag):
        raise RuntimeError("dtensor backend: send is not supported (the engine has no "
                           "point-to-point collectives); use a gloo group for it")

    def recv(self, tensors, src, tag):
        raise RuntimeError("dtensor backend: recv is not supported (the engine has no "
                           "point-to-point collectives); use a gloo group for it")


def create(store, rank, size, timeout):
    """The creator registered as backend "dtensor" (torch.distributed.Backend.register_backend)."""
    return DTensorProcessGroup(store, rank, size, timeout)


def register():
    if hasattr(dist.Backend, "DTENSOR"):
        return
    import inspect

    # torch 2.x asks which devices a backend serves (and warns when not told): the engine's
    # collectives take CPU tensors (shm, c10d) and CUDA tensors (nccl).
    if "devices" in inspect.signature(dist.Backend.register_backend).parameters:
        dist.Backend.register_backend("dtensor", create, devices=["cpu", "cuda"])
    else:
        dist.Backend.register_backend("dtensor", create)
