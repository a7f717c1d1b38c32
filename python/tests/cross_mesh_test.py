"""NOTE [cross-mesh redistribute] (dtensor/redistribute.h) from Python: DTensor.redistribute to
another mesh (PyTorch raises "Cross device mesh comm not supported yet!"). Values equal one
device's on every rank of the target mesh, the ranks outside it hold no piece, the gradient goes
back the same way, and only the elements a target piece lacks move (CommDebugMode's bytes).
Ranks as threads, then as processes on the shm and c10d (Gloo) backends."""

import pytest
import torch

import dtensor
from dtensor import DeviceMesh, Partial, Replicate, Shard

from launch_ranks import run_on_ranks


def _check_move(rank, x, src_mesh, src_pl, dst_mesh, dst_pl):
    a = dtensor.distribute_tensor(x, src_mesh, src_pl)
    b = a.redistribute(dst_mesh, dst_pl)
    assert b.device_mesh == dst_mesh and tuple(b.placements) == tuple(dst_pl)
    if rank in dst_mesh.mesh.flatten().tolist():
        torch.testing.assert_close(b.full_tensor(), x, rtol=0, atol=0)
    else:
        assert b.to_local().numel() == 0  # no piece outside the target mesh


@pytest.mark.parametrize("dst_ranks", [[2, 3], [1, 2, 3], [3, 2, 1, 0]])
def test_values_on_every_layout_pair(dst_ranks):
    x = torch.arange(7 * 6, dtype=torch.float32).reshape(7, 6)

    def fn(rank):
        src = DeviceMesh("cpu", [0, 1])
        dst = DeviceMesh("cpu", dst_ranks)
        for sp in ([Shard(0)], [Shard(1)], [Replicate()]):
            for dp in ([Shard(0)], [Shard(1)], [Replicate()]):
                _check_move(rank, x, src, sp, dst, dp)

    dtensor.run_threads(4, fn)


def test_partial_source_arrives_reduced_and_2d_meshes():
    x = torch.randn(8, 4)

    def fn(rank):
        src = DeviceMesh("cpu", [[0, 1], [2, 3]])
        dst = DeviceMesh("cpu", [3, 2, 1, 0])
        rows = x[:4] if rank in (0, 1) else x[4:]  # mesh dim 0 splits rows; dim 1 is Partial
        p = dtensor.DTensor.from_local(rows / 2, src, [Shard(0), Partial()])
        q = p.redistribute(dst, [Shard(1)])
        torch.testing.assert_close(q.full_tensor(), x)
        # 2-D to 2-D, and back (a round trip between meshes of other shapes)
        r = q.redistribute(src, [Shard(1), Shard(0)])
        torch.testing.assert_close(r.full_tensor(), x)

    dtensor.run_threads(4, fn)


def test_gradient_goes_back_the_same_way():
    """Stage-like use: the tensor lives on ranks 0, 1, the loss on ranks 2, 3; every rank runs
    the same program and the gradient of the source arrives on 0, 1 as one device's."""
    torch.manual_seed(0)
    w0 = torch.randn(6, 4)

    def fn(rank):
        a_mesh, b_mesh = DeviceMesh("cpu", [0, 1]), DeviceMesh("cpu", [2, 3])
        w = dtensor.distribute_tensor(w0, a_mesh, [Shard(0)]).requires_grad_()
        v = w.redistribute(b_mesh, [Shard(1)])
        loss = (v * v).sum()
        loss.backward()
        if rank in (0, 1):
            assert w.grad.placements == (Shard(0),)
            return w.grad.full_tensor()
        return None

    got = dtensor.run_threads(4, fn)
    for g in got[:2]:
        torch.testing.assert_close(g, 2 * w0)


def test_communication_is_only_the_missing_elements():
    """Replicate on [0, 1] -> Shard(0) on [1, 2]: rank 1 already holds its rows and copies them;
    rank 2 receives only its half, once (not the whole tensor, not from both replicas)."""
    from dtensor.debug import CommDebugMode

    x = torch.randn(8, 4)

    def fn(rank):
        a_mesh, b_mesh = DeviceMesh("cpu", [0, 1]), DeviceMesh("cpu", [1, 2])
        a = dtensor.distribute_tensor(x, a_mesh, [Replicate()])
        with CommDebugMode() as mode:
            b = a.redistribute(b_mesh, [Shard(0)])
        if rank == 1:
            torch.testing.assert_close(b.to_local(), x[:4])
        if rank == 2:
            torch.testing.assert_close(b.to_local(), x[4:])
        return mode.get_total_counts()

    counts = dtensor.run_threads(3, fn)
    assert counts == [1, 1, 1], counts  # one exchange over the three ranks


WORKER = r'''
import os, torch, dtensor
from dtensor import DeviceMesh, Replicate, Shard, Partial
rank = int(os.environ["RANK"])
dtensor.init_device_mesh("cpu", (4,))
x = torch.arange(5 * 3, dtype=torch.float32).reshape(5, 3)
a_mesh, b_mesh = DeviceMesh("cpu", [0, 1]), DeviceMesh("cpu", [[3], [2]])
for sp in ([Shard(0)], [Replicate()]):
    a = dtensor.distribute_tensor(x, a_mesh, sp).requires_grad_()
    b = a.redistribute(b_mesh, [Shard(1), Replicate()])
    if rank in (2, 3):
        assert torch.equal(b.full_tensor(), x), (rank, b.to_local())
    (b * 3).sum().backward()
    if rank in (0, 1):
        assert torch.equal(a.grad.full_tensor(), torch.full((5, 3), 3.0)), a.grad.to_local()
print("ok")
'''


@pytest.mark.parametrize("backend", ["shm", "c10d"])
def test_processes(tmp_path, backend):
    run_on_ranks(WORKER, 4, tmp_path, DTENSOR_BACKEND=backend)
