"""scaled_dot_product_attention on distributed tensors through the engine (its own rules and
paths, no context_parallel), against one device: output and q/k/v gradients for every placement
of one mesh dim, on the paths that are composites of other ops (NOTE [SDPA's math path]): a value
head size unlike the query's (no fused kernel takes it), a float mask, a causal mask, and dropout,
whose values equal one device's for the same seed; the fused CPU kernel's rule; and q/k/v sharded
along the sequence, which the engine runs as ring attention (NOTE [ring attention in the
engine])."""

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


@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kv_heads", [H, H // 2])
def test_fused_cpu_kernel_runs_on_pieces(placement, causal, kv_heads):
    """The fused CPU kernel's path (q, k, v of one head size) has its own rule: batch and heads
    (q and k/v heads alike) shard, the query rows too when not causal; forward and backward
    communicate nothing for those layouts, and output and gradients equal one device's."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(B, H, L, E, generator=g)
    k, v = (torch.randn(B, kv_heads, S, E, generator=g) for _ in range(2))
    kw = dict(is_causal=causal, enable_gqa=kv_heads != H)
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    want = F.scaled_dot_product_attention(qq, kk, vv, **kw)
    want.backward(torch.ones_like(want))
    q_pl, kv_pl = PLACEMENTS[placement]
    local = (placement == "batch" or (placement == "heads" and kv_heads == H)
             or (placement == "query_rows" and not causal))

    def rank_fn(rank):
        from dtensor.debug import CommDebugMode
        mesh = dtensor.init_device_mesh("cpu", (2,))
        qd, kd, vd = (dtensor.distribute_tensor(t, mesh, [pl]).requires_grad_()
                      for t, pl in zip((q, k, v), (q_pl, kv_pl, kv_pl)))
        with CommDebugMode() as comms:
            out = F.scaled_dot_product_attention(qd, kd, vd, **kw)
            out.backward(torch.ones_like(out))
        return (out.full_tensor(), [t.grad.full_tensor() for t in (qd, kd, vd)],
                comms.get_total_counts(), out.placements)

    for out, grads, count, placements in dtensor.run_threads(2, rank_fn):
        torch.testing.assert_close(out, want.detach(), rtol=1e-5, atol=1e-5)
        for name, got, t in zip("qkv", grads, (qq, kk, vv)):
            torch.testing.assert_close(got, t.grad, rtol=1e-5, atol=1e-5,
                                       msg=lambda m: f"d{name}: {m}")
        if local:
            # dk/dv of row pieces are Partial sums: their reduction is the only collective.
            assert count == (2 if placement == "query_rows" else 0), count
            assert placements == (q_pl,), placements


@pytest.mark.parametrize("method", ["allgather", "alltoall"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mesh_shape,placements", [((3,), [Shard(2)]),
                                                   ((2, 2), [Shard(1), Shard(2)])])
def test_sequence_sharded_runs_ring_attention(method, causal, mesh_shape, placements):
    """q, k, v sharded along the sequence, outside context_parallel and with no Python
    dispatcher: the engine itself runs ring attention (NOTE [ring attention in the engine]).
    Output and gradients equal one device's and keep the inputs' placements; the query is never
    gathered: the only collectives are the ring's (one all_gather forward, an all_gather and a
    reduce_scatter backward; or W-1 rotations forward and 2W-1 backward)."""
    from dtensor.experimental import set_rotate_method
    from dtensor.experimental._attention import _cp_options
    g = torch.Generator().manual_seed(7)
    q, k, v, dout = (torch.randn(B, H, 11, E, generator=g) for _ in range(4))
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    want = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
    want.backward(dout)
    world = 1
    for size in mesh_shape:
        world *= size
    w = mesh_shape[-1] if len(mesh_shape) == 1 else mesh_shape[1]
    saved = _cp_options.rotate_method
    set_rotate_method(method)

    def rank_fn(rank):
        from dtensor.debug import CommDebugMode
        mesh = dtensor.init_device_mesh("cpu", mesh_shape)
        qd, kd, vd = (dtensor.distribute_tensor(t, mesh, placements).requires_grad_()
                      for t in (q, k, v))
        with CommDebugMode() as fwd:
            out = F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal)
        grad = dtensor.distribute_tensor(dout, mesh, placements)
        with CommDebugMode() as bwd:
            out.backward(grad)
        return (out.full_tensor(), [t.grad.full_tensor() for t in (qd, kd, vd)],
                [out.placements, kd.grad.placements], fwd.get_comm_counts(),
                bwd.get_comm_counts())

    try:
        results = dtensor.run_threads(world, rank_fn)
    finally:
        _cp_options.rotate_method = saved
    for out, grads, layouts, fwd, bwd in results:
        torch.testing.assert_close(out, want.detach(), rtol=1e-5, atol=1e-5)
        for name, got, t in zip("qkv", grads, (qq, kk, vv)):
            torch.testing.assert_close(got, t.grad, rtol=1e-5, atol=1e-5,
                                       msg=lambda m: f"d{name}: {m}")
        assert layouts == [tuple(placements)] * 2, layouts
        fwd, bwd = ({str(k).split(".")[-1]: n for k, n in c.items()} for c in (fwd, bwd))
        if method == "allgather":
            assert fwd == {"all_gather_into_tensor": 1}, fwd
            assert bwd == {"all_gather_into_tensor": 1, "reduce_scatter_tensor": 1}, bwd
        else:
            assert fwd == {"all_to_all_single": w - 1}, fwd
            assert bwd == {"all_to_all_single": 2 * w - 1}, bwd
