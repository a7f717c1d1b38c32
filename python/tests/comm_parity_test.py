"""Never more communication than PyTorch (NOTE [kept Partials] in sharding_prop/propagator_search.cc,
NOTE [leaf gradients keep the parameter's placements] in dtensor/api.cc).

Four processes run every case twice, on the engine (shm) and on PyTorch 2.11's own DTensor
(Gloo, torch.distributed's default group), from the same local tensors. Each case's global
result must equal one device's on both; the engine's collective count (its CommDebugMode) must be
at most PyTorch's (PyTorch's CommDebugMode, same run); and where the case says so, the engine's
output placements must be PyTorch's. The cases are those where the engine once reduced a Partial
that PyTorch keeps pending: a Replicate added to a Partial (PyTorch partitions it for free), a
Partial(avg) times a scalar, a Partial(sum) times a Replicate, maximum/minimum and max/amax of
Partial(max/min), and a sequence-parallel LayerNorm whose weight gradient PyTorch leaves
Partial(sum) (the engine all-reduced it in the backward), and p-norms (vector_norm, dist,
clip_grad_norm_) that PyTorch keeps as its _NormPartial where the engine gathered. Partial inputs hold a different piece on
every rank (rank r: base * (r + 1) + r), so a missed or repeated reduction shows in the values.
"""

import os

import pytest

from launch_ranks import run_on_ranks

WORKER = r'''
import copy, os, warnings
import torch
import torch.distributed as dist
from torch import nn
import torch.nn.functional as F

# PyTorch's CommDebugMode hooks modules whose inputs need no gradient: its notice is noise here.
warnings.filterwarnings("ignore", message="Full backward hook is firing")
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['PARITY_PORT']}",
                        rank=rank, world_size=world)

import dtensor, dtensor.debug, dtensor.parallel
import torch.distributed.tensor as ptd
import torch.distributed.tensor.debug as ptdebug
import torch.distributed.tensor.parallel as ptpar
from torch.distributed.device_mesh import init_device_mesh as pt_mesh


class Side:
    def __init__(self, mod, debug, par, mesh):
        self.mod, self.debug, self.par, self.mesh = mod, debug, par, mesh

    def P(self, base, op="sum"):  # rank r holds base * (r + 1) + r
        return self.mod.DTensor.from_local(base * (rank + 1) + rank, self.mesh,
                                           [self.mod.Partial(op)], run_check=False)

    def R(self, t):
        return self.mod.DTensor.from_local(t, self.mesh, [self.mod.Replicate()], run_check=False)


def reduced(base, op):
    pieces = torch.stack([base * (r + 1) + r for r in range(world)])
    return {"sum": pieces.sum(0), "avg": pieces.mean(0), "max": pieces.amax(0),
            "min": pieces.amin(0)}[op]


engine = Side(dtensor, dtensor.debug, dtensor.parallel, dtensor.init_device_mesh("cpu", (world,)))
torch_side = Side(ptd, ptdebug, ptpar, pt_mesh("cpu", (world,)))
torch.manual_seed(0)
a, b = torch.randn(8, 8), torch.randn(8, 8)
g = torch.rand(4, 2 * world, 8)
c = torch.randn(8, 16)
idx = torch.tensor([[3, 0, 2], [1, 3, 3], [0, 2, 1], [2, 2, 0]])


def sequence_parallel_layer_norm(X):
    norm = X.par.parallelize_module(copy.deepcopy(nn.LayerNorm(8)), X.mesh, X.par.SequenceParallel())
    out = norm(X.mod.distribute_tensor(g, X.mesh, [X.mod.Shard(1)]))
    out.backward(torch.ones_like(out))
    return norm.weight.grad


def layer_norm_weight_grad():
    w = nn.LayerNorm(8)
    w(g).backward(torch.ones_like(g))
    return w.weight.grad


def sliced_columns_backward(X):
    # PyTorch's test_slice: the gradient of S(1)[:, 8:] given as Shard(1) goes back in one
    # collective (the engine: slice_backward leaves Partial(sum), then one reduce_scatter).
    w = X.mod.distribute_tensor(c.clone().requires_grad_(), X.mesh, [X.mod.Shard(1)])
    out = w[:, 8:]
    out.backward(X.mod.ones(out.shape, device_mesh=X.mesh, placements=[X.mod.Shard(1)]))
    return w.grad


def sliced_columns_grad():
    w = c.clone().requires_grad_()
    w[:, 8:].backward(torch.ones(8, 8))
    return w.grad


def clip_grad_norm_case(X):
    params = [nn.Parameter(X.mod.distribute_tensor(t.clone(), X.mesh, [X.mod.Shard(0)]))
              for t in (a, c)]
    for p, t in zip(params, (a, c)):
        p.grad = X.mod.distribute_tensor(t * 3, X.mesh, [X.mod.Shard(0)])
    return torch.nn.utils.clip_grad_norm_(params, 1.0)


def clip_grad_norm_want():
    params = [nn.Parameter(t.clone()) for t in (a, c)]
    for p, t in zip(params, (a, c)):
        p.grad = t * 3
    return torch.nn.utils.clip_grad_norm_(params, 1.0)


# name: (the case on a side, one device's result, whether the placements must be PyTorch's)
CASES = {
    "P(sum) + R": (lambda X: X.P(a) + X.R(b), lambda: reduced(a, "sum") + b, True),
    "R + P(sum)": (lambda X: X.R(b) + X.P(a), lambda: b + reduced(a, "sum"), False),
    "P(sum) - R": (lambda X: X.P(a) - X.R(b), lambda: reduced(a, "sum") - b, True),
    "P(avg) + R": (lambda X: X.P(a, "avg") + X.R(b), lambda: reduced(a, "avg") + b, True),
    "P(avg) * 2.5": (lambda X: X.P(a, "avg") * 2.5, lambda: reduced(a, "avg") * 2.5, True),
    "P(sum) * R": (lambda X: X.P(a) * X.R(b), lambda: reduced(a, "sum") * b, True),
    "P(sum) * P(sum)": (lambda X: X.P(a) * X.P(b), lambda: reduced(a, "sum") * reduced(b, "sum"),
                        False),
    "maximum(P(max), P(max))": (lambda X: torch.maximum(X.P(a, "max"), X.P(b, "max")),
                                lambda: torch.maximum(reduced(a, "max"), reduced(b, "max")), True),
    "minimum(P(min), P(min))": (lambda X: torch.minimum(X.P(a, "min"), X.P(b, "min")),
                                lambda: torch.minimum(reduced(a, "min"), reduced(b, "min")), True),
    "max(P(max))": (lambda X: torch.max(X.P(a, "max")), lambda: torch.max(reduced(a, "max")), True),
    "amax(P(max), 0)": (lambda X: torch.amax(X.P(a, "max"), 0),
                        lambda: torch.amax(reduced(a, "max"), 0), True),
    "sum(P(sum))": (lambda X: X.P(a).sum(), lambda: reduced(a, "sum").sum(), True),
    # The index is not data: it stays whole while the Partial self passes through (partitioned
    # like a data input, it selected row 0 on every rank but the first).
    "index_select(P(sum), 0, R)": (lambda X: X.P(a).index_select(0, X.R(torch.tensor([3, 0, 5]))),
                                   lambda: reduced(a, "sum").index_select(0, torch.tensor([3, 0, 5])),
                                   False),
    "SequenceParallel LayerNorm, weight gradient": (sequence_parallel_layer_norm,
                                                    layer_norm_weight_grad, True),
    # The leaf's gradient keeps the leaf's Shard(1) on the engine; PyTorch's is Replicate.
    "S(1)[:, 8:] forward and backward": (sliced_columns_backward, sliced_columns_grad, False),
    # A dim the op needs whole is gathered, as PyTorch's (not moved elsewhere by an all_to_all).
    "softmax(S(1), dim=1)": (lambda X: torch.softmax(X.mod.distribute_tensor(a, X.mesh,
                                                                            [X.mod.Shard(1)]), 1),
                             lambda: torch.softmax(a, 1), True),
    "cumsum(S(0), dim=0)": (lambda X: torch.cumsum(X.mod.distribute_tensor(a, X.mesh,
                                                                          [X.mod.Shard(0)]), 0),
                            lambda: torch.cumsum(a, 0), True),
    "layer_norm over a sharded dim": (
        lambda X: F.layer_norm(X.mod.distribute_tensor(g, X.mesh, [X.mod.Shard(1)]), (2 * world, 8)),
        lambda: F.layer_norm(g, (2 * world, 8)), True),
    # Norms whose pieces reduce by sum, max or min stay Partial, as PyTorch's.
    "vector_norm(S(0), inf)": (lambda X: torch.linalg.vector_norm(
        X.mod.distribute_tensor(a, X.mesh, [X.mod.Shard(0)]), float("inf")),
        lambda: torch.linalg.vector_norm(a, float("inf")), True),
    "vector_norm(S(0), -inf)": (lambda X: torch.linalg.vector_norm(
        X.mod.distribute_tensor(a, X.mesh, [X.mod.Shard(0)]), float("-inf")),
        lambda: torch.linalg.vector_norm(a, float("-inf")), True),
    # PyTorch names these _NormPartial(1) / _NormPartial(0), a Partial whose reduce_op is "sum".
    "vector_norm(S(0), 1)": (lambda X: torch.linalg.vector_norm(
        X.mod.distribute_tensor(a, X.mesh, [X.mod.Shard(0)]), 1),
        lambda: torch.linalg.vector_norm(a, 1), False),
    "vector_norm(S(0), 0)": (lambda X: torch.linalg.vector_norm(
        X.mod.distribute_tensor(a, X.mesh, [X.mod.Shard(0)]), 0),
        lambda: torch.linalg.vector_norm(a, 0), False),
    "linalg__powsum(S(0), 3)": (lambda X: torch.ops.aten.linalg__powsum(
        X.mod.distribute_tensor(a, X.mesh, [X.mod.Shard(0)]), 3),
        lambda: torch.ops.aten.linalg__powsum(a, 3), True),
    # A p-norm's pieces combine as (sum of p-th powers)^(1/p): PyTorch's _NormPartial.
    "vector_norm(S(0), 2)": (lambda X: torch.linalg.vector_norm(
        X.mod.distribute_tensor(a, X.mesh, [X.mod.Shard(0)])),
        lambda: torch.linalg.vector_norm(a), False),
    "vector_norm(S(1), 3, dim=1)": (lambda X: torch.linalg.vector_norm(
        X.mod.distribute_tensor(a, X.mesh, [X.mod.Shard(1)]), 3, dim=1),
        lambda: torch.linalg.vector_norm(a, 3, dim=1), False),
    # A norm of a Partial reduces it once, to Replicate: not a reduce_scatter whose output is
    # Partial again (its consumer would reduce a second time).
    "vector_norm(P(sum), 0)": (lambda X: torch.linalg.vector_norm(X.P(a), 0),
                               lambda: torch.linalg.vector_norm(reduced(a, "sum"), 0), True),
    "dist(S(0), S(0))": (lambda X: torch.dist(X.mod.distribute_tensor(a, X.mesh, [X.mod.Shard(0)]),
                                              X.mod.distribute_tensor(b, X.mesh, [X.mod.Shard(0)])),
                         lambda: torch.dist(a, b), False),
    "clip_grad_norm_ of S(0) gradients": (clip_grad_norm_case, clip_grad_norm_want, False),
    # Advanced indexing: the indexed dims whole, the others and the index's own dims sharded.
    "S(1)[i] with i replicated": (lambda X: X.mod.distribute_tensor(g, X.mesh, [X.mod.Shard(1)])[
        X.mod.distribute_tensor(idx, X.mesh, [X.mod.Replicate()])], lambda: g[idx], True),
    "R[i] with i Shard(0)": (lambda X: X.mod.distribute_tensor(a, X.mesh, [X.mod.Replicate()])[
        X.mod.distribute_tensor(idx, X.mesh, [X.mod.Shard(0)])], lambda: a[idx], True),
    "S(0)[:, j] with j replicated": (lambda X: X.mod.distribute_tensor(a, X.mesh, [X.mod.Shard(0)])[
        :, X.mod.distribute_tensor(idx[0], X.mesh, [X.mod.Replicate()])], lambda: a[:, idx[0]], True),
    # A Python number added to a Partial(sum) is partitioned as a number, so the sum stays float32.
    "sum(S(0)) + 1e-6": (lambda X: X.mod.distribute_tensor(a, X.mesh, [X.mod.Shard(0)]).sum() + 1e-6,
                         lambda: a.sum() + 1e-6, False),
    "histc(S(0), min, max)": (lambda X: torch.histc(X.mod.distribute_tensor(a, X.mesh,
                                                                          [X.mod.Shard(0)]),
                                                    10, -2, 2),
                              lambda: torch.histc(a, 10, -2, 2), True),
    "histc(S(0))": (lambda X: torch.histc(X.mod.distribute_tensor(a, X.mesh, [X.mod.Shard(0)]), 10),
                    lambda: torch.histc(a, 10), True),
    "distribute_tensor Shard(0)": (lambda X: X.mod.distribute_tensor(a, X.mesh, [X.mod.Shard(0)]),
                                   lambda: a, True),
    "distribute_tensor Replicate": (lambda X: X.mod.distribute_tensor(a, X.mesh,
                                                                      [X.mod.Replicate()]),
                                    lambda: a, True),
}

failures = []
for name, (case, want, same_placements) in CASES.items():
    got, counts = {}, {}
    for side_name, X in (("engine", engine), ("pytorch", torch_side)):
        with X.debug.CommDebugMode() as mode:
            out = case(X)
        got[side_name] = (mode.get_total_counts(), [str(p) for p in out.placements])
        counts[side_name] = mode.get_comm_counts()
        full = out.full_tensor()
        if full.dtype != want().dtype or not torch.allclose(full, want(), atol=1e-5):
            failures.append(f"{name}: {side_name}'s values differ from one device's")
    (n_engine, p_engine), (n_torch, p_torch) = got["engine"], got["pytorch"]
    if n_engine > n_torch:
        failures.append(f"{name}: the engine issued {n_engine} collectives, PyTorch {n_torch}")
    if same_placements and p_engine != p_torch:
        failures.append(f"{name}: the engine gives {p_engine}, PyTorch {p_torch}")
    # distribute_tensor is a scatter on both sides, counted under PyTorch's key (c10d.scatter_).
    if name.startswith("distribute_tensor") and counts["engine"] != counts["pytorch"]:
        failures.append(f"{name}: the engine counts {dict(counts['engine'])}, "
                        f"PyTorch {dict(counts['pytorch'])}")
    if rank == 0:
        print(f"{name}: engine {n_engine} {p_engine}, pytorch {n_torch} {p_torch}")
assert not failures, "\n".join(failures)
dist.barrier()
dist.destroy_process_group()
print("ok")
'''


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_more_collectives_than_pytorch_and_its_placements(tmp_path):
    out = run_on_ranks(WORKER, 4, tmp_path, PARITY_PORT=str(_free_port()))
    print(out)


# distribute_tensor checks that every rank passed the source's shape and dtype within its one
# scatter (the call's purpose names them) on backends that compare calls: a rank that passed
# another shape fails on every rank, naming both, and the mesh goes on.
MISMATCH_WORKER = r'''
import os, torch
from dtensor import Replicate, Shard, distribute_tensor, init_device_mesh
rank = int(os.environ["RANK"])
mesh = init_device_mesh("cpu", (4,))
for placements in ([Shard(0)], [Replicate()]):
    try:
        distribute_tensor(torch.ones(8, 3 if rank == 2 else 4), mesh, placements)
    except RuntimeError as e:
        assert "distribute_tensor Float[8,4]" in str(e) and "distribute_tensor Float[8,3]" in str(e), e
    else:
        raise AssertionError("a rank with another shape was not caught")
    x = torch.arange(32.).view(8, 4)
    assert torch.equal(distribute_tensor(x, mesh, placements).full_tensor(), x)
print("ok")
'''


@pytest.mark.parametrize("backend", ["shm", "c10d"])
def test_distribute_tensor_refuses_ranks_with_another_shape(tmp_path, backend):
    run_on_ranks(MISMATCH_WORKER, 4, tmp_path, DTENSOR_BACKEND=backend)
