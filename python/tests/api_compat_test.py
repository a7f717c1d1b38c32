"""Parity of the dtensor package's API with PyTorch 2.11's torch.distributed.tensor and
torch.distributed.device_mesh where users meet it: pickling and torch.save of distributed tensors
and meshes, DeviceMesh.get_coordinate and _flatten, dtensor.random, distribute_module's
two-argument hooks, distribute_tensor to Partial; indexing with distributed index tensors,
from_local strides and metadata checks, in-place view ops, the exception types of PyTorch's
checks. Ranks as threads (simulation mode)."""

import pickle

import pytest
import torch

import dtensor
from dtensor import (
    DTensor,
    DeviceMesh,
    Partial,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
    init_device_mesh,
)
from dtensor.debug import CommDebugMode
from dtensor.placement_types import _StridedShard


def _same(a, b):
    """``b`` is ``a`` again: type, layout, global shape and stride, local piece, value."""
    assert isinstance(b, DTensor)
    assert b.placements == a.placements and b.device_mesh == a.device_mesh
    assert b.shape == a.shape and b.stride() == a.stride() and b.dtype == a.dtype
    assert b.requires_grad == a.requires_grad
    torch.testing.assert_close(b.to_local(), a.to_local(), rtol=0, atol=0)
    torch.testing.assert_close(b.full_tensor(), a.full_tensor(), rtol=0, atol=0)


def test_pickle_and_torch_save_round_trip_distributed_tensors_and_meshes(tmp_path):
    # PyTorch's DTensor pickles its local tensor and spec; its DeviceMesh its layout and names.
    torch.manual_seed(0)
    a = torch.randn(5, 3)

    def fn(rank):
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        tensors = [
            distribute_tensor(a, mesh, [Shard(0), Replicate()]),
            distribute_tensor(a, mesh, [Shard(0), Shard(1)]).requires_grad_(),
            DTensor.from_local(torch.full((2, 3), float(rank)), mesh, [Partial(), Shard(0)]),
            DTensor.from_local(torch.ones(1, 3) * rank, mesh, [_StridedShard(0, split_factor=2), Shard(0)]),
            distribute_tensor(a, mesh["tp"], [Shard(1)]),
        ]
        param = torch.nn.Parameter(distribute_tensor(a, mesh, [Replicate(), Shard(0)]))
        for t in tensors:
            _same(t, pickle.loads(pickle.dumps(t)))
        for m in (mesh, mesh["tp"], mesh["dp"]):
            m2 = pickle.loads(pickle.dumps(m))
            assert isinstance(m2, DeviceMesh) and m2 == m
            assert m2.mesh_dim_names == m.mesh_dim_names and m2.mesh.equal(m.mesh)
        path = tmp_path / f"rank{rank}.pt"
        torch.save({"tensors": tensors, "param": param, "mesh": mesh, "plain": a}, path)
        for weights_only in (False, True):  # torch.load's default is weights_only=True
            loaded = torch.load(path, weights_only=weights_only)
            for t, t2 in zip(tensors, loaded["tensors"]):
                _same(t, t2)
            p2 = loaded["param"]
            assert isinstance(p2, torch.nn.Parameter) and p2.requires_grad
            _same(param, p2)
            assert loaded["mesh"] == mesh and loaded["mesh"].mesh_dim_names == ("dp", "tp")
            assert loaded["plain"].equal(a)
        # A loaded leaf trains: its gradient keeps its layout, as distribute_tensor's leaves.
        w = pickle.loads(pickle.dumps(tensors[1]))
        (w * 2).sum().backward()
        assert w.grad.placements == w.placements
        torch.testing.assert_close(w.grad.full_tensor(), torch.full((5, 3), 2.0))
        return True

    assert all(dtensor.run_threads(4, fn))


def test_get_coordinate_is_a_tuple_as_pytorch():
    def fn(rank):
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        assert mesh.get_coordinate() == (rank // 2, rank % 2)
        assert type(mesh.get_coordinate()) is tuple
        assert mesh["tp"].get_coordinate() == (rank % 2,)
        assert DeviceMesh("cpu", [0, 1]).get_coordinate() == ((rank,) if rank < 2 else None)
        return True

    assert all(dtensor.run_threads(4, fn))


def test_flatten_a_submesh_and_slice_it_from_the_root():
    a = torch.arange(48.0).reshape(8, 6)

    def fn(rank):
        mesh = init_device_mesh("cpu", (2, 2, 2), mesh_dim_names=("dp", "cp", "tp"))
        # PyTorch's docstring example: ranks (0, 2, 4, 6) on even ranks, (1, 3, 5, 7) on odd.
        dp_cp = mesh["dp", "cp"]._flatten()
        assert dp_cp.ndim == 1 and dp_cp.mesh_dim_names == ("dp_cp",)
        assert dp_cp.mesh.tolist() == [rank % 2 + 2 * k for k in range(4)]
        assert dp_cp.get_coordinate() == (rank // 2,)
        assert mesh["dp", "cp"]._flatten("dp_cp") is dp_cp  # made once per name
        with pytest.raises(ValueError, match="has been created before"):
            mesh["cp", "tp"]._flatten("dp_cp")
        with pytest.raises(ValueError, match="tp already exists"):
            mesh["dp", "cp"]._flatten("tp")
        with pytest.raises(RuntimeError, match="without mesh_dim_names"):
            DeviceMesh("cpu", list(range(8)))._flatten()
        assert mesh["tp"]._flatten("tp") == mesh["tp"]
        everything = mesh._flatten("all")
        assert everything.mesh.tolist() == list(range(8))
        # Reachable from the root by name (PyTorch 2.11 warns; the test wraps the threads).
        assert mesh["dp_cp"] == dp_cp and mesh["all"] == everything
        sliced = mesh["dp_cp", "tp"]
        assert sliced.shape == (4, 2) and sliced.mesh_dim_names == ("dp_cp", "tp")
        assert sliced.mesh.tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
        with pytest.raises(RuntimeError, match="overlapping"):
            mesh["dp_cp", "cp"]
        with pytest.raises(KeyError, match="pp"):
            mesh["pp"]
        # The flattened mesh carries tensors and collectives.
        d = distribute_tensor(a, dp_cp, [Shard(0)])
        assert d.to_local().shape == (2, 6)
        torch.testing.assert_close((d * 2).full_tensor(), a * 2)
        e = distribute_tensor(a, sliced, [Shard(0), Shard(1)])
        torch.testing.assert_close(e.sum().full_tensor(), a.sum())
        return True

    with pytest.warns(UserWarning, match="Slicing a flattened dim from root mesh"):
        assert all(dtensor.run_threads(8, fn))


def test_random_module_mirrors_torch_distributed_tensor_random():
    import torch.distributed.tensor._random as torch_random

    for name in ("manual_seed", "is_rng_supported_mesh"):
        assert hasattr(torch_random, name) and getattr(dtensor.random, name).__doc__
    assert dtensor.random.manual_seed is dtensor.manual_seed

    def fn(rank):
        mesh = init_device_mesh("cpu", (4,))
        assert dtensor.random.is_rng_supported_mesh(mesh)
        dtensor.random.manual_seed(7, mesh)
        first = dtensor.rand(8, 4, device_mesh=mesh, placements=[Shard(0)]).full_tensor()
        dtensor.manual_seed(7)  # the same seeding, with or without the mesh
        again = dtensor.rand(8, 4, device_mesh=mesh, placements=[Shard(0)]).full_tensor()
        torch.testing.assert_close(first, again, rtol=0, atol=0)
        pair = DeviceMesh("cpu", [0, 1])
        if rank < 2:
            dtensor.random.manual_seed(7, pair)
        else:
            with pytest.raises(RuntimeError, match="part of the device mesh"):
                dtensor.random.manual_seed(7, pair)
        return True

    assert all(dtensor.run_threads(4, fn))


def test_distribute_module_takes_two_argument_hooks_with_a_warning():
    calls = []

    def two_in(inputs, device_mesh):
        calls.append(("in", type(device_mesh).__name__))
        return tuple(x * 2 for x in inputs)

    def two_out(outputs, device_mesh):
        calls.append(("out", type(device_mesh).__name__))
        return outputs + 1

    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        m = distribute_module(torch.nn.Identity(), mesh, input_fn=two_in, output_fn=two_out)
        x = distribute_tensor(torch.arange(4.0), mesh, [Shard(0)])
        torch.testing.assert_close(m(x).full_tensor(), torch.arange(4.0) * 2 + 1)
        with pytest.raises(ValueError, match="input_fn should take in 3 arguments, but got 1"):
            distribute_module(torch.nn.Identity(), mesh, input_fn=lambda x: x)
        with pytest.raises(ValueError, match="output_fn should take in 3 arguments, but got 4"):
            distribute_module(torch.nn.Identity(), mesh, output_fn=lambda a, b, c, d: a)
        return True

    with pytest.warns(FutureWarning) as record:
        assert all(dtensor.run_threads(2, fn))
    text = " ".join(str(w.message) for w in record)
    assert "Deprecating input_fn" in text and "Deprecating output_fn" in text
    assert sorted(set(calls)) == [("in", "DeviceMesh"), ("out", "DeviceMesh")]


@pytest.mark.parametrize("src_data_rank", [0, None])
def test_distribute_tensor_to_partial_as_pytorch(src_data_rank):
    # PyTorch 2.11 replicates, then keeps shares: value / n for sum, the value for avg/min/max.
    a = torch.arange(8.0).reshape(4, 2)

    def fn(rank):
        mesh = init_device_mesh("cpu", (4,))
        for op, local in (("sum", a / 4), ("avg", a), ("max", a), ("min", a)):
            d = distribute_tensor(a, mesh, [Partial(op)], src_data_rank=src_data_rank)
            assert d.placements == (Partial(op),) and d.shape == a.shape
            torch.testing.assert_close(d.to_local(), local)
            torch.testing.assert_close(d.full_tensor(), a)
        with pytest.raises(ValueError, match=r"Replicate to Partial\(product\)"):
            distribute_tensor(a, mesh, [Partial("product")])
        mesh2 = init_device_mesh("cpu", (2, 2))
        with pytest.raises(ValueError, match="Mixed Partial reduce types"):
            distribute_tensor(a, mesh2, [Partial("sum"), Partial("max")])
        w = distribute_tensor(a.clone().requires_grad_(), mesh2, [Partial(), Shard(0)],
                              src_data_rank=src_data_rank)
        assert w.is_leaf and w.requires_grad
        torch.testing.assert_close(w.to_local(), a.chunk(2)[rank % 2] / 2)
        (w.full_tensor() * a).sum().backward()
        assert w.grad.placements == (Replicate(), Shard(0))  # PyTorch's gradient layout
        torch.testing.assert_close(w.grad.full_tensor(), a)
        return True

    assert all(dtensor.run_threads(4, fn))


def test_indexing_with_distributed_index_tensors():
    """x[i], x[:, i], x[mask] and x[i] = v with i a distributed tensor equal one device's (the
    index is an input, so the call does not raise naming `self`; NOTE [index tensors] in
    dtensor/dispatch.cc). A plain index works too (read as replicated)."""
    g = torch.arange(42.).reshape(7, 6)
    i = torch.tensor([0, 6, 2, 2, 5])
    j = torch.tensor([3, 0, 5])
    mask = g.remainder(3) == 1

    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        for xp, ip in [(Shard(0), Replicate()), (Shard(1), Shard(0)), (Replicate(), Shard(0))]:
            x = distribute_tensor(g, mesh, [xp])
            di = distribute_tensor(i, mesh, [ip])
            dj = distribute_tensor(j, mesh, [ip])
            torch.testing.assert_close(x[di].full_tensor(), g[i])
            torch.testing.assert_close(x[:, dj].full_tensor(), g[:, j])
            torch.testing.assert_close(x[di, dj[:1]].full_tensor(), g[i, j[:1]])
            torch.testing.assert_close(x[i].full_tensor(), g[i])
            dm = distribute_tensor(mask, mesh, [xp])
            torch.testing.assert_close(x[dm].full_tensor(), g[mask])
            y = x.clone()
            y[di] = distribute_tensor(torch.full((5, 6), -1.0), mesh, [Replicate()])
            want = g.clone()
            want[i] = -1.0
            torch.testing.assert_close(y.full_tensor(), want)
        return True

    assert all(dtensor.run_threads(2, fn))


@pytest.mark.parametrize("mesh_shape", [(2,), (2, 2)])
def test_from_local_of_a_transposed_piece_keeps_its_strides(mesh_shape):
    """from_local of a non-contiguous (transposed) piece reports the strides PyTorch's
    compute_global_tensor_info gives (NOTE [from_local strides]): is_contiguous() is False and
    reshape copies (reporting row-major strides would make reshape raise "view size is not
    compatible")."""
    n = 1
    for k in mesh_shape:
        n *= k

    def fn(rank):
        mesh = init_device_mesh("cpu", mesh_shape)
        placements = [Shard(0)] + [Shard(1)] * (len(mesh_shape) - 1)
        piece = torch.arange(12.).reshape(3, 4).add(100 * rank).t()  # (4, 3), strides (1, 4)
        x = dtensor.DTensor.from_local(piece, mesh, placements)
        whole = x.full_tensor()
        assert not x.is_contiguous()
        assert whole.shape == x.shape
        # The global strides are those of the whole tensor laid out like the pieces.
        want_stride = whole.t().contiguous().t().stride()
        assert x.stride() == want_stride, (x.stride(), want_stride)
        torch.testing.assert_close(x.reshape(-1).full_tensor(), whole.reshape(-1))
        torch.testing.assert_close(x.contiguous().full_tensor(), whole)
        torch.testing.assert_close((x.t() @ x).full_tensor(), whole.t() @ whole)
        row_major = dtensor.DTensor.from_local(piece.contiguous(), mesh, placements)
        assert row_major.is_contiguous()
        return True

    assert all(dtensor.run_threads(n, fn))


@pytest.mark.parametrize("to", [[Replicate()], [Shard(0)], [Shard(1)]])
def test_a_redistributed_transposed_tensor_views_as_one_devices(to):
    """NOTE [pieces in the spec's layout]: a transposed tensor redistributed keeps pieces laid
    out as its strides say, so the views one device's tensor allows work on it (a row-major
    gathered piece under transposed strides would make ``.t().view(-1)`` raise "view size is
    not compatible"). to_local's gradient is covered by parallel_test's attention
    case."""
    g = torch.arange(48.).reshape(8, 6)

    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        x = distribute_tensor(g, mesh, [Shard(0)]).t()  # [6, 8], strides (1, 6), Shard(1)
        y = x.redistribute(mesh, to)
        assert y.stride() == g.t().stride()
        assert torch.equal(y.t().view(-1).full_tensor(), g.view(-1))
        assert torch.equal(y.full_tensor(), g.t())
        return True

    assert all(dtensor.run_threads(2, fn))


@pytest.mark.parametrize("op", ["t_", "transpose_", "swapdims_", "unsqueeze_", "squeeze_",
                                "squeeze_dim"])
def test_in_place_view_ops_keep_the_sharding(op):
    """NOTE [in-place view ops]: t_, transpose_, unsqueeze_, squeeze_ change self's layout as
    their view ops would (t_ of Shard(0) is Shard(1)) with no communication; the replicate
    fallback, which would gather self and leave it Replicate, takes no part. Values and gradients
    equal one device's."""
    fns = {"t_": lambda t: t.t_(), "transpose_": lambda t: t.transpose_(0, 1),
           "swapdims_": lambda t: t.swapdims_(1, 0), "unsqueeze_": lambda t: t.unsqueeze_(1),
           "squeeze_": lambda t: t.unsqueeze_(0).squeeze_(), "squeeze_dim": lambda t: t.unsqueeze_(2).squeeze_(2)}
    f = fns[op]
    g = torch.randn(6, 4, dtype=torch.float64)

    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        for p in [Shard(0), Shard(1)]:
            x = distribute_tensor(g, mesh, [p])
            ref = g.clone()
            with CommDebugMode() as comm:
                y = f(x)
            assert y is x and comm.get_total_counts() == 0, (op, p, comm.get_comm_counts())
            assert x.placements[0].is_shard(), (op, p, x.placements)
            assert torch.equal(x.full_tensor(), f(ref))
            # Through autograd, on a non-leaf.
            w = distribute_tensor(g, mesh, [p]).requires_grad_()
            h = w * 3
            f(h)
            (h * h).sum().backward()
            wr = g.clone().requires_grad_()
            hr = wr * 3
            f(hr)
            (hr * hr).sum().backward()
            torch.testing.assert_close(w.grad.full_tensor(), wr.grad)
        return True

    assert all(dtensor.run_threads(2, fn))


def test_placements_of_the_wrong_length_raise_value_error_as_pytorch():
    """distribute_tensor, from_local and the factories refuse a placement list whose length is
    not the mesh's number of dims with PyTorch's exception type (ValueError), before any work."""
    def fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2, 2))
        t = torch.ones(4, 4)
        for call in (lambda: dtensor.distribute_tensor(t, mesh, [dtensor.Shard(0)]),
                     lambda: dtensor.DTensor.from_local(t, mesh, [dtensor.Replicate()] * 3),
                     lambda: dtensor.zeros(4, 4, device_mesh=mesh, placements=[dtensor.Shard(0)])):
            with pytest.raises(ValueError, match="must have the same length as"):
                call()
        return True

    assert dtensor.run_threads(4, fn) == [True] * 4


@pytest.mark.parametrize("differs", ["dtype", "requires_grad", "transposed"])
def test_from_local_run_check_refuses_pieces_that_differ_with_value_error(differs):
    """from_local(run_check=True) compares every rank's dtype, requires_grad and shape and raises
    ValueError on every rank, as PyTorch's metadata check; run_check=False trusts the caller."""
    def piece(rank):
        t = torch.randn(3, 4, requires_grad=True)
        if rank == 0:
            t = {"dtype": lambda: t.double(), "transposed": lambda: t.t(),
                 "requires_grad": lambda: t.detach()}[differs]()
        return t

    def fn(rank):
        mesh = init_device_mesh("cpu", (4,))
        with pytest.raises(ValueError, match="from_local\\(run_check\\)"):
            DTensor.from_local(piece(rank), mesh, [Shard(0)], run_check=True)
        DTensor.from_local(piece(rank), mesh, [Shard(0)], run_check=False)
        return True

    assert dtensor.run_threads(4, fn) == [True] * 4


def test_only_shards_have_a_dim_and_prod_is_the_product():
    """As PyTorch's: Replicate and Partial have no `dim` (transformers tells shards by
    hasattr(p, "dim"), and read Replicate().split_factor before); Partial("prod") is accepted
    (PyTorch's name) and is the product."""
    from dtensor import Partial
    from dtensor.placement_types import _NormPartial
    assert hasattr(Shard(1), "dim") and Shard(1).dim == 1
    for p in (Replicate(), Partial(), Partial("max"), _NormPartial(3)):
        assert not hasattr(p, "dim"), p
    assert Partial("prod") == Partial("prod") == Partial("product")
    assert Partial("prod").reduce_op == "product"


def test_strided_shard_takes_split_factor_by_keyword_only():
    assert _StridedShard(1, split_factor=4).split_factor == 4
    with pytest.raises(TypeError):
        _StridedShard(1, 4)


def test_prepare_module_io_layouts_of_another_length_raise_assertion_error_as_pytorch():
    from dtensor.parallel import PrepareModuleInput, PrepareModuleOutput

    with pytest.raises(AssertionError, match="should have same length"):
        PrepareModuleInput(input_layouts=Shard(0), desired_input_layouts=(Replicate(), None))
    with pytest.raises(AssertionError, match="should have same length"):
        PrepareModuleOutput(output_layouts=(Shard(0), Shard(1)), desired_output_layouts=Replicate())


@pytest.mark.parametrize("out_placement", [Replicate(), Shard(0), Shard(1), Partial()])
def test_out_arguments_keep_their_placements(out_placement):
    """NOTE [out= keeps its layout]: torch.add(x, 3, out=o) returns o itself with o's placements
    and one device's values, whatever x's layout (PyTorch keeps out's spec)."""
    g = torch.randn(12, 4)

    def fn(rank):
        mesh = init_device_mesh("cpu", (4,))
        for x_placement in (Shard(0), Shard(1), Replicate()):
            x = distribute_tensor(g, mesh, [x_placement])
            o = DTensor.from_local(torch.zeros(12, 4), mesh, [Replicate()]).redistribute(
                mesh, [out_placement]) if not out_placement.is_partial() else DTensor.from_local(
                torch.zeros(12, 4), mesh, [out_placement])
            piece = o.to_local()
            res = torch.add(x, 3, out=o)
            assert res is o and o.placements == (out_placement,), (x_placement, o.placements)
            torch.testing.assert_close(o.full_tensor(), g + 3)
            if not out_placement.is_partial():
                assert o.to_local().data_ptr() == piece.data_ptr()  # written in place
        return True

    assert dtensor.run_threads(4, fn) == [True] * 4


def test_tensors_on_a_sub_mesh_exist_on_every_rank_with_empty_pieces_outside_it():
    """NOTE [ranks outside the mesh]: as PyTorch's, a tensor on DeviceMesh([0, 2]) exists on every
    rank with its global shape; ranks 1 and 3 hold an empty piece, run no kernel and no
    collective, and what exists only on the mesh's ranks (full_tensor, equal's bool) raises
    there. Ranks 0 and 2 compute one device's values."""
    g = torch.arange(24.0).reshape(8, 3)

    def fn(rank):
        mesh = DeviceMesh("cpu", [0, 2])
        inside = rank in (0, 2)
        piece = g[4 * (rank // 2):4 * (rank // 2) + 4].clone().requires_grad_()
        with CommDebugMode() as outside_comm:
            made = {
                "from_local": DTensor.from_local(piece, mesh, [Shard(0)]),
                "distribute_tensor": distribute_tensor(g, mesh, [Shard(0)]),
                "zeros": dtensor.zeros(8, 3, device_mesh=mesh, placements=[Shard(0)]),
            }
        for name, t in made.items():
            assert t.shape == (8, 3) and t.placements == (Shard(0),), name
            want = (4, 3) if inside else (0,)
            assert t.to_local().shape == want, (name, t.to_local().shape)
        x = made["from_local"]
        with CommDebugMode() as comm:
            y = x * 2 + 1
            total = y.sum()
            parts = y.split([2, 1], dim=1)
            r = y.redistribute(mesh, [Replicate()])
        assert y.shape == (8, 3) and total.shape == () and [p.shape for p in parts] == [
            (8, 2), (8, 1)]
        assert r.placements == (Replicate(),)
        if inside:
            torch.testing.assert_close(y.full_tensor(), g * 2 + 1)
            torch.testing.assert_close(total.full_tensor(), (g * 2 + 1).sum())
            torch.testing.assert_close(r.to_local(), g * 2 + 1)
            assert comm.get_total_counts() >= 1
        else:
            assert outside_comm.get_total_counts() == 0 and comm.get_total_counts() == 0
            assert y.to_local().numel() == 0 and r.to_local().numel() == 0
            assert total.to_local().shape == () and [p.to_local().numel() for p in parts] == [0, 0]
            with pytest.raises(RuntimeError, match="full_tensor: rank .* is not in DeviceMesh"):
                y.full_tensor()
            with pytest.raises(RuntimeError, match="aten::equal on rank .*exists only on"):
                torch.equal(x, x)
            with pytest.raises(RuntimeError, match="aten::_local_scalar_dense on rank .*exists"):
                total.item()
        # Gradients reach the pieces on the mesh; the pieces outside take no part.
        (x * x).sum().backward()
        if inside:
            torch.testing.assert_close(piece.grad, 2 * piece.detach())
        else:
            assert piece.grad is None
        return True

    assert dtensor.run_threads(4, fn) == [True] * 4


def test_placements_are_the_cpp_placement_values():
    """NOTE [one Placement type]: Shard, Replicate, Partial and _StridedShard subclass the C++
    classes (as PyTorch's subclass its pybind ones): a subclass must initialize the base, and
    pickling, copying, equality and hashing keep the kinds apart."""
    import copy

    from dtensor import _C
    from dtensor.placement_types import Placement

    class BadPlacement(Placement):
        def __init__(self):
            pass

    with pytest.raises(TypeError, match="must be called"):
        BadPlacement()

    class MyShard(Shard):  # a subclass that initializes the base is a Shard to the engine
        pass

    placements = [Shard(1), Shard(-1), Replicate(), Partial(), Partial("max"),
                  _StridedShard(0, split_factor=2), MyShard(0)]
    for p in placements:
        assert isinstance(p, _C.Placement) and isinstance(p, Placement)
        copies = [copy.deepcopy(p)] + ([] if type(p) is MyShard else [pickle.loads(pickle.dumps(p))])
        for q in copies:
            assert type(q) is type(p) and q == p and hash(q) == hash(p) and repr(q) == repr(p)
    assert _StridedShard(0, split_factor=2) != Shard(0) and MyShard(0) == Shard(0)
    assert len({Shard(0), Shard(0), Replicate(), Partial("sum"), Partial("avg")}) == 4
    assert [str(p) for p in placements[:5]] == ["S(1)", "S(-1)", "R", "P(sum)", "P(max)"]
    assert Partial("max").reduce_op == "max" and Shard(2).dim == 2
    assert (Shard.local_shard_size_and_offset(13, 4, 3), Shard.local_shard_size_and_offset(2, 4, 3)
            ) == ((1, 12), (0, 2))

    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        t = distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [MyShard(0)])
        assert t.placements == (Shard(0),) and torch.equal(t.full_tensor(),
                                                           torch.arange(8.0).reshape(4, 2))
        return True

    assert dtensor.run_threads(2, fn) == [True] * 2


def test_distribute_tensor_refuses_non_leaves_and_other_layouts_of_distributed_tensors():
    """As PyTorch's distribute_tensor: a non-leaf tensor (its result would be cut from the graph)
    raises RuntimeError before any other check; a distributed tensor comes back as is when its
    mesh and placements are the ones asked, and raises ValueError otherwise."""
    t = torch.randn(8, 8)

    def fn(rank):
        mesh = DeviceMesh("cpu", torch.arange(4).reshape(2, 2))
        with pytest.raises(RuntimeError, match="leaf tensors"):
            distribute_tensor(torch.randn(8, 8, requires_grad=True) + 2, mesh, [Shard(0)])
        d = distribute_tensor(t, mesh, [Shard(0), Shard(1)])
        assert distribute_tensor(d, mesh, [Shard(0), Shard(1)]) is d
        with pytest.raises(ValueError, match="to a different device mesh"):
            distribute_tensor(d, DeviceMesh("cpu", torch.arange(4)), [Shard(0)])
        with pytest.raises(ValueError, match="to a different placements"):
            distribute_tensor(d, mesh, [Shard(0), Replicate()])
        return True

    assert dtensor.run_threads(4, fn) == [True] * 4


def test_to_local_grad_placements_flow_on_and_backward_collectives_count_as_backward():
    """to_local(grad_placements=[Partial()]) after a redistribute from Shard(0): the gradient goes
    back as one reduce_scatter (PyTorch's), and CommDebugMode charges it to "backward" even when
    the forward ran outside the mode (PyTorch's comm_module_counts)."""
    g = torch.randn(8, 4)

    def fn(rank):
        mesh = init_device_mesh("cpu", (4,))
        x = distribute_tensor(g.clone().requires_grad_(), mesh, [Shard(0)])
        y = x.redistribute(mesh, [Replicate()]).to_local(grad_placements=[Partial()])
        with CommDebugMode() as comm:
            (y * (rank + 1)).sum().backward()
        assert comm.comm_module_counts["Global"]["backward"] == {"reduce_scatter_tensor": 1}
        assert comm.comm_module_counts["Global"]["forward"] == {}
        assert x.grad.placements == (Shard(0),)
        torch.testing.assert_close(x.grad.full_tensor(), torch.full((8, 4), 10.0))  # 1+2+3+4
        return True

    assert dtensor.run_threads(4, fn) == [True] * 4
