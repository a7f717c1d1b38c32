"""Bad input through the Python package on 4 thread ranks: each case gets a clear error naming
what is wrong (op or collective, placements, rank), or the result one device gives.
"""

import pytest
import torch

import dtensor
from dtensor import DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh

WORLD = 4


def on_ranks(fn, world=WORLD):
    """Runs fn(rank) on `world` thread ranks and returns the results (raising the first error)."""
    return dtensor.run_threads(world, fn)


# ---- Partial(op) and scalars: a scalar is added once, not once per rank ----

SCALAR_CASES = {
    "x + 1": lambda x: x + 1,
    "1 + x": lambda x: 1 + x,
    "x - 1": lambda x: x - 1,
    "1 - x": lambda x: 1 - x,
    "x + tensor(1.)": lambda x: x + torch.tensor(1.0),
    "add(x, 1, alpha=2)": lambda x: torch.add(x, 1, alpha=2),
    "sub(x, 1, alpha=3)": lambda x: torch.sub(x, 1, alpha=3),
    "rsub(x, 1)": lambda x: torch.rsub(x, 1),
    "x * 2": lambda x: x * 2,
    "x / 4": lambda x: x / 4,
    "x + x": lambda x: x + x,
    "add(x, x, alpha=2)": lambda x: torch.add(x, x, alpha=2),
    "x + 1.5 then * 2": lambda x: (x + 1.5) * 2,
    "exp(x)": torch.exp,
    "x.sum() + 1": lambda x: x.sum() + 1,
    "clamp(x, max=5)": lambda x: torch.clamp(x, max=5.0),
}


@pytest.mark.parametrize("reduce_op", ["sum", "avg", "max", "min"])
@pytest.mark.parametrize("case", sorted(SCALAR_CASES))
def test_partial_with_scalars_equals_one_device(case, reduce_op):
    f = SCALAR_CASES[case]
    pieces = [torch.arange(3.0) + r * 1.5 for r in range(WORLD)]
    stacked = torch.stack(pieces)
    whole = {"sum": stacked.sum(0), "avg": stacked.mean(0), "max": stacked.amax(0),
             "min": stacked.amin(0)}[reduce_op]
    want = f(whole)

    def fn(rank):
        mesh = init_device_mesh("cpu", (WORLD,))
        x = DTensor.from_local(pieces[rank].clone(), mesh, [Partial(reduce_op)])
        return f(x).full_tensor()

    for got in on_ranks(fn):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("case", ["add_", "sub_", "mul_ then add_"])
def test_in_place_scalar_on_partial_adds_it_once(case):
    """x.add_(1) on a Partial(sum) x must not add 1 on every rank (the sum would grow by the
    world size). It was a clear error; since in-place ops copy their result into a Partial self by
    partition (NOTE [in-place by copy]) it gives one device's result and x stays Partial."""
    ops = {"add_": lambda t: t.add_(1), "sub_": lambda t: t.sub_(1),
           "mul_ then add_": lambda t: t.mul_(2).add_(1)}
    want = ops[case](torch.full((3,), float(WORLD)))

    def fn(rank):
        mesh = init_device_mesh("cpu", (WORLD,))
        x = DTensor.from_local(torch.ones(3), mesh, [Partial()])
        assert ops[case](x) is x
        assert x.placements == (Partial(),)
        return x.full_tensor()

    for got in on_ranks(fn):
        torch.testing.assert_close(got, want)


# ---- from_local(run_check=True) ----

def test_from_local_run_check_makes_replicas_equal_to_the_first_rank():
    def fn(rank):
        mesh = init_device_mesh("cpu", (WORLD,))
        local = torch.full((2, 3), float(rank))
        t = DTensor.from_local(local, mesh, [Replicate()], run_check=True)
        torch.testing.assert_close(t.to_local(), torch.zeros(2, 3))
        torch.testing.assert_close(local, torch.zeros(2, 3))  # written in place, as PyTorch's
        return True

    assert all(on_ranks(fn))


def test_from_local_run_check_on_a_2d_mesh_broadcasts_along_replicate_dims_only():
    def fn(rank):
        mesh = init_device_mesh("cpu", (2, 2))
        # Shard(0) over mesh dim 0, Replicate over mesh dim 1: ranks (i, 0) lead their rows.
        t = DTensor.from_local(torch.full((1, 2), float(rank)), mesh, [Shard(0), Replicate()],
                               run_check=True)
        return t.full_tensor()

    for got in on_ranks(fn):
        torch.testing.assert_close(got, torch.tensor([[0.0, 0.0], [2.0, 2.0]]))


def test_from_local_run_check_names_the_rank_with_a_wrong_shape():
    def fn(rank):
        mesh = init_device_mesh("cpu", (WORLD,))
        local = torch.ones(3 if rank == 2 else 2)
        with pytest.raises(ValueError, match=r"rank 2 Float\[3\]"):
            DTensor.from_local(local, mesh, [Shard(0)], run_check=True)
        return True

    assert all(on_ranks(fn))


def test_from_local_run_check_names_a_wrong_dtype():
    def fn(rank):
        mesh = init_device_mesh("cpu", (WORLD,))
        local = torch.ones(2, dtype=torch.float64 if rank == 1 else torch.float32)
        with pytest.raises(ValueError, match="from_local.*rank"):  # PyTorch's type
            DTensor.from_local(local, mesh, [Replicate()], run_check=True)
        return True

    assert all(on_ranks(fn))


# ---- meshes and placements ----

@pytest.mark.parametrize("device_type", ["xpu_nonsense", "", "CPU", "gpu", "cuda:0"])
def test_unknown_device_type_is_refused(device_type):
    def fn(rank):
        with pytest.raises(RuntimeError, match="device_type"):
            init_device_mesh(device_type, (WORLD,))
        return True

    assert all(on_ranks(fn))


@pytest.mark.parametrize("shape", [(3,), (5,), (2, 3), (8,), (0,)])
def test_mesh_that_does_not_fit_the_world_is_refused(shape):
    def fn(rank):
        with pytest.raises(RuntimeError, match="world|size|rank"):
            init_device_mesh("cpu", shape)
        return True

    assert all(on_ranks(fn))


@pytest.mark.parametrize("placements,match", [
    ([Shard(2)], "dim"),
    ([Shard(-3)], "dim"),
    ([Shard(0), Shard(1)], "placements|mesh"),
    ([], "placements|mesh"),
])
def test_bad_placements_are_refused(placements, match):
    def fn(rank):
        mesh = init_device_mesh("cpu", (WORLD,))
        # Python-side argument checks raise ValueError (as PyTorch's do), the engine RuntimeError.
        with pytest.raises((RuntimeError, ValueError), match=match):
            distribute_tensor(torch.ones(4, 4), mesh, placements)
        return True

    assert all(on_ranks(fn))


def test_placement_of_the_wrong_type_is_a_type_error():
    def fn(rank):
        mesh = init_device_mesh("cpu", (WORLD,))
        with pytest.raises(TypeError, match="Placement"):
            distribute_tensor(torch.ones(4), mesh, ["S(0)"])
        return True

    assert all(on_ranks(fn))


def test_ops_across_meshes_are_refused_naming_the_meshes():
    def fn(rank):
        a = init_device_mesh("cpu", (WORLD,))
        b = init_device_mesh("cpu", (2, 2))
        x = distribute_tensor(torch.ones(4, 4), a, [Shard(0)])
        y = distribute_tensor(torch.ones(4, 4), b, [Shard(0), Replicate()])
        with pytest.raises(RuntimeError, match="mesh"):
            x + y
        return True

    assert all(on_ranks(fn))


def test_plain_tensor_mixed_with_distributed_is_refused_naming_the_argument():
    def fn(rank):
        mesh = init_device_mesh("cpu", (WORLD,))
        x = distribute_tensor(torch.ones(4, 4), mesh, [Shard(0)])
        with pytest.raises(RuntimeError, match="aten::add.*'other'.*plain tensor"):
            x + torch.ones(4, 4)
        return True

    assert all(on_ranks(fn))


@pytest.mark.parametrize("dim", [2, -3, 7])
def test_reduction_over_a_missing_dim_is_refused(dim):
    def fn(rank):
        mesh = init_device_mesh("cpu", (WORLD,))
        x = distribute_tensor(torch.ones(4, 4), mesh, [Shard(0)])
        with pytest.raises((RuntimeError, IndexError), match="dim|range"):
            x.sum(dim)
        return True

    assert all(on_ranks(fn))


def test_shape_mismatch_names_the_op_and_shapes():
    def fn(rank):
        mesh = init_device_mesh("cpu", (WORLD,))
        x = distribute_tensor(torch.ones(4, 4), mesh, [Shard(0)])
        y = distribute_tensor(torch.ones(3, 5), mesh, [Replicate()])
        with pytest.raises(RuntimeError, match=r"aten::mm|\[4,4\]|4x4"):
            torch.mm(x, y)
        return True

    assert all(on_ranks(fn))


# ---- groups ----

@pytest.mark.parametrize("ranks,message", [
    ([0, 0, 1], r"lists rank 0 twice \(ranks \[0,0,1\]\)"),
    ([0, 7], r"names rank 7 outside the world of size 4"),
    ([], r"has no ranks"),
])
def test_new_group_with_bad_ranks_is_refused_on_every_rank(ranks, message):
    import dtensor._functional_collectives as F

    def fn(rank):
        with pytest.raises(RuntimeError, match=message):
            F.new_group(ranks)
        return True

    assert all(on_ranks(fn))
