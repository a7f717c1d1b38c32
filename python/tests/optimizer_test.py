"""Optimizers, gradient clipping and GradScaler over a model a TP plan parallelizes in part:
distributed parameters beside plain ones (the LayerNorm the plan leaves alone) on the foreach
paths, which are PyTorch's defaults on CUDA (NOTE [foreach ops per element], NOTE [replicated
scalars with plain tensors], NOTE [amp unscale] in dtensor/dispatch_fallback.cc). Each against one
device, ranks as threads."""

import copy

import pytest
import torch
from torch import nn

import dtensor
from dtensor import DTensor
from dtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


@pytest.mark.parametrize("optim", ["sgd", "adamw"])
def test_foreach_optimizer_with_plain_and_distributed_parameters(optim):
    """NOTE [foreach ops per element]: an optimizer with foreach=True (the default on CUDA) over a
    model a TP plan parallelizes in part (the LayerNorm's parameters stay plain tensors) trains as
    one device, and each parameter is updated on its own layout (no _foreach_* op runs by the
    replicate fallback, which would gather every sharded parameter). Guards against SGD raising
    "aten::_foreach_add_.List: argument 'self' is a plain tensor [16] mixed with distributed
    tensors"."""
    make = {"sgd": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9, foreach=True),
            "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True)}[optim]
    torch.manual_seed(0)
    ref = nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
    x0 = torch.randn(4, 8, 16)

    def train(model, x):
        opt = make(model.parameters())
        for _ in range(3):
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
        return model

    want = train(copy.deepcopy(ref), x0)
    dtensor.debug.reset_fallback_counts()

    def fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        model = parallelize_module(copy.deepcopy(ref), mesh,
                                   {"1": ColwiseParallel(), "3": RowwiseParallel()})
        assert not isinstance(model[0].weight, DTensor)
        train(model, x0)
        return [p.full_tensor() if isinstance(p, DTensor) else p.detach() for p in model.parameters()]

    for got in dtensor.run_threads(2, fn):
        for g, w in zip(got, want.parameters()):
            torch.testing.assert_close(g, w.detach(), atol=1e-5, rtol=1e-5)
    assert not [op for op in dtensor.debug.fallback_counts() if "_foreach_" in op]


def test_clip_grad_norm_foreach_with_plain_and_distributed_gradients():
    """NOTE [replicated scalars with plain tensors]: clip_grad_norm_(foreach=True) (the default on
    CUDA) over a model a TP plan parallelizes in part: the total norm and every clipped gradient
    equal one device's. Guards against _foreach_mul_ raising ("aten::mul_.Tensor: argument 'self'
    is a plain tensor [16] mixed with distributed tensors": a plain gradient times the replicated
    clip coefficient)."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
    x0 = torch.randn(4, 8, 16)
    want = copy.deepcopy(ref)
    want(x0).pow(2).mean().backward()
    want_norm = torch.nn.utils.clip_grad_norm_(want.parameters(), 0.1, foreach=True)

    def fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        model = parallelize_module(copy.deepcopy(ref), mesh,
                                   {"1": ColwiseParallel(), "3": RowwiseParallel()})
        model(x0).pow(2).mean().backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1, foreach=True)
        full = lambda t: t.full_tensor() if isinstance(t, DTensor) else t  # noqa: E731
        return full(norm), [full(p.grad) for p in model.parameters()]

    for norm, grads in dtensor.run_threads(2, fn):
        torch.testing.assert_close(norm, want_norm)
        for g, w in zip(grads, want.parameters()):
            torch.testing.assert_close(g, w.grad, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("norm_type", [2.0, 3.0, float("inf")])
@pytest.mark.parametrize("foreach", [True, False])
def test_clip_grad_norm_of_sharded_gradients_reduces_once(norm_type, foreach):
    """NOTE [p-norm Partial] (layout/placement.h): each gradient's norm stays a Partial of its
    order (for inf: max) and so does the norm of the norms, so clip_grad_norm_ of sharded
    gradients issues one all_reduce (PyTorch's count), where it once gathered every gradient. The
    total norm and the clipped gradients equal one device's; uneven shards for the p-norms (a max
    over an empty piece is undefined, so inf gets even ones)."""
    from dtensor.debug import CommDebugMode

    torch.manual_seed(0)
    rows = (12, 9, 7) if norm_type != float("inf") else (12, 8, 4)
    grads = [torch.randn(rows[0], 5), torch.randn(rows[1], 3), torch.randn(rows[2])]

    def clip(params):
        return torch.nn.utils.clip_grad_norm_(params, 0.5, norm_type=norm_type, foreach=foreach)

    want = [nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(want, grads):
        p.grad = g.clone()
    want_norm = clip(want)

    def fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (4,))
        params = []
        for g in grads:
            p = nn.Parameter(dtensor.distribute_tensor(torch.zeros_like(g), mesh, [dtensor.Shard(0)]))
            p.grad = dtensor.distribute_tensor(g, mesh, [dtensor.Shard(0)])
            params.append(p)
        with CommDebugMode() as mode:
            norm = clip(params)
        return mode.get_comm_counts(), norm.full_tensor(), [p.grad.full_tensor() for p in params]

    for counts, norm, got in dtensor.run_threads(4, fn):
        assert counts[torch.ops.c10d_functional.all_reduce] == 1, dict(counts)
        assert sum(counts.values()) == 1, dict(counts)
        torch.testing.assert_close(norm, want_norm)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w.grad)


@pytest.mark.parametrize("inf_on", [None, "sharded", "plain"])
def test_grad_scaler_unscales_pieces_and_agrees_on_found_inf(inf_on):
    """NOTE [amp unscale]: torch.amp.GradScaler over a model a TP plan parallelizes in part
    (sharded, Partial-free and plain gradients): 3 steps of scale, unscale_, clip and step equal
    one device's, with no replicate fallback (which gathered every gradient each step). A
    non-finite value in one element of the weight that rank 1 holds (or in a plain gradient)
    makes every rank skip the step and lower the scale, as one device does."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.LayerNorm(16), nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
    x0 = torch.randn(4, 8, 16)

    def train(model, full):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
        for step in range(3):
            opt.zero_grad()
            scaler.scale(model(x0).pow(2).mean()).backward()
            if step == 1 and inf_on is not None:
                grad = model[1].weight.grad if inf_on == "sharded" else model[0].weight.grad
                with torch.no_grad():  # row 20 of the (32, 16) weight: rank 1's piece on 2 ranks
                    if isinstance(grad, DTensor):
                        local = grad.to_local()
                        if grad.device_mesh.get_rank() == 1:
                            local[20 - 16, 3] = float("inf")
                    elif inf_on == "sharded":
                        grad[20, 3] = float("inf")
                    else:  # the LayerNorm's weight, plain everywhere
                        grad[3] = float("inf")
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            scaler.step(opt)
            scaler.update()
        return [full(p) for p in model.parameters()], scaler.get_scale()

    plain = lambda t: t.detach()  # noqa: E731
    want, want_scale = train(copy.deepcopy(ref), plain)
    assert (want_scale < 2.0 ** 10) == (inf_on is not None)
    dtensor.debug.reset_fallback_counts()

    def fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        model = parallelize_module(copy.deepcopy(ref), mesh,
                                   {"1": ColwiseParallel(), "3": RowwiseParallel()})
        return train(model, lambda t: t.full_tensor() if isinstance(t, DTensor) else t.detach())

    for got, scale in dtensor.run_threads(2, fn):
        assert scale == want_scale
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    assert not [op for op in dtensor.debug.fallback_counts() if "_amp_" in op]
