"""local_map and implicit_replication (torch.distributed.tensor.experimental, PyTorch's
names): a function on this rank's pieces wrapped with output placements, its checks and
redistribute_inputs, the decorator form with in_grad_placements; plain tensors read as
replicated. Ranks are threads; results are compared with one device."""

import pytest
import torch

import dtensor
from dtensor import DTensor, Replicate, Shard, distribute_tensor, init_device_mesh


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


def test_local_map_as_a_decorator_with_in_grad_placements():
    """PyTorch's forms: ``@local_map(out_placements=...)`` with func omitted, and
    ``in_grad_placements`` (4th positional, before device_mesh) giving each distributed
    argument's gradient placements. A Replicate weight used by every rank's rows gets a
    per-rank partial gradient: in_grad_placements=Partial() makes its sum the gradient, equal to
    one device's."""
    from dtensor import Partial
    from dtensor.experimental import local_map
    torch.manual_seed(0)
    x, w = torch.randn(8, 6), torch.randn(6)

    @local_map(out_placements=[Shard(0)], in_placements=((Shard(0),), (Replicate(),)),
               in_grad_placements=((Shard(0),), (Partial(),)))
    def scale(xl, wl):
        return xl * wl

    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        dx = distribute_tensor(x, mesh, [Shard(0)])
        dw = distribute_tensor(w.clone().requires_grad_(), mesh, [Replicate()])
        y = scale(dx, dw)
        assert isinstance(y, DTensor) and y.placements == (Shard(0),)
        torch.testing.assert_close(y.full_tensor(), x * w)
        y.sum().backward()
        assert dw.grad.placements == (Partial(),), dw.grad.placements
        torch.testing.assert_close(dw.grad.full_tensor(), x.sum(0))
        return True

    assert all(dtensor.run_threads(2, fn))


def test_local_map_without_out_placements_and_its_redistribute_message():
    """out_placements=None returns func's outputs as they are (a Python bool here), as PyTorch's
    (it raised TypeError); a distributed argument in other placements raises ValueError in
    PyTorch's words ("set redistribute_inputs=True")."""
    from dtensor.experimental import local_map
    x = torch.arange(8.0).reshape(4, 2)

    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        dx = distribute_tensor(x, mesh, [Shard(0)])
        same = local_map(lambda a, b: bool(torch.equal(a, b)), out_placements=None)
        assert same(dx, dx) is True
        f = local_map(lambda a: a * 2, out_placements=[Shard(0)], in_placements=([Shard(1)],))
        with pytest.raises(ValueError, match="set redistribute_inputs=True"):
            f(dx)
        return True

    assert all(dtensor.run_threads(2, fn))
