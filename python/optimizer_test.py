"""Optimizers and gradient clipping over a model a TP plan parallelizes in part: distributed
parameters beside plain ones (the LayerNorm the plan leaves alone) on the foreach paths, which are
PyTorch's defaults on CUDA (NOTE [foreach ops per element], NOTE [replicated scalars with plain
tensors] in dtensor/dispatch.cc). Each against one device, ranks as threads."""

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
    replicate fallback, which gathered every sharded parameter). Before, SGD raised
    "aten::_foreach_add_.List: argument 'self' is a plain tensor [16] mixed with distributed
    tensors" (the GPU check's cuda_test on an H100)."""
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
    equal one device's. Before, it raised at _foreach_mul_ ("aten::mul_.Tensor: argument 'self' is
    a plain tensor [16] mixed with distributed tensors": a plain gradient times the replicated
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
