"""PyTorch parity of the Python face (torch.distributed.tensor, device_mesh, tensor.parallel):
placement strings and helpers, DTensor's repr, redistribute's forward/backward dtypes,
PrepareModuleInputOutput, user-written ParallelStyles, exact int fills and the current mesh
(``with mesh:``). Ranks are threads (simulation mode); results are compared with one device."""

import copy

import pytest
import torch
from torch import nn

import dtensor
from dtensor import (
    DTensor,
    Partial,
    Placement,
    Replicate,
    Shard,
    distribute_tensor,
    empty,
    full,
    init_device_mesh,
    ones,
    rand,
    randn,
    zeros,
)
from dtensor.device_mesh import _mesh_resources
from dtensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInputOutput,
    parallelize_module,
)


# ---- A. placements ------------------------------------------------------------------------------

def test_placement_strings_is_partial_and_local_shard_size_and_offset():
    # PyTorch's human-readable (__str__) and machine-readable (__repr__) forms.
    assert (str(Shard(0)), str(Shard(1)), str(Replicate()), str(Partial())) == \
        ("S(0)", "S(1)", "R", "P(sum)")
    assert str(Partial("max")) == "P(max)"
    assert (repr(Shard(0)), repr(Replicate()), repr(Partial())) == \
        ("Shard(dim=0)", "Replicate()", "Partial(sum)")
    # is_partial(reduce_op): true only for a Partial whose op matches, when one is given.
    assert Partial().is_partial() and Partial().is_partial("sum")
    assert not Partial().is_partial("max") and Partial("max").is_partial("max")
    for p in (Shard(0), Replicate()):
        assert not p.is_partial() and not p.is_partial("sum")
    assert Placement.is_partial(Shard(0), reduce_op="sum") is False

    # local_shard_size_and_offset follows torch.chunk (empty trailing pieces at offset = size),
    # and agrees with the engine's own split (chunk_sizes).
    for n in range(0, 14):
        for k in range(1, 6):
            pieces = [c.numel() for c in torch.arange(n).chunk(k)] if n else []
            pieces += [0] * (k - len(pieces))
            assert list(dtensor._C.chunk_sizes(n, k)) == pieces, (n, k)
            offset = 0
            for r in range(k):
                want = (pieces[r], offset if pieces[r] else n)
                assert Shard.local_shard_size_and_offset(n, k, r) == want, (n, k, r)
                assert Shard(0)._local_shard_size_and_offset(n, k, r) == want
                offset += pieces[r]


@pytest.mark.parametrize("n", [5, 3, 8])
def test_local_shard_size_and_offset_matches_distribute_tensor(n):
    x = torch.arange(n * 2, dtype=torch.float64).reshape(n, 2)

    def fn(rank):
        mesh = init_device_mesh("cpu", (4,))
        local = distribute_tensor(x, mesh, [Shard(0)]).to_local()
        size, offset = Shard.local_shard_size_and_offset(n, 4, mesh.get_coordinate()[0])
        assert local.shape == (size, 2)
        torch.testing.assert_close(local, x[offset:offset + size])
        return True

    assert all(dtensor.run_threads(4, fn))


# ---- B. DTensor.__repr__ ----------------------------------------------------------------------

def test_dtensor_repr_is_pytorchs():
    x = torch.arange(8, dtype=torch.float32).reshape(4, 2)

    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        d = distribute_tensor(x, mesh, [Shard(0)])
        local = x.chunk(2)[rank]
        assert repr(d) == (f"DTensor(local_tensor={local!r}, device_mesh={mesh!r}, "
                           f"placements=(Shard(dim=0),))")
        assert repr(mesh) == "DeviceMesh('cpu', [0, 1])"
        named = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "tp"))
        assert repr(named) == "DeviceMesh('cpu', [[0, 1]], mesh_dim_names=('dp', 'tp'))"
        r = distribute_tensor(x, named, [Replicate(), Shard(1)])
        assert repr(r) == (f"DTensor(local_tensor={x.chunk(2, dim=1)[rank]!r}, "
                           f"device_mesh={named!r}, placements=(Replicate(), Shard(dim=1)))")
        # Plain tensors keep torch's repr.
        assert repr(local).startswith("tensor(")
        return True

    assert all(dtensor.run_threads(2, fn))


# ---- C. redistribute(forward_dtype=, backward_dtype=) --------------------------------------------

def test_redistribute_forward_and_backward_dtype():
    torch.manual_seed(0)
    x = torch.randn(6, 4)
    shares = [torch.randn(6, 4), torch.randn(6, 4)]
    w = torch.randn(6, 4, dtype=torch.float64) / 3

    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        # Shard(0) -> Replicate, gathered in float64, gradient back in float16.
        local = x.chunk(2)[rank].clone().requires_grad_(True)
        d = DTensor.from_local(local, mesh, [Shard(0)])
        y = d.redistribute(mesh, [Replicate()], forward_dtype=torch.float64,
                           backward_dtype=torch.float16)
        assert y.dtype == torch.float64 and tuple(y.placements) == (Replicate(),)
        torch.testing.assert_close(y.to_local(), x.double(), rtol=0, atol=0)
        (y.to_local() * w).sum().backward()
        assert local.grad.dtype == torch.float32
        want = w.chunk(2)[rank].half().float()
        torch.testing.assert_close(local.grad, want, rtol=0, atol=0)
        assert not torch.equal(local.grad, w.chunk(2)[rank].float())  # float16 was used

        # Partial -> Replicate: the all-reduce runs in float64; no backward_dtype: the gradient
        # comes back in the input's dtype.
        share = shares[rank].clone().requires_grad_(True)
        p = DTensor.from_local(share, mesh, [Partial()])
        s = p.redistribute(mesh, [Replicate()], forward_dtype=torch.float64)
        assert s.dtype == torch.float64
        torch.testing.assert_close(s.to_local(), shares[0].double() + shares[1].double(),
                                   rtol=0, atol=0)
        (s.to_local() * w).sum().backward()
        assert share.grad.dtype == torch.float32
        torch.testing.assert_close(share.grad, w.float(), rtol=0, atol=0)

        # backward_dtype alone: forward unchanged, gradient redistributed in bfloat16.
        local2 = x.chunk(2)[rank].clone().requires_grad_(True)
        y2 = DTensor.from_local(local2, mesh, [Shard(0)]).redistribute(
            placements=[Replicate()], backward_dtype=torch.bfloat16)
        assert y2.dtype == torch.float32
        torch.testing.assert_close(y2.to_local(), x, rtol=0, atol=0)
        (y2.to_local() * w.float()).sum().backward()
        torch.testing.assert_close(local2.grad, w.float().chunk(2)[rank].bfloat16().float(),
                                   rtol=0, atol=0)
        # Unchanged dtypes: the plain redistribute.
        same = d.redistribute(mesh, [Replicate()], forward_dtype=torch.float32)
        assert same.dtype == torch.float32
        with pytest.raises(TypeError, match="forward_dtype"):
            d.redistribute(mesh, [Replicate()], forward_dtype="float64")
        return True

    assert all(dtensor.run_threads(2, fn))


# ---- D. PrepareModuleInputOutput ----------------------------------------------------------------

class _AffineSeen(nn.Module):
    """y = 2x + 1, recording what its forward was given."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, x):
        self.seen.append(x)
        return x * 2 + 1


@pytest.mark.parametrize("use_local_input", [False, True])
def test_prepare_module_input_output(use_local_input):
    torch.manual_seed(0)
    x = torch.randn(4, 3)
    ref_x = x.clone().requires_grad_(True)
    ref_out = ref_x * 2 + 1
    ref_out.sum().backward()

    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        m = _AffineSeen()
        style = PrepareModuleInputOutput(
            input_layouts=Shard(0), desired_input_layouts=Replicate(),
            use_local_input=use_local_input,
            output_layouts=Replicate(), desired_output_layouts=Shard(0), use_local_output=True)
        assert isinstance(style, ParallelStyle)
        parallelize_module(m, mesh, style)
        local = x.chunk(2)[rank].clone().requires_grad_(True)
        out = m(local)
        seen = m.seen[0]
        if use_local_input:
            assert not isinstance(seen, DTensor)
            torch.testing.assert_close(seen, x)
        else:
            assert isinstance(seen, DTensor) and tuple(seen.placements) == (Replicate(),)
        assert not isinstance(out, DTensor)
        torch.testing.assert_close(out, ref_out.detach().chunk(2)[rank])
        if not use_local_input:
            out.sum().backward()
            torch.testing.assert_close(local.grad, ref_x.grad.chunk(2)[rank])
        return True

    assert all(dtensor.run_threads(2, fn))


# ---- E. a user-written ParallelStyle (PyTorch's two-argument _apply) ----------------------------

class UserColwise(ParallelStyle):
    """Column-wise nn.Linear written against PyTorch's contract only."""

    def __init__(self):
        self.meshes = []
        self.src_ranks = []

    def _apply(self, module, device_mesh):
        self.meshes.append(device_mesh)
        self.src_ranks.append(self.src_data_rank)
        for name in ("weight", "bias"):
            p = getattr(module, name)
            module.register_parameter(name, nn.Parameter(distribute_tensor(
                p.detach(), device_mesh, [Shard(0)], src_data_rank=self.src_data_rank)))
        module.register_forward_pre_hook(
            lambda _m, inputs: (DTensor.from_local(inputs[0], device_mesh, [Replicate()]),))
        module.register_forward_hook(
            lambda _m, _i, out: out.redistribute(device_mesh, [Replicate()]).to_local())
        return module


def test_parallel_style_is_an_abc_with_src_data_rank():
    assert ParallelStyle.src_data_rank == 0
    assert UserColwise().src_data_rank == 0

    class Incomplete(ParallelStyle):
        pass

    with pytest.raises(TypeError):
        Incomplete()


@pytest.mark.parametrize("mesh_shape,names,src_data_rank", [
    ((2,), None, 0),
    ((2, 2), None, 0),
    ((2, 2), ("dp", "tp"), None),
])
def test_user_parallel_style_with_parallelize_module(mesh_shape, names, src_data_rank):
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 4))
    x = torch.randn(3, 5)
    ref_out = ref(x)
    ref_out.sum().backward()
    world = 1
    for s in mesh_shape:
        world *= s

    def fn(rank):
        mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
        model = copy.deepcopy(ref)
        model.zero_grad()
        style = UserColwise()
        parallelize_module(model, mesh, {"0": style, "2": UserColwise()},
                           src_data_rank=src_data_rank)
        # The user's style got a 1-D mesh (the tp dim's sub-mesh holding this rank).
        sub = style.meshes[0]
        assert sub.ndim == 1 and rank in sub.mesh.tolist() and sub.size() == mesh_shape[-1]
        assert style.src_ranks == [src_data_rank]
        out = model(x)
        assert not isinstance(out, DTensor)
        torch.testing.assert_close(out, ref_out.detach())
        out.sum().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            assert isinstance(p, DTensor)
            torch.testing.assert_close(p.grad.full_tensor(), q.grad)
        # Whole-module plan: a style given directly.
        lin = copy.deepcopy(ref[0])
        parallelize_module(lin, mesh, UserColwise(), src_data_rank=src_data_rank)
        torch.testing.assert_close(lin(x), ref[0](x).detach())
        return True

    assert all(dtensor.run_threads(world, fn))


# ---- F. full keeps int fill values exact -------------------------------------------------------

def test_full_int64_exact_and_dtype_inference():
    big = 2 ** 62 + 1
    assert float(big) != big  # a double cannot hold it

    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        d = full((4,), big, dtype=torch.int64, device_mesh=mesh, placements=[Shard(0)])
        assert d.dtype == torch.int64
        assert d.to_local().tolist() == [big, big]
        assert torch.equal(d.full_tensor(), torch.full((4,), big, dtype=torch.int64))
        neg = full((2, 2), -big, dtype=torch.int64, device_mesh=mesh)
        assert torch.equal(neg.full_tensor(), torch.full((2, 2), -big, dtype=torch.int64))
        # dtype=None infers it from fill_value as torch.full does.
        for value in (7, 0.5, True, big):
            got = full((2, 3), value, device_mesh=mesh, placements=[Shard(1)])
            want = torch.full((2, 3), value)
            assert got.dtype == want.dtype
            assert torch.equal(got.full_tensor(), want)
        f = full((3,), 2.5, dtype=torch.float64, device_mesh=mesh)
        assert torch.equal(f.full_tensor(), torch.full((3,), 2.5, dtype=torch.float64))
        return True

    assert all(dtensor.run_threads(2, fn))


# ---- G. the current mesh (with mesh:) ----------------------------------------------------------

def test_with_mesh_is_the_default_mesh():
    torch.manual_seed(0)
    x = torch.randn(4, 6)
    ref = nn.Linear(6, 4)
    ref_out = ref(x).detach()

    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        # No current mesh: the error says what to do.
        for call in (lambda: distribute_tensor(x, placements=[Shard(0)]),
                     lambda: DTensor.from_local(x, placements=[Replicate()]),
                     lambda: zeros(4, 2),
                     lambda: full((2,), 1.0),
                     lambda: parallelize_module(nn.Linear(2, 2), None, ColwiseParallel())):
            with pytest.raises(ValueError, match="with mesh:"):
                call()
        with mesh as m:
            assert m is mesh
            # This thread's stack only (ranks are threads, each with its own current mesh).
            assert _mesh_resources.mesh_stack == [mesh]
            d = distribute_tensor(x, placements=[Shard(0)])
            assert d.device_mesh == mesh
            torch.testing.assert_close(d.full_tensor(), x)
            f = DTensor.from_local(x.chunk(2)[rank], placements=[Shard(0)])
            assert f.device_mesh == mesh
            torch.testing.assert_close(f.full_tensor(), x)
            for make in (zeros, ones, empty, rand, randn):
                t = make(4, 2, placements=[Shard(0)])
                assert t.device_mesh == mesh and t.shape == (4, 2)
            torch.testing.assert_close(zeros(4, 2).full_tensor(), torch.zeros(4, 2))
            torch.testing.assert_close(ones((4, 2)).full_tensor(), torch.ones(4, 2))
            torch.testing.assert_close(full((3,), 1.5).full_tensor(), torch.full((3,), 1.5))
            lin = parallelize_module(copy.deepcopy(ref), parallelize_plan=ColwiseParallel(
                output_layouts=Replicate()))
            assert lin.weight.device_mesh == mesh
            torch.testing.assert_close(lin(x), ref_out)
            # Nested meshes: the innermost wins, the outer one comes back on exit.
            inner = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "tp"))
            with inner:
                assert distribute_tensor(x).device_mesh == inner
            assert distribute_tensor(x).device_mesh == mesh
        assert _mesh_resources.mesh_stack == []
        with pytest.raises(ValueError, match="device_mesh"):
            ones(2)
        return True

    assert all(dtensor.run_threads(2, fn))
    assert _mesh_resources.mesh_stack == []
    with pytest.raises(RuntimeError, match="No device mesh is currently active"):
        _mesh_resources.get_current_mesh()


# ---- local_map and implicit_replication (torch.distributed.tensor.experimental) -----------------

def test_local_map_and_implicit_replication():
    from dtensor.experimental import implicit_replication, local_map
    torch.manual_seed(0)
    x, w = torch.randn(8, 6), torch.randn(6)

    def scale_and_norm(xl, wl):  # a row-local computation: rows are independent
        y = xl * wl
        return y, y.pow(2).sum(-1)

    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        dx = distribute_tensor(x.clone().requires_grad_(), mesh, [Shard(0)])
        dw = distribute_tensor(w, mesh, [Replicate()])
        f = local_map(scale_and_norm, out_placements=((Shard(0),), (Shard(0),)),
                      in_placements=((Shard(0),), (Replicate(),)))
        y, n = f(dx, dw)
        assert isinstance(y, DTensor) and y.placements == (Shard(0),)
        torch.testing.assert_close(y.full_tensor(), x * w)
        torch.testing.assert_close(n.full_tensor(), (x * w).pow(2).sum(-1))
        n.sum().backward()
        torch.testing.assert_close(dx.grad.full_tensor(), 2 * x * w * w)
        # A Shard(1) argument where Shard(0) is wanted: an error, or moved when asked.
        d1 = distribute_tensor(x, mesh, [Shard(1)])
        with pytest.raises(ValueError, match="argument 0"):
            f(d1, dw)
        g = local_map(scale_and_norm, ((Shard(0),), (Shard(0),)),
                      ((Shard(0),), (Replicate(),)), redistribute_inputs=True)
        torch.testing.assert_close(g(d1, dw)[0].full_tensor(), x * w)
        # No distributed argument: func on the plain ones, its result as it is; a plain tensor
        # given placements is an error.
        plain = local_map(scale_and_norm, ((Shard(0),), (Shard(0),)))
        torch.testing.assert_close(plain(x, w)[0], x * w)
        with pytest.raises(ValueError, match="plain tensor"):
            f(x, w)
        # implicit_replication: a plain tensor mixed in is read as replicated.
        with implicit_replication():
            torch.testing.assert_close((dx.detach() * w).full_tensor(), x * w)
        return True

    assert all(dtensor.run_threads(2, fn))


def test_visualize_sharding_prints_once(capsys):
    """PyTorch prints the layout on the rank at coordinate 0 of every mesh dim only."""
    from dtensor.debug import visualize_sharding

    def fn(rank):
        mesh = init_device_mesh("cpu", (2, 2))
        visualize_sharding(distribute_tensor(torch.ones(4, 4), mesh, [Shard(0), Shard(1)]),
                           header="layout-header")
        return True

    assert all(dtensor.run_threads(4, fn))
    assert capsys.readouterr().out.count("layout-header") == 1


def test_get_local_rank():
    def fn(rank):
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        assert (mesh.get_local_rank(0), mesh.get_local_rank("tp")) == tuple(mesh.get_coordinate())
        assert mesh.get_local_rank("dp") == rank // 2 and mesh.get_local_rank(1) == rank % 2
        with pytest.raises(RuntimeError, match="mesh_dim must be given"):
            mesh.get_local_rank()
        assert mesh["tp"].get_local_rank() == rank % 2
        return True

    assert all(dtensor.run_threads(4, fn))


def test_get_group_is_a_torch_process_group():
    """mesh.get_group(dim) is a torch.distributed.ProcessGroup over that mesh dim's ranks: torch's
    own collectives (global src ranks included) run on it and equal the local computation."""
    import torch.distributed as dist

    def fn(rank):
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        tp, dp = mesh.get_group("tp"), mesh.get_group(0)
        assert isinstance(tp, dist.ProcessGroup) and mesh.get_group(1) is tp
        assert mesh.get_all_groups() == [dp, tp]
        assert (tp.size(), tp.rank()) == (2, mesh.get_local_rank("tp"))
        t = torch.full((3,), float(rank + 1))
        dist.all_reduce(t, group=tp)
        row = [r for r in range(4) if r // 2 == rank // 2]
        torch.testing.assert_close(t, torch.full((3,), float(sum(r + 1 for r in row))))
        b = torch.full((2,), float(rank))
        dist.broadcast(b, src=row[1], group=tp)  # a global rank, as torch.distributed takes it
        torch.testing.assert_close(b, torch.full((2,), float(row[1])))
        outs = [torch.empty(1) for _ in range(2)]
        dist.all_gather(outs, torch.tensor([float(rank)]), group=dp)
        assert [o.item() for o in outs] == [float(rank % 2), float(rank % 2 + 2)]
        with pytest.raises(RuntimeError, match="mesh_dim must be given"):
            mesh.get_group()
        return True

    assert all(dtensor.run_threads(4, fn))


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
