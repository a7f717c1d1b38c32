"""Parity of the dtensor package's API with PyTorch 2.11's torch.distributed.tensor and
torch.distributed.device_mesh where users meet it: pickling and torch.save of distributed tensors
and meshes, DeviceMesh.get_coordinate and _flatten, dtensor.random, distribute_module's
two-argument hooks, distribute_tensor to Partial. Ranks as threads (simulation mode)."""

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
            DTensor.from_local(torch.ones(1, 3) * rank, mesh, [_StridedShard(0, 2), Shard(0)]),
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
