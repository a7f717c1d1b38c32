"""scaled_dot_product_attention on distributed tensors through the engine (not context
parallelism: the engine's own rule and paths), against one device: output and q/k/v gradients
for every placement of one mesh dim, on the paths that are composites of other ops (NOTE [SDPA's
math path]): a value head size unlike the query's (no fused kernel takes it), a float mask, a
causal mask, and dropout, whose values equal one device's for the same seed."""

import pytest
import torch
import torch.nn.functional as F

import dtensor
import dtensor.random
from dtensor import Replicate, Shard

B, H, L, S, E, EV = 2, 4, 6, 6, 8, 10
SEED = 5


def _inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, n, e, generator=g) for n, e in ((L, E), (S, E), (S, EV))]


CASES = {
    "causal": lambda: dict(is_causal=True),
    "float_mask": lambda: dict(attn_mask=torch.randn(L, S, generator=torch.Generator()
                                                     .manual_seed(1))),
    "bool_mask": lambda: dict(attn_mask=torch.rand(L, S, generator=torch.Generator()
                                                   .manual_seed(2)) > 0.3),
    "dropout": lambda: dict(dropout_p=0.3),
}

# (q's placement, k's and v's): batch, heads, query rows (k/v whole), replicated.
PLACEMENTS = {"batch": (Shard(0), Shard(0)), "heads": (Shard(1), Shard(1)),
              "query_rows": (Shard(2), Replicate()), "replicate": (Replicate(), Replicate())}


def _one_device(kw):
    q, k, v = (t.requires_grad_() for t in _inputs())
    torch.manual_seed(SEED)
    out = F.scaled_dot_product_attention(q, k, v, **kw)
    out.backward(torch.ones_like(out))
    return out.detach(), [t.grad for t in (q, k, v)]


@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("case", list(CASES))
def test_composite_paths_equal_one_device(case, placement):
    kw = CASES[case]()
    want, want_grads = _one_device(kw)
    q_pl, kv_pl = PLACEMENTS[placement]

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        q, k, v = (dtensor.distribute_tensor(t, mesh, [pl]).requires_grad_()
                   for t, pl in zip(_inputs(), (q_pl, kv_pl, kv_pl)))
        dtensor.random.manual_seed(SEED, mesh)  # one device's draw (dropout)
        out = F.scaled_dot_product_attention(q, k, v, **kw)
        out.backward(torch.ones_like(out))
        return out.full_tensor(), [t.grad.full_tensor() for t in (q, k, v)]

    for out, grads in dtensor.run_threads(2, rank_fn):
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
        for name, g, w in zip("qkv", grads, want_grads):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=lambda m: f"d{name}: {m}")
