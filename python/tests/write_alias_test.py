"""Writes and aliasing of distributed tensors against one device (findings of the 2026-11-27
review): writes into Partial tensors and their views, views of gathered copies (NOTE [views of
gathered copies] in dtensor/dispatch.cc), and the row-sharded embedding's index check. Each case
returned other values than one device's, silently, before its fix."""

import pytest
import torch
import torch.nn.functional as F

import dtensor
from dtensor import DeviceMesh, DTensor, Partial, Replicate, Shard, distribute_tensor
from dtensor.debug import CommDebugMode


def _on_two(fn):
    return dtensor.run_threads(2, lambda rank: fn(DeviceMesh("cpu", [0, 1])))


@pytest.mark.parametrize("op", ["sum", "avg", "max", "min"])
def test_writes_into_views_of_a_partial_tensor_reach_it(op):
    """p[1:3] = 5 on a Partial p: the write lands as the value's shares in p's own pieces (it
    was lost: p became... unchanged); views of a Partial tensor written in place see the write."""
    def fn(mesh):
        rank = mesh.get_rank()
        p = DTensor.from_local(torch.full((4,), 1.0 + rank), mesh, [Partial(op)])
        want = p.full_tensor().clone()
        p[1:3] = 5.0
        want[1:3] = 5.0
        torch.testing.assert_close(p.full_tensor(), want)
        assert p.placements == (Partial(op),)
        q = DTensor.from_local(torch.full((2, 2), 1.0 + rank), mesh, [Partial(op)])
        t, a = q.t(), q.view_as(q)
        q.fill_(distribute_tensor(torch.tensor(3.0), mesh, [Replicate()]))
        torch.testing.assert_close(t.full_tensor(), torch.full((2, 2), 3.0))
        torch.testing.assert_close(a.full_tensor(), torch.full((2, 2), 3.0))
        return True

    assert all(_on_two(fn))


def test_a_write_through_a_view_of_a_gathered_view_raises():
    """x.view(-1)[0].fill_ on a Shard(0) x whose view needed a gather: refused like a write into
    the gathered view itself (it was silently lost)."""
    def fn(mesh):
        t = distribute_tensor(torch.arange(21.0).reshape(3, 7), mesh, [Shard(0)])
        for write in [lambda: t.view(-1)[0].fill_(100.0), lambda: t.reshape(-1)[1:].add_(1),
                      lambda: t.view(-1)[::3].zero_()]:
            with pytest.raises(RuntimeError, match="view of a gathered copy"):
                write()
        torch.testing.assert_close(t.full_tensor(), torch.arange(21.0).reshape(3, 7))
        return True

    assert all(_on_two(fn))


def test_reading_a_gathered_view_after_its_base_was_written_raises():
    """v = x[1:3] across the pieces of a Shard(0) x is a gathered copy; after x.add_ it would
    still hold the old values (one device's view shows the write): reading it raises. A view
    taken after the write, or one that needed no gather, reads the new values."""
    def fn(mesh):
        x = distribute_tensor(torch.arange(4.0), mesh, [Shard(0)])
        v = x[1:3]
        same = x.view(2, 2)  # Shard(0) still: no gather, a true view
        assert same.placements == (Shard(0),)
        x.add_(10)
        with pytest.raises(RuntimeError, match="written in place"):
            v.full_tensor()
        with pytest.raises(RuntimeError, match="written in place"):
            v + 1
        torch.testing.assert_close(x[1:3].full_tensor(), torch.tensor([11.0, 12.0]))
        torch.testing.assert_close(same.full_tensor(), torch.tensor([[10.0, 11.0], [12.0, 13.0]]))
        d = distribute_tensor(torch.arange(9.0).reshape(3, 3), mesh, [Shard(0)])
        g = d.diagonal()
        torch.testing.assert_close(g.full_tensor(), torch.tensor([0.0, 4.0, 8.0]))
        d.zero_()
        with pytest.raises(RuntimeError, match="written in place"):
            g.full_tensor()
        return True

    assert all(_on_two(fn))


def test_row_sharded_embedding_refuses_an_out_of_range_index():
    """An index outside the table gave a zero row with a row-sharded weight (one device raises)."""
    w = torch.randn(7, 5)

    def fn(mesh):
        dw = distribute_tensor(w, mesh, [Shard(0)])
        ok = distribute_tensor(torch.tensor([0, 6, 3]), mesh, [Replicate()])
        torch.testing.assert_close(F.embedding(ok, dw).full_tensor(), w[torch.tensor([0, 6, 3])])
        for bad in [7, -1, 100]:
            idx = distribute_tensor(torch.tensor([0, bad]), mesh, [Replicate()])
            with pytest.raises(RuntimeError, match="index out of range"):
                F.embedding(idx, dw).full_tensor()
        return True

    assert all(_on_two(fn))


@pytest.mark.parametrize("op", ["sort", "cummax"])
def test_several_out_arguments_of_another_layout_raise(op):
    """torch.sort(x, out=(values, indices)) with an out= tensor of another layout than the
    result crashed the process (a corrupted heap); it raises naming the argument (NOTE [resized
    out= arguments]). Out= tensors of the result's layout work."""
    x = torch.tensor([3.0, 1.0, 4.0, 1.0])
    call = {"sort": lambda s, out: torch.sort(s, 0, out=out),
            "cummax": lambda s, out: torch.cummax(s, 0, out=out)}[op]

    def fn(mesh):
        src = distribute_tensor(x, mesh, [Replicate()])
        bad = distribute_tensor(torch.zeros(4), mesh, [Shard(0)])
        idx = distribute_tensor(torch.zeros(4, dtype=torch.long), mesh, [Replicate()])
        with pytest.raises(RuntimeError, match="several out= arguments"):
            call(src, (bad, idx))
        good = distribute_tensor(torch.zeros(4), mesh, [Replicate()])
        call(src, (good, idx))
        want = call(x, (torch.zeros(4), torch.zeros(4, dtype=torch.long)))
        torch.testing.assert_close(good.full_tensor(), want[0])
        torch.testing.assert_close(idx.full_tensor(), want[1])
        return True

    assert all(_on_two(fn))


@pytest.mark.parametrize("op", ["sum", "avg", "max", "min"])
def test_in_place_ops_on_a_partial_tensor(op):
    """In-place ops whose rule cannot keep a Partial self (masked_fill_, fill_, clamp_, copy_ from
    a Replicate or a Partial source) run as their out-of-place op and copy the result into self
    by partition (NOTE [in-place by copy]): one device's values, self stays Partial. They raised
    "no sharding keeps self's placements" before; so did the backward of vector_norm on a Partial
    tensor (it masks a Partial gradient in place)."""
    def fn(mesh):
        rank = mesh.get_rank()

        def partial():
            return DTensor.from_local(torch.tensor([1.0, -2.0, 3.0, -4.0]) * (rank + 1), mesh,
                                      [Partial(op)])
        plain_mask = torch.tensor([True, False, True, False])
        mask = distribute_tensor(plain_mask, mesh, [Replicate()])
        cases = {  # (the op on the distributed tensor, the op on one device)
            "masked_fill_": (lambda t: t.masked_fill_(mask, 0.5),
                             lambda t: t.masked_fill_(plain_mask, 0.5)),
            "fill_": (lambda t: t.fill_(2.5),) * 2,
            "clamp_": (lambda t: t.clamp_(min=0),) * 2,
            "copy_ from Replicate": (
                lambda t: t.copy_(distribute_tensor(torch.arange(4.0), mesh, [Replicate()])),
                lambda t: t.copy_(torch.arange(4.0))),
            "copy_ from Partial": (lambda t: t.copy_(partial() * 2),
                                   lambda t: t.copy_(partial().full_tensor() * 2)),
        }
        for name, (f, one_device) in cases.items():
            p = partial()
            want = one_device(p.full_tensor().clone())
            with CommDebugMode() as comm:
                assert f(p) is p, name
            assert p.placements == (Partial(op),), (name, p.placements)
            torch.testing.assert_close(p.full_tensor(), want, msg=name)
            if name == "fill_":  # reads no value: nothing to reduce (PyTorch: none either)
                assert comm.get_total_counts() == 0, comm.get_comm_counts()
        if op == "sum":
            local = torch.tensor([1.0, -2.0, 3.0, -4.0]) * (rank + 1)
            p = DTensor.from_local(local.requires_grad_(), mesh, [Partial()])
            torch.linalg.vector_norm(p).full_tensor().backward()
            one = (torch.tensor([1.0, -2.0, 3.0, -4.0]) * 3).requires_grad_()
            torch.linalg.vector_norm(one).backward()
            torch.testing.assert_close(local.grad, one.grad)  # each share's gradient is the sum's
        return True

    assert all(_on_two(fn))
