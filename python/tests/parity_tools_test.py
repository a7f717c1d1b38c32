"""PyTorch parity, continued (python/tests/parity_test.py has the placements, repr, styles and the
current mesh): CommDebugMode's module view and tables, the functional collectives' signatures,
group forms and autograd variants, SequenceParallel on any module, distribute_module's buffers,
and register_sharding. Ranks are threads (simulation mode); results are compared with one
device."""

import copy

import pytest
import torch
from torch import nn

import dtensor
from dtensor import DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh
from dtensor.parallel import ColwiseParallel, parallelize_module


# ---- CommDebugMode: per-module counts, parameter and sharding info, tables (PyTorch's API) ------

class _TpMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(8, 16)
        self.relu = nn.ReLU()
        self.w2 = nn.Linear(16, 8)

    def forward(self, x):
        return self.w2(self.relu(self.w1(x)))


def test_comm_debug_mode_module_view_and_tables(tmp_path):
    import json

    from dtensor.debug import CommDebugMode
    from dtensor.parallel import RowwiseParallel
    torch.manual_seed(0)
    ref = _TpMLP()
    x = torch.randn(4, 8)

    def rank_fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        model = parallelize_module(copy.deepcopy(ref), mesh,
                                   {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
        inp = x.clone().requires_grad_()
        with CommDebugMode() as comm:
            model(inp).sum().backward()
        table0 = comm.generate_comm_debug_tracing_table(noise_level=0)
        table1 = comm.generate_comm_debug_tracing_table(noise_level=1)
        log = tmp_path / f"log{rank}.txt"
        dump = tmp_path / f"dump{rank}.json"
        comm.log_comm_debug_tracing_table_to_file(str(log), noise_level=1)
        comm.generate_json_dump(str(dump), noise_level=1)
        return (comm.get_total_counts(), comm.get_comm_counts(),
                copy.deepcopy(comm.comm_module_counts), comm.get_sharding_info(),
                {k: sorted(v) for k, v in comm.get_parameter_info().items()},
                table0, table1, log.read_text(), json.loads(dump.read_text()))

    for total, counts, modules, sharding, params, t0, t1, log, dump in dtensor.run_threads(
            2, rank_fn):
        # Forward: w2's Partial output becomes Replicate (one all_reduce, in w2's output hook);
        # backward: w1's Replicate input gets a Partial gradient (one all_reduce, in w1).
        assert total == 2 and counts == {"all_reduce": 2}
        assert modules["Global"] == {"forward": {"all_reduce": 1}, "backward": {"all_reduce": 1}}
        assert modules["_TpMLP"] == modules["Global"]
        assert modules["_TpMLP.w2"] == {"forward": {"all_reduce": 1}, "backward": {}}
        assert modules["_TpMLP.w1"] == {"forward": {}, "backward": {"all_reduce": 1}}
        assert "_TpMLP.relu" not in modules
        assert sharding == {"_TpMLP.w1.weight": (Shard(0),), "_TpMLP.w1.bias": (Shard(0),),
                            "_TpMLP.w2.weight": (Shard(1),), "_TpMLP.w2.bias": (Replicate(),)}
        assert params == {"_TpMLP.w1": ["bias", "weight"], "_TpMLP.w2": ["bias", "weight"]}
        # noise 0: modules and collectives only; noise 1 adds module types, parameters and the
        # ops on distributed tensors with their shapes and placements.
        assert "_TpMLP.w2" in t0 and "FORWARD PASS" in t0 and "BACKWARD PASS" in t0
        assert "*all_reduce: 1" in t0 and "shape:" not in t0 and "module type" not in t0
        assert "*module type: class 'torch.nn.modules.linear.Linear'" in t1
        assert " *weight: (Shard(dim=0),)" in t1 and "**torch.nn.functional.linear" in t1
        assert "sharding: [(Replicate(),), (Shard(dim=0),), (Shard(dim=0),)]" in t1
        assert "\033[" not in log and "shape: [(4, 8), (16, 8), (16,)]" in log
        assert "torch.Tensor.dim" not in t1  # metadata reads: noise level 3 only
        assert dump["fqn"] == "Global"
        (mlp,) = dump["children"]
        assert [c["fqn"] for c in mlp["children"]] == ["_TpMLP.w1", "_TpMLP.relu", "_TpMLP.w2"]
        w2 = mlp["children"][2]
        assert w2["collectives_forward"] == [["all_reduce", 1]]
        assert ["weight", "(Shard(dim=1),)"] in w2["parameters"]
        assert any(op["input_sharding"] for op in w2["operations_forward"])


class _Stacked(nn.Module):
    """Blocks in an nn.ModuleList, which never runs forward itself."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([_TpMLP(), _TpMLP()])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_comm_debug_mode_names_modules_inside_containers():
    """A module reached through a container (``layers.0``) is named by its path from the running
    module (``_Stacked.layers.0.w1``) as PyTorch's CommDebugMode names it; before, both blocks
    were named by their class and their parameters merged. ``advanced_module_tracker`` gives
    PyTorch's per-module dicts."""
    from dtensor.debug import CommDebugMode
    from dtensor.parallel import RowwiseParallel

    def rank_fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        plan = {f"layers.{i}.{n}": (ColwiseParallel() if n == "w1" else RowwiseParallel())
                for i in range(2) for n in ("w1", "w2")}
        model = parallelize_module(_Stacked(), mesh, plan)
        comm = CommDebugMode()
        with comm:
            assert len(comm.advanced_module_tracker.module_helper_dict) == 1  # "Global"
            model(torch.randn(4, 8))
        tracker = comm.advanced_module_tracker
        return (sorted(comm.get_parameter_info()), sorted(comm.get_sharding_info()),
                sorted(tracker.module_helper_dict), dict(tracker.parent_dict),
                copy.deepcopy(comm.comm_module_counts))

    for params, sharding, helper, parents, counts in dtensor.run_threads(2, rank_fn):
        blocks = [f"_Stacked.layers.{i}.{n}" for i in range(2) for n in ("w1", "w2")]
        assert params == blocks, params
        assert sharding == sorted(f"{b}.{p}" for b in blocks for p in ("bias", "weight"))
        assert helper == sorted(["Global", "_Stacked", "_Stacked.layers.0", "_Stacked.layers.1",
                                 "_Stacked.layers.0.relu", "_Stacked.layers.1.relu"] + blocks)
        assert parents["_Stacked.layers.1.w2"] == "_Stacked.layers.1", parents
        # Each block's RowwiseParallel output is reduced once, in that block.
        assert counts["_Stacked.layers.0"]["forward"] == {"all_reduce": 1}
        assert counts["_Stacked.layers.1.w2"]["forward"] == {"all_reduce": 1}
        assert counts["Global"]["forward"] == {"all_reduce": 2}


# ---- functional collectives: PyTorch's signatures, group forms, waits, autograd, permute ----------

def test_functional_collectives_pytorch_signatures_and_group_forms():
    from dtensor import _functional_collectives as funcol
    n = 4

    def rank_fn(rank):
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        t = torch.full((2,), float(rank + 1))
        tp_ranks = mesh["tp"].mesh.tolist()
        out = {}
        # PyTorch's positional order (self, reduceOp, group, tag) and every group form.
        for name, group in [("ranks", tp_ranks), ("rank lists", [[0, 1], [2, 3]]),
                            ("mesh dim", (mesh, 1)), ("1-D mesh", mesh["tp"])]:
            res = funcol.all_reduce(t, "sum", group, "tag")
            assert isinstance(res, funcol.AsyncCollectiveTensor), name
            out[name] = res.wait()
            assert type(out[name]) is torch.Tensor
        # trigger_wait returns the same object, usable afterwards; elem is the plain tensor.
        g = funcol.all_gather_tensor(t, 0, (mesh, 0), "")
        assert g.trigger_wait() is g and type(g.elem) is torch.Tensor
        out["gathered"] = g + 0
        out["scattered"] = funcol.reduce_scatter_tensor(torch.arange(4.) * (rank + 1), "avg", 0,
                                                        list(range(n))).wait()
        out["coalesced"] = [x.wait() for x in funcol.all_reduce_coalesced([t, t * 2], "max",
                                                                          "world")]
        # permute_tensor: group rank m sends to src_dst[m].
        out["permuted"] = funcol.permute_tensor(t, [1, 2, 3, 0], list(range(n))).wait()
        return rank, out

    for rank, out in dtensor.run_threads(n, rank_fn):
        tp_partner = rank ^ 1
        dp_partner = rank ^ 2
        expect = float(rank + 1 + tp_partner + 1)
        for name in ("ranks", "rank lists", "mesh dim", "1-D mesh"):
            torch.testing.assert_close(out[name], torch.full((2,), expect))
        first, second = sorted([rank, dp_partner])
        torch.testing.assert_close(out["gathered"], torch.tensor(
            [first + 1.0] * 2 + [second + 1.0] * 2))
        torch.testing.assert_close(out["scattered"], torch.tensor([rank * 2.5]))
        torch.testing.assert_close(out["coalesced"][0], torch.full((2,), 4.))
        torch.testing.assert_close(out["coalesced"][1], torch.full((2,), 8.))
        torch.testing.assert_close(out["permuted"], torch.full((2,), float((rank - 1) % n + 1)))


def test_functional_collectives_autograd_variants():
    from dtensor import _functional_collectives as funcol
    n = 2
    torch.manual_seed(0)
    weights = torch.randn(4, 3)

    def rank_fn(rank):
        x = (torch.arange(6.).view(2, 3) + 10 * rank).requires_grad_()
        gathered = funcol.all_gather_tensor_autograd(x, 0, "world")
        (gathered * weights).sum().backward()
        g_gather = x.grad.clone()
        x.grad = None
        scattered = funcol.reduce_scatter_tensor_autograd(torch.cat([x, x]), "sum", 0, "world")
        (scattered * weights[2 * rank:2 * rank + 2]).sum().backward()
        g_scatter = x.grad.clone()
        x.grad = None
        swapped = funcol.all_to_all_single_autograd(x, [1, 1], [1, 1], "world")
        (swapped * torch.tensor([[1.], [2.]])).sum().backward()
        # async_op=True on an input that requires grad: a plain tensor in the graph, complete.
        early = funcol.all_gather_tensor(x, 0, "world", async_op=True)
        assert type(early) is torch.Tensor and early.requires_grad
        torch.testing.assert_close(early.detach(), gathered.detach())
        return gathered.detach(), g_gather, scattered.detach(), g_scatter, x.grad

    results = dtensor.run_threads(n, rank_fn)
    xs = [torch.arange(6.).view(2, 3) + 10 * r for r in range(n)]
    for rank, (gathered, g_gather, scattered, g_scatter, g_swap) in enumerate(results):
        torch.testing.assert_close(gathered, torch.cat(xs))
        # Each rank's loss reads every rank's x: x's gradient sums the ranks' weights for it.
        torch.testing.assert_close(g_gather, n * weights[2 * rank:2 * rank + 2])
        # Both halves of cat([x, x]) are x: each rank's piece of the sum is the sum of the xs.
        torch.testing.assert_close(scattered, sum(xs))
        # The first half of x's copies went to rank 0, the second to rank 1.
        torch.testing.assert_close(g_scatter, weights[0:2] + weights[2:4])
        # Row i of x went to rank i, which weighs what it received from rank r by r + 1.
        torch.testing.assert_close(g_swap, torch.full((2, 3), float(rank + 1)))


# ---- SequenceParallel on any module; distribute_module's buffers and single use ---------------

class _MixesPositions(nn.Module):
    """Mixes positions along the sequence (dim 1): not a norm."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 6)

    def forward(self, x):
        return self.proj(x).cumsum(1)


@pytest.mark.parametrize("make", [lambda: nn.Linear(6, 6), _MixesPositions,
                                  lambda: nn.LayerNorm(6)])
def test_sequence_parallel_accepts_any_module_and_stays_exact(make):
    from dtensor.parallel import SequenceParallel
    torch.manual_seed(0)
    ref = make()
    x = torch.randn(2, 8, 6)
    expected = ref(x)
    expected.sum().backward()

    def rank_fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        model = parallelize_module(copy.deepcopy(ref), mesh, SequenceParallel())
        out = model(x.chunk(2, dim=1)[rank])  # a plain input is this rank's piece, Shard(1)
        out.sum().backward()
        return out.full_tensor().detach(), {k: p.grad.full_tensor()
                                             for k, p in model.named_parameters()}

    for out, grads in dtensor.run_threads(2, rank_fn):
        torch.testing.assert_close(out, expected.detach())
        for k, p in ref.named_parameters():
            torch.testing.assert_close(grads[k], p.grad)


def test_distribute_module_replicates_buffers_and_refuses_a_second_call():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    x = torch.randn(8, 4)
    expected = copy.deepcopy(ref)(x)

    def rank_fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        m = dtensor.distribute_module(copy.deepcopy(ref), mesh)
        buffers = {k: type(b) for k, b in m.named_buffers()}
        placements = {k: b.placements for k, b in m.named_buffers() if isinstance(b, DTensor)}
        out = m(distribute_tensor(x, mesh, [Replicate()])).full_tensor()
        running = m[1].running_mean.full_tensor()
        with pytest.raises(RuntimeError, match="only be called once"):
            dtensor.distribute_module(m, mesh)
        return buffers, placements, out, running

    ref_model = copy.deepcopy(ref)
    ref_model(x)
    for buffers, placements, out, running in dtensor.run_threads(2, rank_fn):
        assert set(buffers) == {"1.running_mean", "1.running_var", "1.num_batches_tracked"}
        assert set(placements) == set(buffers)
        assert all(p == (Replicate(),) for p in placements.values())
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(running, ref_model[1].running_mean)


# ---- register_sharding (torch.distributed.tensor.experimental) ----------------------------------

_LIB = torch.library.Library("dtensor_parity", "DEF")
for _name in ("softmax_a", "softmax_b"):
    _LIB.define(f"{_name}(Tensor x, int dim) -> Tensor")
    _LIB.impl(_name, lambda x, dim: torch.softmax(x, dim), "CPU")
    _LIB.impl(_name, lambda x, dim: torch.empty_like(x), "Meta")
_LIB.define("rowdot(Tensor a, Tensor b) -> Tensor")
_LIB.impl("rowdot", lambda a, b: (a * b).sum(-1), "CPU")
_LIB.impl("rowdot", lambda a, b: a.new_empty(a.shape[:-1]), "Meta")


def test_register_sharding_custom_ops():
    from dtensor.debug import CommDebugMode
    from dtensor.experimental import register_sharding
    ops = torch.ops.dtensor_parity

    @register_sharding(ops.softmax_a)
    def softmax_strategies(x, dim):  # PyTorch's docs example, for a custom softmax
        softmax_dim = dim if dim >= 0 else dim + x.ndim
        acceptable = [([Replicate()], [Replicate(), None])]
        for d in range(x.ndim):
            if d != softmax_dim:
                acceptable.append(([Shard(d)], [Shard(d), None]))
        return acceptable

    @register_sharding(ops.rowdot)
    def rowdot_strategies(a, b):
        return [([Replicate()], [Replicate(), Replicate()]),
                ([Shard(0)], [Shard(0), Shard(0)]),
                ([Partial()], [Shard(1), Shard(1)])]

    with pytest.raises(RuntimeError, match="already has a rule"):
        register_sharding(torch.ops.aten._softmax.default)(softmax_strategies)

    torch.manual_seed(0)
    x = torch.randn(8, 6, 4)
    a, b = torch.randn(8, 6), torch.randn(8, 6)

    def rank_fn(rank):
        mesh = init_device_mesh("cpu", (2, 2))
        out = {}
        dx = distribute_tensor(x, mesh, [Shard(0), Shard(2)])
        with CommDebugMode() as comm:
            y = ops.softmax_a(dx, 1)  # dims 0 and 2 may stay sharded: no communication
        out["kept"] = (y.placements, comm.get_total_counts(), y.full_tensor())
        y = ops.softmax_a(dx, 0)  # dim 0 must be whole: moved, still exact
        out["moved"] = (y.placements, y.full_tensor())
        z = ops.softmax_b(dx, 1)  # not registered: the replicate fallback
        out["fallback"] = (z.placements, z.full_tensor())
        da = distribute_tensor(a, mesh, [Replicate(), Shard(1)])
        db = distribute_tensor(b, mesh, [Replicate(), Shard(1)])
        with CommDebugMode() as comm:
            d = ops.rowdot(da, db)  # a contraction: Partial on the mesh dim sharding it
        out["dot"] = (d.placements, comm.get_total_counts(), d.full_tensor())
        return out

    from dtensor.debug import fallback_counts, reset_fallback_counts
    reset_fallback_counts()
    results = dtensor.run_threads(4, rank_fn)
    counts = fallback_counts()
    assert counts.get("dtensor_parity::softmax_b") == 4
    assert "dtensor_parity::softmax_a" not in counts and "dtensor_parity::rowdot" not in counts
    for out in results:
        placements, comms, y = out["kept"]
        assert placements == (Shard(0), Shard(2)) and comms == 0
        torch.testing.assert_close(y, torch.softmax(x, 1))
        placements, y = out["moved"]
        assert all(not p.is_shard(0) for p in placements)
        torch.testing.assert_close(y, torch.softmax(x, 0))
        placements, z = out["fallback"]
        assert placements == (Replicate(), Replicate())
        torch.testing.assert_close(z, torch.softmax(x, 1))
        placements, comms, d = out["dot"]
        assert placements == (Replicate(), Partial()) and comms == 0
        torch.testing.assert_close(d, (a * b).sum(-1))
