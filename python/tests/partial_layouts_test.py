"""Partial layouts as PyTorch's DTensor gives them: redistribute's backward lays a gradient out
as its input is (a Partial -> Partial gradient stays Partial; a redistribute into the tensor's
own layout still reduces a Partial gradient of a Replicate input), and an op that must reduce a
Partial input gives Replicate. Ranks are threads; values are compared with one device and
collectives counted with CommDebugMode."""

import torch

import dtensor
from dtensor import DTensor, Replicate, distribute_tensor, init_device_mesh


def test_redistribute_backward_lays_gradients_out_as_pytorch():
    """Redistribute's backward lays the gradient out as its input is, as PyTorch's: a Partial
    gradient of a Partial -> Partial redistribute stays Partial with no collective (it was
    all-reduced), and a redistribute into the tensor's own layout still has that backward (a
    Partial gradient from to_local(grad_placements=[Partial()]) of a Replicate tensor is
    all-reduced once there; before, nothing moved and the leaf's gradient stayed Partial)."""
    from dtensor import Partial
    from dtensor.debug import CommDebugMode

    def fn(rank):
        mesh = init_device_mesh("cpu", (4,))
        p = distribute_tensor(torch.ones(12, 3, requires_grad=True), mesh, [Partial()])
        with CommDebugMode() as forward:
            q = p.redistribute(mesh, [Partial()])
        grad = DTensor.from_local(torch.ones(12, 3), mesh, [Partial()])
        with CommDebugMode() as backward:
            q.backward(grad)
        assert forward.get_total_counts() == 0 and backward.get_total_counts() == 0
        assert p.grad.placements == (Partial(),) and torch.equal(p.grad.to_local(),
                                                                 torch.ones(12, 3))
        torch.testing.assert_close(p.grad.full_tensor(), torch.full((12, 3), 4.0))

        torch.manual_seed(0)
        r = distribute_tensor(torch.randn(12, 3, requires_grad=True), mesh, [Replicate()])
        with CommDebugMode() as comm:
            out = r.redistribute(placements=[Replicate()]).to_local(grad_placements=[Partial()])
            out.backward(torch.ones_like(out))
        assert comm.get_comm_counts() == {"all_reduce": 1}, comm.get_comm_counts()
        assert r.grad.placements == (Replicate(),)
        torch.testing.assert_close(r.grad.to_local(), torch.full((12, 3), 4.0))
        return True

    assert all(dtensor.run_threads(4, fn))


def test_an_op_that_reduces_a_partial_gives_replicate_as_pytorch():
    """A pointwise op that cannot keep a Partial input reduces it to Replicate (one all_reduce),
    as PyTorch's rules do, so to_local() is the whole result there too; before, the engine
    reduce_scattered it to Shard(0) (less traffic at the op, but a layout PyTorch's code does not
    expect, and an all_gather more for a consumer that needs it whole)."""
    from dtensor import Partial
    from dtensor.debug import CommDebugMode

    def fn(rank):
        mesh = init_device_mesh("cpu", (4,))
        shares = [torch.full((8, 8), float(r + 1)) for r in range(4)]
        d = DTensor.from_local(shares[rank], mesh, [Partial("max")])
        ones = distribute_tensor(torch.ones(8, 8), mesh, [Replicate()])
        with CommDebugMode() as comm:
            z = d * ones
            e = torch.exp(DTensor.from_local(shares[rank], mesh, [Partial()]))
        assert z.placements == (Replicate(),) and e.placements == (Replicate(),)
        assert comm.get_comm_counts() == {"all_reduce": 2}, comm.get_comm_counts()
        torch.testing.assert_close(z.to_local(), torch.full((8, 8), 4.0))
        torch.testing.assert_close(e.to_local(), torch.exp(torch.full((8, 8), 10.0)))
        return True

    assert all(dtensor.run_threads(4, fn))
