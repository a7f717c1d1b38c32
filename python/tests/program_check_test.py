"""Ranks that run different programs (NOTE [program digest]): a sweep that drew op_db's
samples in each process got a different Python-random margin (delta) on each rank for
hinge_embedding_loss, cosine_embedding_loss and huber_loss; each rank computed its pieces with its
own scalar and full_tensor returned a mix, silently. Now the next collective on the mesh fails on
every rank naming both op counts; with one margin on every rank the results equal one device's.
Real processes (shm, c10d) and ranks as threads, uneven pieces (5 on 4 ranks).
"""

import pytest
import torch

import dtensor
from dtensor import Shard, distribute_tensor, init_device_mesh
from launch_ranks import run_on_ranks

WORKER = r'''
import os, torch
import torch.nn.functional as F
from dtensor import Replicate, Shard, distribute_tensor, init_device_mesh

rank = int(os.environ["RANK"])
torch.manual_seed(0)
x, t = torch.randn(5, 5), torch.randn(5, 5)
y = torch.randint(0, 2, (5,)).float() * 2 - 1
losses = {
    "hinge_embedding_loss": lambda a, tt, yy, m: F.hinge_embedding_loss(a, tt.sign(), margin=m,
                                                                        reduction="none"),
    "huber_loss": lambda a, tt, yy, m: F.huber_loss(a, tt, delta=m, reduction="none"),
    "cosine_embedding_loss": lambda a, tt, yy, m: F.cosine_embedding_loss(a, tt, yy, margin=m / 10,
                                                                          reduction="none"),
}
for name, fn in losses.items():
    for d in (0, 1):
        # A mesh per case: a rank's digest is cumulative, so a mesh whose ranks diverged stays so.
        mesh = init_device_mesh("cpu", (4,), mesh_dim_names=(f"{name}{d}",))
        R = lambda v: distribute_tensor(v, mesh, [Replicate()])  # noqa: E731
        # The same margin on every rank: one device's result.
        got = fn(distribute_tensor(x, mesh, [Shard(d)]), R(t), R(y), 0.7).full_tensor()
        torch.testing.assert_close(got, fn(x, t, y, 0.7), msg=lambda m: f"{name} S({d}): {m}")
        # A margin per rank: an error on every rank at the next collective, never a mix. The
        # collective is the gather of a Shard(0) layout: a Replicate result's full_tensor()
        # communicates nothing (cosine_embedding_loss of S(1) inputs reduces its Partial cosine
        # once, before the margin is applied, NOTE [a Partial reduced once]).
        try:
            out = fn(distribute_tensor(x, mesh, [Shard(d)]), R(t), R(y), 0.7 + rank)
            out.redistribute(mesh, [Shard(0)]).full_tensor()
        except RuntimeError as e:
            assert "program differs" in str(e), e
        else:
            raise AssertionError(f"{name} S({d}): ranks with different margins were not caught")
print("ok")
'''


@pytest.mark.parametrize("backend", ["shm", "c10d"])
def test_ranks_with_different_scalars_fail_never_mix(tmp_path, backend):
    run_on_ranks(WORKER, 4, tmp_path, DTENSOR_BACKEND=backend)


def test_ranks_as_threads_with_different_scalars_fail():
    x = torch.randn(5)

    def fn(rank):
        mesh = init_device_mesh("cpu", (4,))
        d = distribute_tensor(x, mesh, [Shard(0)])
        same = torch.nn.functional.huber_loss(d, d * 0, delta=0.5, reduction="none")
        torch.testing.assert_close(same.full_tensor(),
                                   torch.nn.functional.huber_loss(x, x * 0, delta=0.5,
                                                                  reduction="none"))
        with pytest.raises(RuntimeError, match="program differs"):
            torch.nn.functional.huber_loss(d, d * 0, delta=0.5 + rank,
                                           reduction="none").full_tensor()
        return True

    assert dtensor.run_threads(4, fn) == [True] * 4


# op_db's meshgrid samples iterate a set of strings ({"xy", "ij"}), whose order depends on
# PYTHONHASHSEED: processes started without one fixed build their samples in different orders, so
# rank 0 ran meshgrid(indexing="ij") while its peers ran "xy". The engine reported it at the next
# collective, on every rank; but each rank's digest kept the divergence, so every later collective
# on the mesh failed too and the job was unusable. Now the check starts over where it reported.
RECOVER_WORKER = r'''
import os, torch
from dtensor import Replicate, Shard, distribute_tensor, init_device_mesh

rank = int(os.environ["RANK"])
mesh = init_device_mesh("cpu", (4,))
a, b = torch.arange(3.), torch.arange(5.)
for placements in ([Shard(0)], [Replicate()]):
    for case in range(3):
        da, db = (distribute_tensor(t, mesh, placements) for t in (a, b))
        mine = "ij" if rank == 0 else "xy"  # as op_db's samples under different hash seeds
        try:
            [g.full_tensor() for g in torch.meshgrid(da, db, indexing=mine)]
            diverged = False
        except RuntimeError as e:
            assert "program differs" in str(e), e
            diverged = True
        assert diverged == (placements == [Shard(0)]), (placements, case)  # Replicate gathers nothing
        # The same program again on every rank: one device's values, on the same mesh.
        for indexing in ("ij", "xy"):
            got = [g.full_tensor() for g in torch.meshgrid(da, db, indexing=indexing)]
            want = torch.meshgrid(a, b, indexing=indexing)
            assert all(torch.equal(g, w) for g, w in zip(got, want)), (placements, case, indexing)
print("ok")
'''


@pytest.mark.parametrize("backend", ["shm", "c10d"])
def test_a_reported_divergence_leaves_the_mesh_usable(tmp_path, backend):
    run_on_ranks(RECOVER_WORKER, 4, tmp_path, DTENSOR_BACKEND=backend)
