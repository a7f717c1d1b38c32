"""PyTorch parity of the Python face (torch.distributed.tensor, device_mesh, tensor.parallel):
placement strings and helpers, DTensor's repr, redistribute's forward/backward dtypes,
PrepareModuleInputOutput, user-written ParallelStyles, exact int fills, the current mesh
(``with mesh:``), backward through split with unused outputs, logsigmoid and eval batch norm
on shards. Ranks are threads (simulation mode); results are compared with one device."""

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
        dtensor.manual_seed(0)  # rand/randn below: thread ranks need their own generators
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


@pytest.mark.parametrize("how", ["split", "split_with_sizes", "chunk", "unbind"])
@pytest.mark.parametrize("placement", [Shard(0), Shard(1), Replicate()])
def test_backward_through_split_with_unused_outputs(how, placement):
    """Only some outputs of split / chunk / unbind are used: autograd's formula gives the unused
    ones plain zeros and cats (stacks) them with the distributed gradients (NOTE [zeros of
    backward formulas]). The gradient equals one device's and is distributed. Guards against
    backward raising "a plain tensor mixed with distributed tensors" at aten::cat / aten::stack."""
    torch.manual_seed(0)
    g = torch.randn(6, 4)

    def forward(t):
        if how == "split":
            return t.split(2, dim=1)[0] * 3
        if how == "split_with_sizes":
            return t.split([1, 3], dim=1)[1] * 3
        if how == "chunk":
            return t.chunk(3, dim=0)[1] * 3
        return t.unbind(1)[2] * 3

    want = g.clone().requires_grad_()
    forward(want).sum().backward()

    def fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        a = dtensor.distribute_tensor(g, mesh, [placement]).requires_grad_()
        forward(a).sum().backward()
        assert isinstance(a.grad, DTensor)
        torch.testing.assert_close(a.grad.full_tensor(), want.grad, rtol=0, atol=0)

    dtensor.run_threads(2, fn)


@pytest.mark.parametrize("placement", [Shard(0), Shard(1), Replicate()])
def test_logsigmoid_runs_sharded(placement):
    """logsigmoid's kernels have rules (log_sigmoid_forward's buffer is elementwise on the CPU and
    empty on CUDA, which its backward never reads): forward and backward keep the placement and
    equal one device's, with nothing gathered. Guards against log_sigmoid_forward running by
    the replicate fallback, and on a CUDA mesh its backward raising "shapes [20] and [20] and [0]
    do not broadcast"."""
    torch.manual_seed(0)
    x = torch.randn(6, 4)
    want = x.clone().requires_grad_()
    nn.functional.logsigmoid(want).mul(torch.arange(4.0)).sum().backward()

    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        a = distribute_tensor(x, mesh, [placement]).requires_grad_()
        out = nn.functional.logsigmoid(a)
        assert out.placements == (placement,)
        out.mul(distribute_tensor(torch.arange(4.0), mesh, [Replicate()])).sum().backward()
        torch.testing.assert_close(out.full_tensor(), nn.functional.logsigmoid(x))
        torch.testing.assert_close(a.grad.full_tensor(), want.grad)
        assert a.grad.placements == (placement,)

    dtensor.debug.reset_fallback_counts()
    dtensor.run_threads(2, fn)
    assert not [op for op in dtensor.debug.fallback_counts() if "log_sigmoid" in op]


@pytest.mark.parametrize("placement", [Shard(0), Shard(1), Shard(2)])
def test_eval_batch_norm_keeps_the_sharding(placement):
    """Batch norm in eval on a sharded input runs on the pieces: its empty saved statistics (the
    CPU kernel's; CUDA's are [C]) are whole, and the output keeps the input's placement, equal to
    one device's. Guards against every eval call running by the replicate fallback (five
    all_gathers) for want of a layout that fits the empty statistics."""
    torch.manual_seed(0)
    x, w, b = torch.randn(4, 6, 4), torch.randn(6), torch.randn(6)
    rm, rv = torch.randn(6), torch.rand(6) + 0.5
    want = nn.functional.batch_norm(x, rm, rv, w, b, training=False)

    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        stats = [Shard(0)] if placement == Shard(1) else [Replicate()]
        s = lambda t: distribute_tensor(t, mesh, stats)  # noqa: E731
        out = nn.functional.batch_norm(distribute_tensor(x, mesh, [placement]), s(rm), s(rv),
                                       s(w), s(b), training=False)
        assert out.placements == (placement,)
        torch.testing.assert_close(out.full_tensor(), want)

    dtensor.debug.reset_fallback_counts()
    dtensor.run_threads(2, fn)
    assert not dtensor.debug.fallback_counts()


_SIZE_ONE_OPS = [  # (name, fn(x, r) -> tensor, the placement PyTorch's DTensor keeps)
    ("detach", lambda x, r: x.detach(), Shard(0)),
    ("clone", lambda x, r: x.clone(), Shard(0)),
    ("relu", lambda x, r: torch.relu(x), Shard(0)),
    ("mul", lambda x, r: x * 2 + r, Shard(0)),
    ("mul_", lambda x, r: x.clone().mul_(3), Shard(0)),
    ("add_", lambda x, r: x.clone().add_(r, alpha=0.5), Shard(0)),
    ("exp_", lambda x, r: x.clone().exp_(), Shard(0)),
    # In-place ops that need the sharded dim whole: run out of place, copied back into self's
    # pieces (NOTE [in-place by copy]) rather than raising.
    ("cumsum_", lambda x, r: x.clone().cumsum_(0), Shard(0)),
    ("index_fill_", lambda x, r: x.clone().index_fill_(0, torch.tensor(0), 2.0), Shard(0)),
    ("t", lambda x, r: x.t(), Shard(1)),
    ("mm", lambda x, r: x @ r.t(), Shard(0)),
    ("sum", lambda x, r: x.sum(0), Partial()),
]


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("name,op,keeps", _SIZE_ONE_OPS, ids=[n for n, _, _ in _SIZE_ONE_OPS])
def test_shard_on_a_size_one_dim_is_kept_through_ops(name, op, keeps, world):
    """distribute_tensor(x [1, 8], [Shard(0)]) puts the row on rank 0 and empty pieces elsewhere;
    ops keep that placement as PyTorch's DTensor does (NOTE [size-1 factors]), equal to one
    device's. Guards against detach and the pointwise ops moving it to Shard(1) (an all_to_all)
    and in-place ops raising "no sharding keeps self's placements", as rules that give a size-1
    dim no factor would."""
    torch.manual_seed(0)
    x, r = torch.randn(1, 8), torch.randn(1, 8)
    want = op(x, r)

    def fn(rank):
        mesh = init_device_mesh("cpu", (world,))
        dx = distribute_tensor(x, mesh, [Shard(0)])
        assert dx.to_local().shape == ((1, 8) if rank == 0 else (0, 8))
        out = op(dx, distribute_tensor(r, mesh, [Replicate()]))
        assert out.placements == (keeps,), out.placements
        torch.testing.assert_close(out.full_tensor(), want)

    dtensor.run_threads(world, fn)
