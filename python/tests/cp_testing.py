"""Shared by the context-parallelism tests (context_parallel_test.py,
context_parallel_compose_test.py): the tolerance, one device's SDPA with its gradients, and a
fixture that restores the global context-parallel options after each test."""

import pytest
import torch.nn.functional as F

from dtensor.experimental._attention import _cp_options

TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(autouse=True)
def restore_cp_options():
    saved = (_cp_options.enable_load_balance, _cp_options.rotate_method)
    yield
    _cp_options.enable_load_balance, _cp_options.rotate_method = saved


def reference(q, k, v, dout, **kw):
    """One device's SDPA of q, k, v (kwargs as SDPA's) and its q/k/v gradients for ``dout``."""
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, **kw)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad
