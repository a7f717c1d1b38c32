"""NOTE [unboxed fast path]: the hot ops' unboxed kernels against the boxed kernel and one
device, on every placement of a 2-rank mesh (ranks as threads)."""

import pytest
import torch

import dtensor
from dtensor import Partial, Replicate, Shard, distribute_tensor, init_device_mesh


@pytest.mark.parametrize("placement", [Shard(0), Shard(1), Replicate(), Partial()])
def test_hot_ops_fast_path_equals_the_boxed_kernel(placement):
    """NOTE [unboxed fast path]: the hot ops' unboxed kernels give what the boxed kernel gives
    (taken here under the FLOP counter, which the fast path leaves to it): placements, values bit
    for bit, strides, the pieces' strides, and whether the result is a view; and one device's
    values."""
    from dtensor.debug import FlopCounterMode
    F = torch.nn.functional
    torch.manual_seed(0)
    x, y, w = torch.randn(4, 6), torch.randn(4, 6), torch.randn(6, 6)
    bx, by = torch.randn(4, 6, 3), torch.randn(4, 3, 5)
    ops = {
        "add": lambda a, b, m: torch.add(a, b, alpha=2), "sub": lambda a, b, m: a - b,
        "mul": lambda a, b, m: a * b, "div": lambda a, b, m: a / (b.abs() + 1),
        "mm": lambda a, b, m: torch.mm(a, m), "sum": lambda a, b, m: a.sum(),
        "sum_dim": lambda a, b, m: a.sum(1, keepdim=True), "mean": lambda a, b, m: a.mean(0),
        "relu": lambda a, b, m: torch.relu(a), "gelu": lambda a, b, m: F.gelu(a, approximate="tanh"),
        "silu": lambda a, b, m: F.silu(a), "sigmoid": lambda a, b, m: torch.sigmoid(a),
        "tanh": lambda a, b, m: torch.tanh(a), "exp": lambda a, b, m: torch.exp(a),
        "neg": lambda a, b, m: -a, "view": lambda a, b, m: a.view(2, 2, 6),
        "view_flat": lambda a, b, m: a.view(24), "t": lambda a, b, m: a.t(),
        "transpose": lambda a, b, m: a.transpose(0, 1), "permute": lambda a, b, m: a.permute(1, 0),
        "unsqueeze": lambda a, b, m: a.unsqueeze(1),
        "add_scalar": lambda a, b, m: a + 1, "mul_scalar": lambda a, b, m: a * 0.5,
        "div_scalar_tensor": lambda a, b, m: a / torch.tensor(4.0),
    }

    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        a, b = (distribute_tensor(t, mesh, [placement]) for t in (x, y))
        m = distribute_tensor(w, mesh, [Replicate()])
        cases = [(name, f, (a, b, m), (x, y, w)) for name, f in ops.items()]
        ba, bb = (distribute_tensor(t, mesh, [placement]) for t in (bx, by))
        cases.append(("bmm", lambda p, q, _: torch.bmm(p, q), (ba, bb, m), (bx, by, w)))
        for name, f, dargs, plain in cases:
            fast = f(*dargs)
            with FlopCounterMode(display=False):
                boxed = f(*dargs)
            assert fast.placements == boxed.placements, name
            assert fast.stride() == boxed.stride(), name
            assert fast.to_local().stride() == boxed.to_local().stride(), name
            assert fast._is_view() == boxed._is_view(), name
            torch.testing.assert_close(fast.full_tensor(), boxed.full_tensor(), rtol=0, atol=0)
            torch.testing.assert_close(fast.full_tensor(), f(*plain), msg=name)
        return True

    assert all(dtensor.run_threads(2, fn))
