"""NOTE [rank generators agree] (dtensor/random.h): random ops on distributed tensors give one
device's values, and equal Replicate replicas, only when every rank draws from a generator in the
same state. Ranks whose generators differ fail instead of returning replicas that differ: ranks
as threads without dtensor.manual_seed raise at the op; processes seeded differently fail at the
next collective on the mesh, on every rank. Both returned differing "replicas" silently before."""

import pytest
import torch
import torch.nn.functional as F

import dtensor
from dtensor import Replicate, distribute_tensor
from launch_ranks import run_on_ranks


@pytest.mark.parametrize("op", ["randn", "dropout"])
def test_thread_ranks_without_their_own_generator_raise(op):
    def fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        with pytest.raises(RuntimeError, match="dtensor.manual_seed"):
            if op == "randn":
                dtensor.randn(4, device_mesh=mesh, placements=[Replicate()])
            else:
                F.dropout(distribute_tensor(torch.ones(8), mesh, [Replicate()]), 0.5)
        return True

    assert all(dtensor.run_threads(2, fn))


def test_thread_ranks_seeded_alike_draw_equal_replicas():
    def fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        dtensor.manual_seed(7)
        a = dtensor.randn(4, device_mesh=mesh, placements=[Replicate()])
        b = F.dropout(distribute_tensor(torch.ones(8), mesh, [Replicate()]), 0.5)
        return a.to_local(), b.to_local()

    (a0, b0), (a1, b1) = dtensor.run_threads(2, fn)
    assert torch.equal(a0, a1) and torch.equal(b0, b1)


_WORKER = r'''
import os
import torch
import dtensor
from dtensor import Replicate, Shard
rank = int(os.environ["RANK"])
torch.manual_seed(SEED_OF_RANK)
mesh = dtensor.init_device_mesh("cpu", (2,))
a = dtensor.randn(4, 3, device_mesh=mesh, placements=[Replicate()])
try:
    whole = dtensor.randn(4, 3, device_mesh=mesh, placements=[Shard(0)]).full_tensor()
except RuntimeError as e:
    assert "program differs" in str(e), e
    print("raised")
else:
    torch.manual_seed(SEED_OF_RANK)
    torch.testing.assert_close(a.to_local(), torch.randn(4, 3))
    torch.testing.assert_close(whole, torch.randn(4, 3))
print("ok")
'''


@pytest.mark.parametrize("seeds", ["alike", "per_rank"])
def test_processes_seeded_differently_fail_at_the_next_collective(seeds, tmp_path):
    seed = "0" if seeds == "alike" else "rank"
    out = run_on_ranks(_WORKER.replace("SEED_OF_RANK", seed), 2, tmp_path)
    assert out.count("raised") == (0 if seeds == "alike" else 2), out


@pytest.mark.parametrize("op", ["dropout", "uniform_", "rand_like"])
def test_random_op_on_a_non_row_major_tensor_raises(op):
    """NOTE [random draws in row-major order]: one device fills a transposed tensor in memory
    order; the engine's replay is row-major, so dropout of a transposed distributed tensor gave
    other values than one device's, silently. It raises; .contiguous() first gives one device's
    values."""
    torch.manual_seed(7)
    ref = F.dropout(torch.ones(3, 4).t().contiguous(), 0.5)

    def fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        dtensor.manual_seed(7)
        x = distribute_tensor(torch.ones(3, 4), mesh, [dtensor.Shard(0)]).t()
        with pytest.raises(RuntimeError, match="row-major"):
            {"dropout": lambda: F.dropout(x, 0.5), "uniform_": lambda: x.uniform_(),
             "rand_like": lambda: torch.rand_like(x)}[op]()
        dtensor.manual_seed(7)
        return F.dropout(x.contiguous(), 0.5).full_tensor()

    for got in dtensor.run_threads(2, fn):
        torch.testing.assert_close(got, ref)
