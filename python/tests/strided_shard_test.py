"""_StridedShard as a placement of the engine (NOTE [strided shards] in layout/dtensor_spec.h):
PyTorch 2.11's rule for its pieces (chunk the dim into split_factor pieces, chunk each over the
ranks, rank i holds chunk i of every piece), distribute_tensor, redistribute to and from it,
full_tensor, a packed gate/up linear (Hugging Face's packed_colwise) against one device, the
FSDP-over-TP form printing as before, checkpoints and a move to another mesh. Ranks as threads
(simulation mode)."""

import pickle

import pytest
import torch
import torch.nn.functional as F

import dtensor
from dtensor import DTensor, Replicate, Shard, distribute_tensor, init_device_mesh
from dtensor.debug import CommDebugMode
from dtensor.placement_types import _StridedShard


def _pytorch_piece(x, dim, split_factor, n, i):
    """PyTorch's _StridedShard split by hand: torch.chunk into split_factor pieces, torch.chunk
    of each over n ranks, chunk i of each (empty where torch.chunk makes fewer)."""

    def chunk(t, k, j):
        pieces = t.chunk(k, dim)
        return pieces[j] if j < len(pieces) else t.narrow(dim, t.size(dim), 0)

    return torch.cat([chunk(chunk(x, split_factor, j), n, i) for j in range(split_factor)], dim)


def test_distribute_tensor_gives_pytorchs_pieces():
    x = torch.arange(8.0)
    s = _StridedShard(0, split_factor=2)

    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        d = distribute_tensor(x, mesh, [s])
        assert d.placements == (s,) and str(d.placements[0]) == "_S(0,2)"
        assert d.to_local().tolist() == ([0, 1, 4, 5] if rank == 0 else [2, 3, 6, 7])
        return True

    assert dtensor.run_threads(2, fn) == [True] * 2


@pytest.mark.parametrize("shape,dim,sf", [((13, 3), 0, 2), ((5, 7), 1, 3), ((2, 6), 0, 3)])
def test_uneven_pieces_follow_torch_chunk_on_4_ranks(shape, dim, sf):
    x = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
    placements = [_StridedShard(dim, split_factor=sf)]

    def fn(rank):
        mesh = init_device_mesh("cpu", (4,))
        want = _pytorch_piece(x, dim, sf, 4, rank)
        for src_data_rank in (0, None):
            d = distribute_tensor(x, mesh, placements, src_data_rank=src_data_rank)
            assert torch.equal(d.to_local(), want), (rank, d.to_local(), want)
        assert torch.equal(d.full_tensor(), x)
        # from_local with the global shape takes the same pieces back.
        back = DTensor.from_local(want, mesh, placements, shape=x.shape, stride=x.stride())
        assert torch.equal(back.full_tensor(), x)
        return True

    assert dtensor.run_threads(4, fn) == [True] * 4


@pytest.mark.parametrize("target", [[Replicate()], [Shard(0)], [Shard(1)],
                                    [_StridedShard(1, split_factor=3)]])
def test_redistribute_to_and_from_strided(target):
    x = torch.arange(70.0).reshape(10, 7)
    s = [_StridedShard(0, split_factor=2)]

    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        d = distribute_tensor(x, mesh, s)
        moved = d.redistribute(mesh, target)
        assert tuple(moved.placements) == tuple(target)
        assert torch.equal(moved.to_local(), distribute_tensor(x, mesh, target).to_local())
        back = moved.redistribute(mesh, s)
        assert back.placements == d.placements and torch.equal(back.to_local(), d.to_local())
        assert torch.equal(moved.full_tensor(), x) and torch.equal(back.full_tensor(), x)
        return True

    assert dtensor.run_threads(2, fn) == [True] * 2


def test_replicate_to_strided_is_local_and_strided_to_replicate_one_all_gather():
    x = torch.arange(16.0).reshape(8, 2)

    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        r = distribute_tensor(x, mesh, [Replicate()])
        with CommDebugMode() as comm:
            s = r.redistribute(mesh, [_StridedShard(0, split_factor=2)])
        assert comm.get_total_counts() == 0
        with CommDebugMode() as comm:
            back = s.redistribute(mesh, [Replicate()])
        assert comm.get_total_counts() == 1 and torch.equal(back.to_local(), x)
        return True

    assert dtensor.run_threads(2, fn) == [True] * 2


@pytest.mark.parametrize("world", [2, 4])
def test_packed_gate_up_linear_matches_one_device(world):
    """transformers' packed_colwise: the fused gate/up weight on [_StridedShard(0, sf=2)] over
    the TP mesh, a replicated input: each rank computes its gate and its up columns with no
    communication, the output stays strided on its last dim, and gradients match one device."""
    torch.manual_seed(0)
    hidden, inter, batch = 6, 8, 5
    w = torch.randn(2 * inter, hidden)
    b = torch.randn(2 * inter)
    x = torch.randn(batch, hidden)
    ref_w, ref_b = w.clone().requires_grad_(), b.clone().requires_grad_()
    ref = F.linear(x, ref_w, ref_b)
    gate, up = ref.chunk(2, -1)
    (F.silu(gate) * up).sum().backward()

    def fn(rank):
        mesh = init_device_mesh("cpu", (world,))
        packed = [_StridedShard(0, split_factor=2)]
        dw = distribute_tensor(w, mesh, packed).requires_grad_()
        db = distribute_tensor(b, mesh, packed).requires_grad_()
        # Rank r holds its gate rows, then its up rows.
        rows = inter // world
        want = torch.cat([w[rank * rows:(rank + 1) * rows],
                          w[inter + rank * rows:inter + (rank + 1) * rows]])
        assert torch.equal(dw.to_local(), want)
        dx = distribute_tensor(x, mesh, [Replicate()])
        with CommDebugMode() as comm:
            out = F.linear(dx, dw, db)
        assert comm.get_total_counts() == 0, comm.get_comm_counts()
        assert out.placements == (_StridedShard(1, split_factor=2),)
        torch.testing.assert_close(out.full_tensor(), ref, rtol=1e-5, atol=1e-5)
        # The local gate/up split of each rank's piece is its piece of silu(gate) * up.
        local_gate, local_up = out.to_local().chunk(2, -1)
        full = out.full_tensor()
        assert torch.equal(local_gate, full[:, :inter][:, rank * rows:(rank + 1) * rows])
        g, u = out.full_tensor().chunk(2, -1)
        loss = (F.silu(g) * u).sum()
        loss.backward()
        assert dw.grad.placements == tuple(packed)
        torch.testing.assert_close(dw.grad.full_tensor(), ref_w.grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(db.grad.full_tensor(), ref_b.grad, rtol=1e-5, atol=1e-5)
        return True

    assert dtensor.run_threads(world, fn) == [True] * world


def test_pointwise_ops_keep_the_strided_layout():
    x = torch.arange(24.0).reshape(8, 3)

    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        s = [_StridedShard(0, split_factor=2)]
        a = distribute_tensor(x, mesh, s)
        bb = distribute_tensor(x * 2, mesh, s)
        with CommDebugMode() as comm:
            y = torch.relu(a * bb + 1)
        assert comm.get_total_counts() == 0 and y.placements == tuple(s)
        assert torch.equal(y.full_tensor(), torch.relu(x * (x * 2) + 1))
        # An op whose rule takes no strided input gets it redistributed first (one device's
        # answer all the same).
        assert torch.equal(a.sum(0).full_tensor(), x.sum(0))
        assert torch.equal(a.reshape(24).full_tensor(), x.reshape(24))
        assert torch.equal(a.t().full_tensor(), x.t())
        assert torch.equal(torch.cumsum(a, 0).full_tensor(), torch.cumsum(x, 0))
        return True

    assert dtensor.run_threads(2, fn) == [True] * 2


def test_fsdp_over_tp_form_prints_as_before():
    """The box form (FSDP over TP) is a Shard with an order inside; placements, repr and pickling
    give PyTorch's _StridedShard back, as before."""
    x = torch.arange(32.0).reshape(8, 4)

    def fn(rank):
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        placements = [_StridedShard(0, split_factor=2), Shard(0)]
        d = distribute_tensor(x, mesh, placements)
        assert d.placements == tuple(placements)
        assert "placements=(_StridedShard(dim=0, sf=2), Shard(dim=0))" in repr(d)
        # (0,0) rows [0,1], (0,1) [4,5], (1,0) [2,3], (1,1) [6,7] (REFERENCE, PyTorch 2.11).
        first = {0: 0, 1: 4, 2: 2, 3: 6}[rank]
        assert torch.equal(d.to_local(), x[first:first + 2])
        again = pickle.loads(pickle.dumps(d))
        assert again.placements == d.placements and torch.equal(again.to_local(), d.to_local())
        assert torch.equal(d.redistribute(mesh, [Replicate(), Shard(0)]).full_tensor(), x)
        return True

    assert dtensor.run_threads(4, fn) == [True] * 4


def test_redistribute_with_forward_dtype_keeps_the_shard_order():
    """redistribute(forward_dtype=...) re-wraps the cast piece in the same layout: for the
    FSDP-over-TP form that layout includes its shard order (it was read in the default order)."""
    x = torch.arange(32.0).reshape(8, 4)

    def fn(rank):
        mesh = init_device_mesh("cpu", (2, 2))
        d = distribute_tensor(x, mesh, [_StridedShard(0, split_factor=2), Shard(0)])
        y = d.redistribute(mesh, [Replicate(), Replicate()], forward_dtype=torch.float64)
        assert y.dtype == torch.float64 and torch.equal(y.to_local(), x.double())
        g = distribute_tensor(x, mesh, [_StridedShard(0, split_factor=2), Replicate()])
        z = g.redistribute(mesh, [Shard(0), Replicate()], forward_dtype=torch.float64)
        assert torch.equal(z.full_tensor(), x.double())
        return True

    assert dtensor.run_threads(4, fn) == [True] * 4


def test_general_strided_shard_on_a_2d_mesh_and_refused_combinations():
    x = torch.arange(48.0).reshape(8, 6)

    def fn(rank):
        mesh = init_device_mesh("cpu", (2, 2))
        p = [_StridedShard(0, split_factor=2), _StridedShard(1, split_factor=3)]
        d = distribute_tensor(x, mesh, p)
        assert d.placements == tuple(p)
        row, col = divmod(rank, 2)
        want = _pytorch_piece(_pytorch_piece(x, 0, 2, 2, row), 1, 3, 2, col)
        assert torch.equal(d.to_local(), want)
        assert torch.equal(d.redistribute(mesh, [Shard(1), Shard(0)]).full_tensor(), x)
        again = pickle.loads(pickle.dumps(d))
        assert again.placements == d.placements and torch.equal(again.to_local(), d.to_local())
        with pytest.raises(RuntimeError, match=r"\[S\(0\),_S\(0,2\)\] on mesh \(2,2\)"):
            distribute_tensor(x, mesh, [Shard(0), _StridedShard(0, split_factor=2)])
        return True

    assert dtensor.run_threads(4, fn) == [True] * 4


def test_checkpoint_and_another_mesh(tmp_path):
    from dtensor import checkpoint

    x = torch.arange(40.0).reshape(10, 4)

    def fn(rank):
        world = init_device_mesh("cpu", (4,))
        s = [_StridedShard(0, split_factor=2)]
        d = distribute_tensor(x, world, s)
        checkpoint.save({"w": d}, checkpoint_id=str(tmp_path / "ckpt"))
        into = distribute_tensor(torch.zeros(10, 4), world, s)
        state = {"w": into}
        checkpoint.load(state, checkpoint_id=str(tmp_path / "ckpt"))
        assert torch.equal(state["w"].to_local(), d.to_local())
        assert torch.equal(state["w"].full_tensor(), x)
        # To a mesh of other ranks, strided there too.
        pair = dtensor.DeviceMesh("cpu", [2, 3])
        moved = d.redistribute(pair, [_StridedShard(0, split_factor=2)])
        if rank in (2, 3):
            assert torch.equal(moved.to_local(), _pytorch_piece(x, 0, 2, 2, rank - 2))
            assert torch.equal(moved.full_tensor(), x)
        return True

    assert dtensor.run_threads(4, fn) == [True] * 4


def test_placement_class():
    s = _StridedShard(1, split_factor=4)
    assert s.split_factor == 4 and s.dim == 1 and not s.is_shard() and s.is_strided_shard()
    assert repr(s) == "_StridedShard(dim=1, sf=4)" and str(s) == "_S(1,4)"
    assert s != Shard(1) and s == _StridedShard(1, split_factor=4)
    assert pickle.loads(pickle.dumps(s)) == s
    with pytest.raises(TypeError):
        _StridedShard(1, 4)
