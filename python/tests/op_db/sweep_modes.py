"""Where the sweep runs (_Target: ranks as threads, a 1-rank CUDA mesh, or this process as one
rank of WORLD; use_cuda, use_processes) and the layouts a sample runs in (Mode, modes_for,
full_modes_for, _distribute)."""

import os
import socket
import warnings

import torch
from torch.utils._pytree import tree_flatten, tree_map

from dtensor import Replicate, Shard, distribute_tensor, init_device_mesh

WORLD = 4  # use_cuda and use_processes rebind it: other modules read sweep_modes.WORLD


class _Target:
    """Where the sweep runs: samples made on `device`; with `mesh` set, every mode runs in the
    calling thread on that 1-rank mesh (NOTE [sweep on CUDA]); with `processes`, this process is
    one rank of WORLD and `root` the mesh outcomes are exchanged on (NOTE [sweep with
    processes]); else on WORLD ranks as threads."""

    device = "cpu"
    mesh = None
    processes = False
    root = None
    runs = 0  # _run_on_ranks calls so far (processes: the same count on every rank)
    broken = ""  # processes: why the ranks can no longer run in step (the sweep stops)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def use_cuda():
    """Makes the sweep run on CUDA (NOTE [sweep on CUDA]): joins a 1-rank job of this process
    (RANK=0, WORLD_SIZE=1, a free port) and makes its mesh ("cuda", (1,)) once, in this thread.
    False when torch has no GPU."""
    global WORLD
    if not torch.cuda.is_available():
        return False
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    _deterministic_cuda()
    _Target.mesh = init_device_mesh("cuda", (1,))
    _Target.device = "cuda"
    WORLD = 1  # the 1-D modes' mesh
    return True


def use_processes(device):
    """Makes this process one rank of the job its launcher started (NOTE [sweep with processes]):
    the mesh (device, (WORLD_SIZE,)) on the launcher's backend, made once here for the outcome
    exchange. False for "cuda" when torch has no GPU."""
    global WORLD
    if device == "cuda" and not torch.cuda.is_available():
        return False
    if device == "cuda":
        _deterministic_cuda()
    WORLD = int(os.environ["WORLD_SIZE"])
    _Target.device = device
    _Target.processes = True
    _Target.root = init_device_mesh(device, (WORLD,), mesh_dim_names=("sweep",))
    return True


def _runnable(modes):
    """The modes the target's ranks can run: all on ranks as threads, those of a 1-rank mesh
    on the calling thread's mesh, those whose mesh has WORLD ranks on processes."""
    if _Target.processes:
        return [m for m in modes if _numel(m.mesh_shape) == WORLD]
    if _Target.mesh is None:
        return modes
    return [m for m in modes if tuple(m.mesh_shape) == tuple(_Target.mesh.shape)]


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def _mode_mesh(mode):
    if _Target.processes:  # a mesh of its own per mode: NOTE [sweep with processes]
        names = tuple(f"m{_Target.runs}_{d}" for d in range(len(mode.mesh_shape)))
        return init_device_mesh(_Target.device, mode.mesh_shape, mesh_dim_names=names)
    return _Target.mesh if _Target.mesh is not None else init_device_mesh("cpu", mode.mesh_shape)


def _deterministic_cuda():
    """NOTE [sweep on CUDA]: deterministic kernels, and fresh memory filled with NaN, for the
    reference and the engine alike (before any cuBLAS handle exists)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    warnings.filterwarnings("ignore", message=".*does not have a deterministic implementation")


def _is_tensor(x):
    return isinstance(x, torch.Tensor)


class Mode:
    """A layout of a sample's tensor arguments. ``place(i, t)`` gives the placements of the i-th
    tensor leaf of (input, args, kwargs) in flattening order, or None for Replicate."""

    def __init__(self, name, mesh_shape, first, other, place=None):
        self.name = name
        self.mesh_shape = mesh_shape
        self.first = first  # fn(tensor) -> placements (the sample's input leaves)
        self.other = other  # fn(tensor) -> placements (args and kwargs)
        self.place = place  # fn(leaf index, tensor) -> placements or None; overrides first/other


def modes_for(sample, first_sample):
    firsts = [t for t in tree_flatten(sample.input)[0] if _is_tensor(t)]
    ndim = min((t.dim() for t in firsts), default=0)
    rep = lambda t: [Replicate()]  # noqa: E731
    out = [Mode("R", (WORLD,), rep, rep)]
    for d in range(ndim):
        out.append(Mode(f"S{d}", (WORLD,), lambda t, d=d: [Shard(d)], rep))
    others = [t for t in tree_flatten((sample.args, sample.kwargs))[0] if _is_tensor(t)]
    if any(t.dim() > 0 for t in others) and ndim > 0:
        s0 = lambda t: [Shard(0)] if t.dim() > 0 else [Replicate()]  # noqa: E731
        out.append(Mode("all-S0", (WORLD,), s0, s0))
    if first_sample and ndim > 0:
        out.append(Mode("2d", (2, 2), lambda t: [Shard(0), Shard(t.dim() - 1)],
                        lambda t: [Replicate(), Replicate()]))
    return out


def full_modes_for(sample):
    """The full sweep's layouts: every tensor argument sharded in turn on every dim
    (the others Replicate) on a 1-D mesh of WORLD ranks (op_db's sizes make most pieces uneven,
    some empty); every argument Shard(0) at once; and on a 2x2 mesh every tensor argument in
    turn as [Shard(0), Shard(last)] (both mesh dims on one tensor dim when it has one dim) and
    [Replicate, Shard(d)] for every dim d."""
    leaves = [x for x in tree_flatten((sample.input, sample.args, sample.kwargs))[0]]
    rep = lambda t: [Replicate()]  # noqa: E731
    out = [Mode("R", (WORLD,), rep, rep)]

    def only(k, placements):
        return lambda i, t: placements if i == k else None

    for k, t in enumerate(leaves):
        if not _is_tensor(t) or t.dim() == 0:
            continue
        for d in range(t.dim()):
            out.append(Mode(f"arg{k}:S{d}", (WORLD,), rep, rep, only(k, [Shard(d)])))
        out.append(Mode(f"arg{k}:2d[S0,S{t.dim() - 1}]", (2, 2), rep, rep,
                        only(k, [Shard(0), Shard(t.dim() - 1)])))
        for d in range(t.dim()):
            out.append(Mode(f"arg{k}:2d[R,S{d}]", (2, 2), rep, rep,
                            only(k, [Replicate(), Shard(d)])))
    sharded = [k for k, t in enumerate(leaves) if _is_tensor(t) and t.dim() > 0]
    if len(sharded) > 1:
        out.append(Mode("all-S0", (WORLD,), rep, rep,
                        lambda i, t: [Shard(0)] if t.dim() > 0 else None))
    return out


def _distribute(sample, mode, mesh, requires_grad):
    """The sample with every tensor distributed; returns (input, args, kwargs, leaves)."""
    leaves = []

    def conv(fn):
        def f(x):
            if not _is_tensor(x):
                return x
            dt = distribute_tensor(x.detach(), mesh, fn(x), src_data_rank=None)
            if requires_grad and x.requires_grad and x.is_floating_point():
                dt.requires_grad_(True)
                leaves.append((x, dt))
            return dt
        return f

    if mode.place is not None:
        flat, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
        rep = [Replicate()] * len(mode.mesh_shape)
        flat = [conv(lambda t, i=i: mode.place(i, t) or rep)(x) for i, x in enumerate(flat)]
        from torch.utils._pytree import tree_unflatten
        inp, args, kwargs = tree_unflatten(flat, spec)
        return inp, args, kwargs, leaves
    inp = tree_map(conv(mode.first), sample.input)
    args = tree_map(conv(mode.other), sample.args)
    kwargs = tree_map(conv(mode.other), sample.kwargs)
    return inp, args, kwargs, leaves
