"""The op_db sweep: torch's own operator database against the engine.

(One module past 600 lines on purpose: the default tier, the full tier, in-place, foreach,
CUDA and process modes all share its mode runner, comparison and outcome rules; op_db_test,
op_db_full_test, op_db_procs_test and fuzz_ops import or run it as one unit.)

For every OpInfo of ``torch.testing._internal.common_methods_invocations.op_db`` that supports
float32 on CPU, take its first samples, make every tensor argument a distributed tensor under a
set of layouts ("modes"), run the op forward (and backward where the OpInfo supports autograd) on
ranks as threads, and compare with one device: values, shape, dtype, and the distributed
tensor's own metadata (its local piece's shape and dtype for its placements).

Modes (1-D mesh of 4 ranks unless named; of WORLD_SIZE ranks with --ranks-as processes):
  R        every tensor argument Replicate
  S<d>     the first tensor argument(s) (``sample.input``; each element of a list) Shard(d) on
           every dim d it has (uneven sizes included: op_db's sizes are 5, 10, ...), the others
           Replicate
  all-S0   every tensor argument with a dim Shard(0)
  2d       mesh (2,2): the first tensor argument [Shard(0), Shard(last dim)] (first sample only)

Outcomes per OpInfo, worst first:
  wrong    a result differs from one device's (values, shape, dtype or layout metadata): never allowed
  hang     a collective timed out, or ranks disagreed (some raised, others did not): never allowed
  error    the engine raised a clear error (no rule, ...): allowed only when listed in
           op_db_expected_failures.py, with its reason
  pass     every mode and sample matched

In-place variants (``x.add_(y)``, sweep_inplace_one) run the same modes and compare the written
self (never a wrong answer; errors only when listed in INPLACE_EXPECTED_FAILURES); so do torch's
foreach OpInfos (``torch._foreach_*`` and their in-place forms, sweep_foreach), which must pass.

Used by op_db_test.py (the project test) and as a script:
  ./x run python/op_db/sweep.py [--ops NAME,...] [--samples 2] [--verbose] [--time-budget S]
                                [--device cuda]
  python3 python/op_db/sweep.py --ranks-as processes [--world 2] [--backend shm] [--device cuda]
                                [--ops ...]    (a process per rank: NOTE [sweep with processes])

NOTE [sweep on CUDA]: `--device cuda` (the GPU check, tools/gpu/check.sh) sweeps the OpInfos that
support float32 on CUDA with samples made on "cuda", on a 1-rank NCCL mesh of this process
(use_cuda: NCCL refuses two ranks on one GPU, so no ranks as threads): every mode runs in the
calling thread on that mesh, and modes that need more ranks (the 2-D ones) are skipped, so the
1-D modes' Shard(d) holds the whole tensor. What it checks is the engine on CUDA tensors: the
sharding rules and the fallback on them, every local piece on one device's device, values against
the same op on plain CUDA tensors. Random ops are compared by value too: on a CUDA mesh they
draw from the GPU's generator as one device does (NOTE [random on a CUDA mesh]). The sweep turns on
torch's deterministic algorithms (warn_only) on CUDA, in the reference and the engine alike: some
CUDA kernels accumulate with atomics, and some leave parts of their outputs unwritten (the
efficient attention's key gradient for keys past cu_seqlens_k), where one device's value is
whatever the allocator held; with the flag ATen fills fresh memory with NaN, which compares equal,
and those kernels pick their deterministic variants. Without a GPU it says "no GPU" and exits 0
(0 OpInfos).

NOTE [sweep with processes]: `--ranks-as processes` makes every rank its own process, on a mesh
of WORLD_SIZE ranks built on the launcher's backend (shm between CPU processes; cuda_ipc for
processes sharing one GPU with `--device cuda`, where NCCL refuses two ranks on one GPU). Run
without a launcher (no RANK in the environment), the script starts itself under tools/launch.py
(`-n --world`, default 2; `--backend`, default shm or cuda_ipc; PYTHONHASHSEED fixed, the full
sweep's seed passed down) and prints rank 0's lines without the launcher's prefix; under
`./x run -n N` or `./x launch -n N -- python3 sweep.py --ranks-as processes` each process is a
rank. Every rank runs the same OpInfos, samples and modes in the same order (same seed: rank 0's,
agreed at the start); the modes that run are those whose mesh has WORLD_SIZE ranks (on 2 ranks the
1-D modes R, S<d>, all-S0 on (2,); the 2-D ones are skipped, as on the 1-rank CUDA mesh). Each
rank compares its own results with one device as the thread mode does (the same run_mode, _check).
How outcomes are combined: after every mode, each rank's outcome (passed, a Failure, or the
exception's type and message) is all-gathered through the engine itself (_exchange: a fixed-size
uint8 CPU tensor of JSON on the mesh's group, under the collective purpose "op_db sweep outcome"),
and every rank classifies the gathered list with the thread mode's rules (_classify), so all ranks
reach the same outcome and stay in step; rank 0 prints. Why in-band, not per-rank files: when
ranks diverge (one raised, another went on into a collective), the peer's pending collective
meets this rank's exchange, the engine's call check fails both at once (their purposes differ:
"ranks disagree", the group goes on), the exchange is retried and pairs with the peer's own; the
divergence is then reported as `hang` (never `error`: it could be listed) within milliseconds,
and the next mode starts in step. Files would leave the peer waiting out the collective timeout,
which breaks the group for good. Each mode also gets a mesh of its own (fresh dim names), so a
divergence's uneven program digests (NOTE [program digest]) never reach the next mode. A group
that did break (a rank stuck outside collectives, or dead) cannot be mended within the job: the
sweep stops there, says so in the summary and exits 1 (the launcher then ends every rank). Rank
0's time-budget decision and any rank's CUDA failure are agreed the same way after every OpInfo,
with the OpInfo's index and name, so ranks out of step stop with a message instead of mixing.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import warnings

os.environ.setdefault("DTENSOR_COLLECTIVE_TIMEOUT_MS", "20000")

import torch  # noqa: E402

# This folder's modules (expected_failures, fuzz_cases); torch's test utilities import PyPI's
# `expecttest` (tools/requirements.txt; the GPU check carries it in .gpu/python).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
_argv, sys.argv = sys.argv, sys.argv[:1]  # common_utils parses sys.argv when imported
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402
from torch.testing._internal.opinfo.core import SampleInput  # noqa: E402
sys.argv = _argv
from torch.utils._pytree import tree_flatten, tree_map  # noqa: E402

import dtensor  # noqa: E402
from dtensor import DTensor, Replicate, Shard, distribute_tensor, init_device_mesh  # noqa: E402

WORLD = 4
# NOTE [sweep seed]: the default tier draws op_db's samples from a fixed seed (a fixed subset);
# the full sweep (`--full`, ./x test --full) varies it per run: $DTENSOR_SWEEP_SEED when set (to
# replay a failure: every failure's detail names its seed), else a fresh one. torch's, Python's
# and numpy's generators are all seeded with it (op_db draws scalars with Python's random).
SEED = 1234


def run_seed():
    """The full sweep's seed for this run: $DTENSOR_SWEEP_SEED, else drawn from the OS."""
    value = os.environ.get("DTENSOR_SWEEP_SEED")
    return int(value) if value else int.from_bytes(os.urandom(4), "little")


def seed_all(seed):
    import random

    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy
        numpy.random.seed(seed % 2**32)
    except ImportError:
        pass

# op_db's random OpInfos seed torch inside the op (wrapper_set_seed calls torch.manual_seed).
# Ranks that are threads draw from their own generators (NOTE [DTensor random]), which only
# dtensor's manual_seed seeds, so the sweep makes torch.manual_seed seed the calling thread's
# generator instead: what one process per rank gets from torch.manual_seed alone. (Reseeding the
# shared default generator from a rank thread would race with the other ranks' draws.)
_torch_manual_seed = torch.manual_seed


def _manual_seed(seed):
    if threading.current_thread() is threading.main_thread():
        return _torch_manual_seed(seed)
    dtensor._C.manual_seed(int(seed))
    return None


torch.manual_seed = _manual_seed
_cmi = sys.modules["torch.testing._internal.common_methods_invocations"]
_wrapper_set_seed = _cmi.wrapper_set_seed


def _rank_wrapper_set_seed(op, *args, **kwargs):
    """op_db's wrapper_set_seed also saves and restores the default generator's state
    (freeze_rng_state), which rank threads share: on a rank thread, only the seed."""
    if threading.current_thread() is threading.main_thread():
        return _wrapper_set_seed(op, *args, **kwargs)
    torch.manual_seed(42)
    return op(*args, **kwargs)


_cmi.wrapper_set_seed = _rank_wrapper_set_seed
for _mod in list(sys.modules.values()):  # newer torch also binds it in opinfo/definitions/*
    if (getattr(_mod, "__name__", "").startswith("torch.testing._internal.opinfo")
            and getattr(_mod, "wrapper_set_seed", None) is _wrapper_set_seed):
        _mod.wrapper_set_seed = _rank_wrapper_set_seed
RTOL, ATOL = 1e-4, 1e-4
# NOTE [sweep tolerance]: a sharded reduction sums in another order than one device (partial sums,
# then the all-reduce), so an element that is a small difference of large terms differs by a few
# ulps of the terms, not of the element (seen: linalg.multi_dot's gradient, 4.9e-4 off in an
# element near 0 where the problem's values reach 7900; cov's aweights gradient, 2e-13 in float64,
# 2e-4 on one device and -4e-4 here, with values near 40: both float32 results are rounding
# noise). Each comparison therefore also allows SCALE_TOL times the problem's scale: the largest
# magnitude among the sample's tensors, the expected outputs and the tensor compared. A wrong
# sharding errs by the size of the values themselves, four orders of magnitude above.
SCALE_TOL = 5e-5
_problem_scale = [0.0]  # set by run_mode for the mode being checked


def _scale(t):
    """The largest finite magnitude in `t` (0 for empty, integer or boolean tensors)."""
    if t.layout != torch.strided or t.numel() == 0 or not (t.is_floating_point() or t.is_complex()):
        return 0.0  # sparse layouts (SparseCUDA lacks the ops below) count as no scale
    try:
        a = t.detach().abs()
        a = a[torch.isfinite(a)]
        return float(a.max()) if a.numel() else 0.0
    except (RuntimeError, NotImplementedError):
        return 0.0
_op_seed = [SEED]  # the seed ops draw from inside a mode (the run's seed in the full sweep)

# OpInfos whose values are undefined on one device too (uninitialised memory): only metadata is
# compared.
UNDEFINED_VALUES = {
    "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided",
    "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
    "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout",
}


# OpInfos whose one-device gradient is missing (None) where the engine computes one: torch's own
# kernel drops it. Each entry's test checks the engine's gradient against finite differences.
ONE_DEVICE_DROPS_GRAD = {
    "istft": "torch 1.13's istft returns no gradient for `window` on its real-input path, though "
             "the output depends on it; the engine's gradient equals finite differences "
             "(op_db_test.py::test_istft_window_gradient_matches_finite_differences)",
}


# Outputs whose values are undefined on one device too, by OpInfo and flattened output index:
# only their metadata is compared.
UNDEFINED_OUTPUTS = {
    # philox seed and offset: uninitialized memory when dropout_p = 0 (seen on an H200, torch
    # 2.11: "Expected 139832893539328 but got 1753284119").
    "torch.ops.aten._efficient_attention_forward": {2, 3},
}


def opinfo_name(op):
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def _name_of(op):
    """The OpInfo name of `op`, or "" for a bare callable (the foreach cases pass one)."""
    return opinfo_name(op) if hasattr(op, "variant_test_name") else ""


def float32_opinfos(device="cpu"):
    return [op for op in op_db if torch.float32 in op.supported_dtypes(device)]


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


class Failure(Exception):
    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


def _is_tensor(x):
    return isinstance(x, torch.Tensor)


def _local_shape(shape, mesh_shape, placements, coord):
    """The piece shape a rank at `coord` holds (torch.chunk semantics, as PyTorch's Shard)."""
    shape = list(shape)
    for mdim, p in enumerate(placements):
        if p.is_shard():
            d = p.dim if p.dim >= 0 else p.dim + len(shape)
            n = mesh_shape[mdim]
            size = shape[d]
            chunk = -(-size // n) if size else 0
            start = min(chunk * coord[mdim], size)
            shape[d] = max(0, min(start + chunk, size) - start)
    return tuple(shape)


def _describe(x):
    if _is_tensor(x):
        return f"{x.dtype}{list(x.shape)}"
    return repr(x)


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


def _float_outputs(out):
    return [t for t in tree_flatten(out)[0]
            if _is_tensor(t) and (t.is_floating_point() or t.is_complex()) and t.requires_grad]


def _check(what, got, want, mesh, compare_values, rank):
    """Compares one output leaf; raises Failure("wrong", ...)."""
    if _is_tensor(want):
        if not _is_tensor(got):
            raise Failure("wrong", f"{what}: got {_describe(got)}, one device gives {_describe(want)}")
        if isinstance(got, DTensor):
            placements = tuple(got.placements)
            local = got.to_local()
            coord = mesh.get_coordinate() if hasattr(mesh, "get_coordinate") else None
            if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
                raise Failure("wrong", f"{what}: DTensor says {got.dtype}{list(got.shape)} "
                                       f"{list(placements)}, one device gives {_describe(want)}")
            if local.device.type != want.device.type:
                raise Failure("wrong", f"{what}: rank {rank}'s piece lives on {local.device}, "
                                       f"one device gives {want.device}")
            if local.dtype != want.dtype:
                raise Failure("wrong", f"{what}: rank {rank}'s piece is {local.dtype}, the "
                                       f"DTensor says {got.dtype}")
            if coord is not None and not any(p.is_partial() for p in placements):
                exp = _local_shape(want.shape, tuple(mesh.shape), placements, coord)
                if tuple(local.shape) != exp:
                    raise Failure("wrong", f"{what}: rank {rank}'s piece is {list(local.shape)}, "
                                           f"{list(placements)} of {list(want.shape)} gives "
                                           f"{list(exp)}")
            got = got.full_tensor()
        if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
            raise Failure("wrong", f"{what}: got {_describe(got)}, one device gives {_describe(want)}")
        if compare_values:
            try:
                torch.testing.assert_close(got.detach(), want.detach(), rtol=RTOL,
                                           atol=ATOL + SCALE_TOL * max(_scale(want),
                                                                       _problem_scale[0]),
                                           equal_nan=True, check_stride=False)
            except AssertionError as e:
                raise Failure("wrong", f"{what}: values differ: {str(e).splitlines()[0:3]}")
        return
    if isinstance(want, (bool, int, float, complex)) or want is None:
        if isinstance(got, torch.Tensor):
            got = got.full_tensor().item() if isinstance(got, DTensor) else got.item()
        same = (got == want) or (isinstance(want, float) and got != got and want != want)
        if not same and isinstance(want, float) and isinstance(got, float):
            same = abs(got - want) <= ATOL + RTOL * abs(want)
        if not same:
            raise Failure("wrong", f"{what}: got {got!r}, one device gives {want!r}")


def _expected(op, sample, backward):
    """One device's outputs and gradients. NOTE [fresh leaves]: with ``backward`` the op runs on
    fresh leaves (``detach().requires_grad_()``) of the sample's tensors that require grad, as the
    engine's run does (_distribute): the sample's own tensors may be views or reused across
    samples, and one device's autograd then gave no gradient at all where the output depends on
    them (_efficient_attention_forward on an H100, torch 2.11: None for query, key and value;
    a leaf copy of the query got one). Values and strides are the sample's (detach shares
    storage); gradients come back in the sample's flattened order."""
    inp, args, kwargs = sample.input, sample.args, sample.kwargs
    if backward:
        fresh = lambda t: (t.detach().requires_grad_()  # noqa: E731
                           if _is_tensor(t) and t.requires_grad and t.is_floating_point() else t)
        inp, args, kwargs = tree_map(fresh, (inp, args, kwargs))
    torch.manual_seed(_op_seed[0])
    out = op(inp, *args, **kwargs)
    grads = None
    if backward:
        leaves = [t for t in tree_flatten((inp, args, kwargs))[0]
                  if _is_tensor(t) and t.requires_grad and t.is_floating_point()]
        outs = _float_outputs(out)
        if leaves and outs:
            loss = sum(o.sum() for o in outs)
            grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return out, grads


def run_mode(op, sample, mode, want, want_grads, compare_values):
    """Runs one mode on WORLD ranks as threads; raises Failure."""
    world = 1
    for s in mode.mesh_shape:
        world *= s

    _problem_scale[0] = max([_scale(t) for t in tree_flatten(
        (sample.input, sample.args, sample.kwargs, want))[0] if _is_tensor(t)] or [0.0])

    def fn(rank):
        mesh = _mode_mesh(mode)
        backward = want_grads is not None
        inp, args, kwargs, leaves = _distribute(sample, mode, mesh, backward)
        torch.manual_seed(_op_seed[0])
        got = op(inp, *args, **kwargs)
        g_leaves, w_leaves = tree_flatten(got)[0], tree_flatten(want)[0]
        if len(g_leaves) != len(w_leaves):
            raise Failure("wrong", f"{len(g_leaves)} outputs, one device gives {len(w_leaves)}")
        undefined = UNDEFINED_OUTPUTS.get(_name_of(op), ())
        for i, (g, w) in enumerate(zip(g_leaves, w_leaves)):
            _check(f"output {i}", g, w, mesh, compare_values and i not in undefined, rank)
        if backward:
            outs = _float_outputs(got)
            if outs and leaves:
                loss = sum(o.sum() for o in outs)
                grads = torch.autograd.grad(loss, [dt for _, dt in leaves], allow_unused=True)
                want_by_leaf = dict(zip(
                    [id(t) for t in tree_flatten((sample.input, sample.args, sample.kwargs))[0]
                     if _is_tensor(t) and t.requires_grad and t.is_floating_point()],
                    want_grads))
                for k, ((x, _), g) in enumerate(zip(leaves, grads)):
                    w = want_by_leaf.get(id(x))
                    if w is None or g is None:
                        if w is None and _name_of(op) in ONE_DEVICE_DROPS_GRAD:
                            continue
                        if (w is None) != (g is None):
                            raise Failure("wrong", f"grad {k}: got {_describe(g)}, one device "
                                                   f"gives {_describe(w)}")
                        continue
                    _check(f"grad {k}", g, w, mesh, compare_values, rank)
        return True

    _run_on_ranks(world, fn)


def _run_on_ranks(world, fn):
    """Runs fn(rank) on `world` thread ranks (with _Target.mesh set: fn(0) in this thread on it;
    on processes: fn(this rank), every rank's result gathered, NOTE [sweep with processes]);
    classifies what they raised as a Failure, the same on every rank."""
    def guarded(rank):
        try:
            return fn(rank)
        except Exception as e:  # noqa: BLE001  (classified below, over all ranks)
            return e

    _Target.runs += 1
    if _Target.processes:
        if world != WORLD:
            raise Failure("error", f"a mesh of {world} ranks; the sweep runs on {WORLD} "
                                   f"processes (NOTE [sweep with processes])")
        if _Target.broken:
            raise Failure("hang", f"not run: {_Target.broken}")
        results = _gathered(guarded(_Target.root.get_rank()))
    elif _Target.mesh is not None:
        if world != _Target.mesh.size():
            raise Failure("error", f"a mesh of {world} ranks; the sweep runs on one "
                                   f"({_Target.device}, NOTE [sweep on CUDA])")
        results = [guarded(0)]
    else:
        results = dtensor.run_threads(world, guarded)
    _classify(world, results)


def _type_name(e):
    """The exception's type name (for another rank's, the name it had there)."""
    return e.type_name if isinstance(e, _RankError) else type(e).__name__


def _text(e):
    msg = str(e).strip()
    return msg.splitlines()[0] if msg else _type_name(e)


def _classify(world, results):
    """Raises the Failure that every rank's result (True, or what it raised) amounts to."""
    errors = [(r, e) for r, e in enumerate(results) if isinstance(e, Exception)]
    if not errors:
        return
    text = _text

    timeouts = [r for r, e in errors if "did not arrive within the timeout" in str(e)]
    causes = [(r, e) for r, e in errors if r not in timeouts]
    if timeouts:  # ranks diverged: some wait in a collective the others never join
        cause = (f"; rank {causes[0][0]} raised {_type_name(causes[0][1])}: "
                 f"{text(causes[0][1])}" if causes else "")
        where = sorted({text(e).split(" on group")[0] for r, e in errors if r in timeouts})
        raise Failure("hang", f"ranks {timeouts} timed out in a collective ({', '.join(where)})"
                              f"{cause}")
    if len(errors) != world:
        raise Failure("hang", f"only ranks {[r for r, _ in errors]} raised: {text(errors[0][1])}")
    r, e = errors[0]
    if isinstance(e, Failure):
        raise e
    raise Failure("error", f"{_type_name(e)}: {text(e)}")


# ---- ranks as processes: NOTE [sweep with processes] --------------------------------------------
_EXCHANGE_PURPOSE = "op_db sweep outcome"  # NOTE [collective purpose]: never pairs with an op's
_EXCHANGE_BYTES = 4096
_EXCHANGE_TRIES = 16  # a diverged peer meets at most a few exchanges before its own


class _RankError(Exception):
    """What another rank raised (not a Failure): its type's name and message."""

    def __init__(self, type_name, message):
        super().__init__(message)
        self.type_name = type_name


def _exchange(record):
    """Every rank's `record` (JSON), by rank, each with "diverged": whether a peer's collective
    met that rank's exchange first (the ranks diverged). Raises RuntimeError when the group
    cannot exchange."""
    from dtensor import _functional_collectives as funcol

    diverged = False
    for attempt in range(_EXCHANGE_TRIES):
        data = json.dumps(dict(record, diverged=diverged)).encode()
        if len(data) > _EXCHANGE_BYTES:
            raise RuntimeError(f"an outcome record of {len(data)} bytes (at most "
                               f"{_EXCHANGE_BYTES})")
        buf = torch.zeros(_EXCHANGE_BYTES, dtype=torch.uint8)
        buf[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        try:
            with funcol._purpose(_EXCHANGE_PURPOSE):
                out = funcol.all_gather_tensor(buf, 0, _Target.root).wait()
        except Exception as e:  # noqa: BLE001
            if "ranks disagree" in str(e) and attempt + 1 < _EXCHANGE_TRIES:
                diverged = True  # a peer's op collective met this exchange: both failed; again
                continue
            raise RuntimeError(f"the outcome exchange failed: {_text(e)}") from e
        rows = out.reshape(WORLD, _EXCHANGE_BYTES)
        return [json.loads(bytes(row.tolist()).rstrip(b"\0").decode()) for row in rows]
    raise AssertionError("unreachable")


def _record(result, at):
    """This rank's result as an exchange record (messages cut to fit)."""
    if isinstance(result, Failure):
        kind, name, msg = "failure", result.kind, str(result)
    elif isinstance(result, Exception):
        kind, name, msg = "raised", _type_name(result), str(result)
    else:
        kind, name, msg = "passed", "", ""
    return {"at": at, "kind": kind, "name": name, "message": msg[:1500]}


def _result(rec):
    if rec["kind"] == "failure":
        return Failure(rec["name"], rec["message"])
    if rec["kind"] == "raised":
        return _RankError(rec["name"], rec["message"])
    return True


def _gathered(mine):
    """Every rank's result of this mode (a list by rank, as dtensor.run_threads gives), from
    this rank's `mine`; raises Failure("hang") when the ranks diverged, are out of step or
    cannot exchange (then _Target.broken says why and the sweep stops)."""
    rank = _Target.root.get_rank()
    try:
        recs = _exchange(_record(mine, _Target.runs))
    except RuntimeError as e:
        _Target.broken = str(e)
        if mine is True:
            raise Failure("hang", f"rank {rank} passed; {e}")
        raise Failure("hang", f"rank {rank} raised {_type_name(mine)}: {_text(mine)}; the "
                              f"outcomes could not be gathered (the group is broken)")
    results = [_result(r) for r in recs]
    at = [r["at"] for r in recs]
    if len(set(at)) != 1:
        _Target.broken = "ranks out of step: " + ", ".join(
            f"rank {r} at mode run #{x}" for r, x in enumerate(at))
        raise Failure("hang", _Target.broken)
    if any(r["diverged"] for r in recs):
        # The ranks whose op's collective met a peer's exchange say so in their error; the
        # others say what made them leave the op early.
        met = [r for r, x in enumerate(results) if _EXCHANGE_PURPOSE in str(x)]
        said = "; ".join(f"rank {r} {_said(x)}" for r, x in enumerate(results) if r not in met)
        detail = f"ranks diverged: {said}"
        if met:
            detail += (f"; while ranks {met} were in a collective of the op, which met that "
                       f"outcome exchange ({_text(results[met[0]])[:160]}...)")
        raise Failure("hang", detail)
    return results


def _said(x):
    if x is True:
        return "passed"
    if isinstance(x, Failure):
        return f"{x.kind}: {_text(x)}"
    return f"raised {_type_name(x)}: {_text(x)[:200]}"


def _agreed(what, value):
    """Every rank's `value`, by rank, after checking that every rank is at `what` (processes;
    on threads: [value]). On failure _Target.broken says why and the list holds only `value`."""
    if not _Target.processes:
        return [value]
    if not _Target.broken:
        try:
            recs = _exchange({"at": what, "value": value})
            if len({json.dumps(r["at"]) for r in recs}) == 1:
                return [r["value"] for r in recs]
            _Target.broken = ("ranks out of step: " +
                              ", ".join(f"rank {r} at {x['at']}" for r, x in enumerate(recs)))
        except RuntimeError as e:
            _Target.broken = str(e)
    return [value]


def _clone_args(sample):
    clone = lambda t: t.detach().clone() if _is_tensor(t) else t  # noqa: E731
    return tree_map(clone, sample.input), tree_map(clone, sample.args), tree_map(clone,
                                                                                 sample.kwargs)


class Outcome:
    """The worst result over an OpInfo's samples and modes: pass < error < hang < wrong."""

    RANK = {"pass": 0, "error": 1, "hang": 2, "wrong": 3}

    def __init__(self):
        self.kind, self.detail = "pass", ""

    def add(self, kind, detail):
        if self.RANK[kind] > self.RANK[self.kind]:
            self.kind, self.detail = kind, detail

    def attempt(self, label, run):
        """Runs one mode, recording a Failure; True when the OpInfo's sweep must stop there."""
        try:
            run()
        except Failure as f:
            self.add(f.kind, f"{label}: {f}")
        return self.kind in ("wrong", "hang")

    def result(self):
        return self.kind, self.detail


def _inplace_expected(fn, sample):
    """The in-place variant's written self on one device, or None when one device refuses it."""
    inp, args, kwargs = _clone_args(sample)

    def run():
        torch.manual_seed(SEED)
        fn(inp, *args, **kwargs)

    try:
        run()
    except Exception:  # noqa: BLE001
        return None
    return inp


def run_inplace_mode(fn, sample, mode, want_self, compare_values):
    """The in-place variant on distributed arguments: the written self (each element of a list)
    must hold one device's values. Raises Failure."""
    world = 1
    for s in mode.mesh_shape:
        world *= s

    def body(rank):
        mesh = _mode_mesh(mode)
        inp, args, kwargs = _clone_args(sample)
        inp, args, kwargs, _ = _distribute(SampleInput(inp, args=args, kwargs=kwargs), mode,
                                           mesh, False)
        torch.manual_seed(SEED)
        fn(inp, *args, **kwargs)
        for i, (g, w) in enumerate(zip(tree_flatten(inp)[0], tree_flatten(want_self)[0])):
            _check(f"self {i} after the in-place variant", g, w, mesh, compare_values, rank)
        return True

    _run_on_ranks(world, body)


def _sweep_inplace(fn, sample_list, compare_values):
    """(outcome, detail) of the in-place variant ``fn`` over the samples one device accepts."""
    out = Outcome()
    for si, sample in enumerate(sample_list):
        if not any(_is_tensor(t) for t in tree_flatten(sample.input)[0]):
            continue
        want_self = _inplace_expected(fn, sample)
        if want_self is None:
            continue
        for mode in _runnable(modes_for(sample, si == 0)):
            if out.attempt(f"in-place sample {si} mode {mode.name}",
                           lambda: run_inplace_mode(fn, sample, mode, want_self, compare_values)):
                return out.result()
    return out.result()


# ---- the _foreach_* ops (torch's foreach OpInfos) -----------------------------------------------
# torch 1.13's ForeachFuncInfo samples are bare tensor lists; the arguments of each family are
# built here as torch's test_foreach does: a second list, a scalar or a scalar list (binary), two
# lists and a value (pointwise), an ord (norm). Values lie in [0.5, 1.5) (no zero divisors).

class ForeachCase:
    def __init__(self, info, samples):
        self.info = info
        self.name = info.name
        self.variant_test_name = ""
        self.samples = samples


def _foreach_lists(seed, count=3):
    g = torch.Generator().manual_seed(seed)
    shapes = [(5, 4), (3,), (6, 2)][:count]
    return [(torch.rand(s, generator=g) + 0.5).to(_Target.device) for s in shapes]


def foreach_cases():
    from torch.testing._internal import common_methods_invocations as cmi
    cases = []
    x = lambda: _foreach_lists(1)  # noqa: E731
    y = lambda: _foreach_lists(2)  # noqa: E731
    z = lambda: _foreach_lists(3)  # noqa: E731
    for info in cmi.foreach_unary_op_db:
        cases.append(ForeachCase(info, [SampleInput(x())]))
    for info in cmi.foreach_binary_op_db:
        cases.append(ForeachCase(info, [SampleInput(x(), args=(y(),)),
                                        SampleInput(x(), args=(1.5,)),
                                        SampleInput(x(), args=([0.5, 2.0, -1.0],))]))
    for info in cmi.foreach_pointwise_op_db:
        cases.append(ForeachCase(info, [SampleInput(x(), args=(y(), z()), kwargs={"value": 0.5}),
                                        SampleInput(x(), args=(y(), z(), [0.5, 2.0, -1.0]))]))
    for info in getattr(cmi, "foreach_minmax_op_db", []):  # folded into the others in torch 2.x
        cases.append(ForeachCase(info, [SampleInput(x(), args=(y(),))]))
    for info in getattr(cmi, "foreach_reduce_op_db", []):
        cases.append(ForeachCase(info, [SampleInput(x(), args=(2,))]))
    return cases


def sweep_foreach(case):
    """(outcome, detail) for one foreach op: its out-of-place and in-place variants."""
    dtensor.debug.reset_fallback_counts()
    out = Outcome()
    for si, sample in enumerate(case.samples):
        try:
            want = case.info.op(*_clone_args(sample)[:1], *sample.args, **sample.kwargs)
        except Exception:  # noqa: BLE001
            continue
        for mode in _runnable(modes_for(sample, si == 0)):
            if out.attempt(f"sample {si} mode {mode.name}",
                           lambda: run_mode(case.info.op, sample, mode, want, None, True)):
                return out.result()
    if case.info.inplace_variant is not None:
        out.add(*_sweep_inplace(case.info.inplace_variant, case.samples, True))
    return out.result()


def sweep_one(op, samples=3):
    """Returns (outcome, detail) for one OpInfo; fallback_ops() then names the ATen ops it ran by
    the replicate fallback."""
    dtensor.debug.reset_fallback_counts()
    return _sweep_one(op, samples)


def fallback_ops():
    """The ATen ops the last sweep_one ran by the replicate fallback (none: native rules only)."""
    return sorted(dtensor.debug.fallback_counts())


def _sweep_one(op, samples, full=False, seed=SEED, deadline=None):
    """The default tier: the first `samples` samples (fixed seed) in modes_for's layouts. The full
    sweep (full=True): every sample drawn with `seed`, in full_modes_for's layouts; stops early
    (outcome as far as it went, "(stopped at the time budget)" noted) past `deadline`."""
    backward = op.supports_autograd
    seed_all(seed)
    try:
        sample_list = list(op.sample_inputs(_Target.device, torch.float32,
                                            requires_grad=backward))
    except Exception as e:  # noqa: BLE001
        return "skip", f"sample_inputs raised {type(e).__name__}: {e}"
    if not full:
        sample_list = sample_list[:samples]
    out = Outcome()
    compare_values = op.name not in UNDEFINED_VALUES
    where = f"seed {seed} " if full else ""
    _op_seed[0] = seed
    try:
        for si, sample in enumerate(sample_list):
            if not any(_is_tensor(t) for t in
                       tree_flatten((sample.input, sample.args, sample.kwargs))[0]):
                continue  # a factory call: nothing to distribute
            try:
                want, want_grads = _expected(op, sample, backward)
            except Exception:  # noqa: BLE001  (one device refuses this sample too)
                continue
            modes = full_modes_for(sample) if full else modes_for(sample, si == 0)
            for mode in _runnable(modes):
                if deadline is not None and _agreed(
                        ["deadline", opinfo_name(op), si, mode.name],
                        time.monotonic() > deadline)[0]:
                    kind, detail = out.result()
                    return kind, (detail + " " if detail else "") + (
                        f"(stopped at the time budget in {where}sample {si})")
                if out.attempt(f"{where}sample {si} mode {mode.name}",
                               lambda: run_mode(op, sample, mode, want, want_grads, compare_values)):
                    return out.result()
    finally:
        _op_seed[0] = SEED
    return out.result()


def sweep_full_one(op, seed, budget_s=None):
    """(outcome, detail) of the full sweep for one OpInfo (every sample, every tensor argument
    sharded in turn on every dim, 1-D and 2-D meshes), samples drawn with `seed`; fallback_ops()
    then names what ran by the replicate fallback."""
    dtensor.debug.reset_fallback_counts()
    deadline = None if budget_s is None else time.monotonic() + budget_s
    return _sweep_one(op, 0, full=True, seed=seed, deadline=deadline)


def sweep_inplace_one(op, samples=3):
    """(outcome, detail) of an OpInfo's in-place variant (``x.add_``): the written self must hold
    one device's values in every mode; "skip" when the OpInfo has none."""
    if op.inplace_variant is None:
        return "skip", "no in-place variant"
    torch.manual_seed(SEED)
    try:
        sample_list = list(op.sample_inputs(_Target.device, torch.float32,
                                            requires_grad=False))[:samples]
    except Exception as e:  # noqa: BLE001
        return "skip", f"sample_inputs raised {type(e).__name__}: {e}"
    return _sweep_inplace(op.inplace_variant, sample_list, op.name not in UNDEFINED_VALUES)


def _no_gpu(on):
    print("no GPU: torch.cuda.is_available() is False, nothing to sweep on cuda", flush=True)
    print(f"summary: {{}} in 0s{on} (0 OpInfos: no GPU)", flush=True)


def _launched():
    """Whether a launcher started this process as a rank (torchrun's variables)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _launch_self(a, argv):
    """This script on `--world` processes under tools/launch.py (NOTE [sweep with processes]);
    prints rank 0's lines without the launcher's "[rank 0] " prefix (the others' with it) and
    returns the launcher's exit status."""
    on = f" on {a.world} {a.device} processes"
    if a.device == "cuda" and not torch.cuda.is_available():
        _no_gpu(on)
        return 0
    here = os.path.dirname(os.path.abspath(__file__))
    launcher = os.environ.get("LAUNCH_PY") or os.path.join(here, "..", "..", "tools", "launch.py")
    backend = a.backend or ("cuda_ipc" if a.device == "cuda" else "shm")
    if a.full and a.seed is None:
        argv = argv + ["--seed", str(run_seed())]
    cmd = [sys.executable, launcher, "-n", str(a.world), "--backend", backend, "--",
           sys.executable, os.path.abspath(__file__)] + argv
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
               PYTHONHASHSEED="0")  # exec'd ranks draw op_db's samples alike
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace")
    try:
        for line in proc.stdout:
            print(line[len("[rank 0] "):] if line.startswith("[rank 0] ") else line, end="",
                  flush=True)
        return proc.wait()
    finally:
        if proc.poll() is None:  # interrupted here: the launcher stops its ranks
            proc.terminate()
            proc.wait()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ops", default="")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--full", action="store_true",
                        help="the full sweep: every sample, every argument, 1-D and 2-D meshes")
    parser.add_argument("--seed", type=int, default=None,
                        help="the full sweep's seed (default $DTENSOR_SWEEP_SEED or a fresh one)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: samples on the GPU, a 1-rank mesh of this process "
                             "(NOTE [sweep on CUDA]), or with --ranks-as processes ranks "
                             "sharing the GPU")
    parser.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                        help="start no OpInfo after this many seconds (the summary says so)")
    parser.add_argument("--ranks-as", choices=("threads", "processes"), default="threads",
                        help="processes: each rank its own process (NOTE [sweep with processes])")
    parser.add_argument("--world", type=int, default=None,
                        help="processes: the number of ranks (default: the launcher's "
                             "WORLD_SIZE; started here without a launcher: 2)")
    parser.add_argument("--backend", default=None,
                        help="processes started here: the launcher's backend (default shm, "
                             "cuda_ipc with --device cuda)")
    a = parser.parse_args()
    procs = a.ranks_as == "processes"
    if not procs and (a.world is not None or a.backend is not None):
        parser.error("--world and --backend go with --ranks-as processes")
    if procs and not _launched():
        a.world = a.world or 2
        if a.world < 1:
            parser.error("--world must be at least 1")
        return _launch_self(a, sys.argv[1:])
    seed = a.seed if a.seed is not None else run_seed()
    on = ""
    say = print  # rank 0 prints (every rank reaches the same outcomes)
    if procs:
        world = int(os.environ["WORLD_SIZE"])
        if a.world is not None and a.world != world:
            print(f"--world {a.world}, but the launcher started {world} ranks", file=sys.stderr)
            return 2
        on = f" on {world} {a.device} processes"
        if not use_processes(a.device):
            if os.environ.get("RANK") == "0":
                _no_gpu(on)
            return 0
        from dtensor import _functional_collectives as funcol
        backend = funcol.context().backend
        if a.backend is not None and a.backend != backend:
            print(f"--backend {a.backend}, but the ranks run on {backend}", file=sys.stderr)
            return 2
        on += f" ({backend})"
        if _Target.root.get_rank() != 0:
            say = lambda *args, **kwargs: None  # noqa: E731
        seed = _agreed("seed", seed)[0]  # rank 0's
        where = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
        say(f"sweep on {where}: {world} processes on {backend}, the modes of a {world}-rank mesh "
            f"(NOTE [sweep with processes])", flush=True)
    elif a.device == "cuda":
        on = " on cuda"
        if not use_cuda():
            _no_gpu(on)
            return 0
        print(f"sweep on {torch.cuda.get_device_name()}: a 1-rank mesh of this process, the 1-D "
              f"modes (NOTE [sweep on CUDA])", flush=True)
    if a.full:
        say(f"full sweep, seed {seed} (replay: --seed {seed})", flush=True)
    wanted = set(a.ops.split(",")) if a.ops else None
    counts = {}
    t0 = time.time()
    ops = [op for op in float32_opinfos(a.device)
           if not wanted or opinfo_name(op) in wanted or op.name in wanted]
    stopped = ""
    for i, op in enumerate(ops):
        name = opinfo_name(op)
        if not procs and a.time_budget is not None and time.time() - t0 > a.time_budget:
            stopped = (f"; stopped at the time budget ({a.time_budget:g}s): {len(ops) - i} of "
                       f"{len(ops)} OpInfos not started")
            break
        t1 = time.time()
        outcome, detail = sweep_full_one(op, seed) if a.full else sweep_one(op, a.samples)
        cuda_failed = ""
        if a.device == "cuda":
            try:  # an asynchronous CUDA error (a device-side assert) breaks every later op
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                cuda_failed = str(e).strip().splitlines()[0]
        over = False
        if procs:  # every rank at this OpInfo, with one outcome; rank 0's clock decides
            over = a.time_budget is not None and time.time() - t0 > a.time_budget
            got = _agreed(["OpInfo", i, name], [outcome, cuda_failed, over])
            if len({g[0] for g in got}) > 1:
                outcome, detail = "hang", "ranks disagree on the outcome: " + ", ".join(
                    f"rank {r} {g[0]}" for r, g in enumerate(got))
            cuda_failed = next((f"rank {r}: {g[1]}" if len(got) > 1 else g[1]
                                for r, g in enumerate(got) if g[1]), "")
            over = got[0][2]
        fallbacks = fallback_ops()
        if outcome == "pass" and not fallbacks:
            outcome = "native"  # passed on native rules alone
        counts[outcome] = counts.get(outcome, 0) + 1
        via = f" (fallback: {','.join(fallbacks)})" if fallbacks else ""
        say(f"{outcome:6s} {name:45s} {time.time() - t1:6.2f}s {detail[:300]}{via}", flush=True)
        if cuda_failed:
            stopped = (f"; CUDA failed after {name}: {cuda_failed}; "
                       f"{len(ops) - i - 1} OpInfos not started")
            break
        if procs and _Target.broken:
            stopped = (f"; stopped after {name}, the ranks cannot go on together: "
                       f"{_Target.broken[:300]}; {len(ops) - i - 1} OpInfos not started")
            break
        if over and i + 1 < len(ops):
            stopped = (f"; stopped at the time budget ({a.time_budget:g}s): {len(ops) - i - 1} "
                       f"of {len(ops)} OpInfos not started")
            break
    say(f"summary: {counts} in {time.time() - t0:.0f}s{on} (native: passed with no op run by the "
        f"replicate fallback){stopped}", flush=True)
    return 1 if procs and _Target.broken else 0


if __name__ == "__main__":
    sys.exit(main())
