"""Context parallelism composed with tensor parallelism and FSDP (NOTE [ring attention on an n-D
mesh] in dtensor/experimental/_context_parallel.py), each against one process's SDPA or training
(fp32, 1e-5), output and every gradient:

* distributed q/k/v on 2-D meshes, the sequence on one mesh dim and heads, batch rows or nothing
  on the other, through the dispatcher and inside ``context_parallel(mesh["cp"])``; layouts ring
  attention does not take are refused inside the block and computed by the engine outside it;
* CP x TP: an attention block ``parallelize_module``'d on "tp" (TP's local heads, plain pieces)
  inside ``context_parallel(mesh["cp"])`` on a 2x2 mesh, and its collectives per forward and
  backward (CommDebugMode);
* CP x FSDP: ``fully_shard`` over the flattened dp x cp ranks (torchtitan's dp_shard x cp), two
  AdamW steps on a (dp, cp) mesh;
* dp x cp x tp on 8 processes, FSDP over dp x cp and TP on "tp";
* torch.compile of a module calling SDPA inside ``context_parallel`` (NOTE [context parallel
  under torch.compile]): equal to eager and to one process, one graph break at SDPA.

Ranks are threads, except the 8-rank run and torch.compile (processes: Dynamo does not compile
on two threads of one process at once)."""

import contextlib
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import dtensor
from dtensor import DTensor, Replicate, Shard, distribute_tensor
from dtensor import _functional_collectives as fc
from dtensor.debug import CommDebugMode
from dtensor.experimental import context_parallel, context_parallel_unshard, set_rotate_method
from dtensor.experimental._attention import _cp_options
from dtensor.experimental._context_parallel import (_disable_context_parallel_dispatcher,
                                                    _enable_context_parallel_dispatcher)
from dtensor.fsdp import FSDPModule, fully_shard
from dtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from cp_testing import TOL, reference, restore_cp_options  # noqa: F401
from launch_ranks import run_on_ranks



def _qkv(seq, heads=4, kv_heads=None, batch=2, dim=8, v_dim=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, seq, dim, generator=g)
    k = torch.randn(batch, kv_heads or heads, seq, dim, generator=g)
    v = torch.randn(batch, kv_heads or heads, seq, v_dim, generator=g)
    dout = torch.randn(batch, heads, seq, v_dim, generator=g)
    return q, k, v, dout


def _check(got, ref, names):
    for g, r, name in zip(got, ref, names):
        torch.testing.assert_close(g, r, **TOL, msg=lambda m, name=name: f"{name}: {m}")


# ---- distributed q/k/v on a 2-D mesh ------------------------------------------------------------

# (mesh dim names, placements of q, k and v, kv heads): the sequence (dim 2) on "cp", and heads
# (dim 1), batch rows (dim 0) or nothing on the other dim, in either mesh dim order.
_LAYOUTS = {
    "heads on tp": (("cp", "tp"), [Shard(2), Shard(1)], None),
    "tp outer": (("tp", "cp"), [Shard(1), Shard(2)], None),
    "GQA heads on tp": (("cp", "tp"), [Shard(2), Shard(1)], 2),
    "batch on dp": (("dp", "cp"), [Shard(0), Shard(2)], None),
    "replicated on dp": (("dp", "cp"), [Replicate(), Shard(2)], None),
}


@pytest.mark.parametrize("layout", list(_LAYOUTS))
@pytest.mark.parametrize("method", ["allgather", "alltoall"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seq", [12, 11])
def test_distributed_qkv_on_2d_mesh(layout, method, causal, seq):
    """SDPA on distributed q/k/v, inside context_parallel(mesh["cp"]) and through the
    dispatcher: the output and the gradients are placed as the inputs and equal one device's;
    the forward's only collectives are the ring's, on the cp dim's group."""
    names, placements, kv_heads = _LAYOUTS[layout]
    set_rotate_method(method)
    q, k, v, dout = _qkv(seq, kv_heads=kv_heads, seed=seq)
    kw = dict(is_causal=causal, enable_gqa=kv_heads is not None)
    ref = reference(q, k, v, dout, **kw)
    ring = {"all_gather_into_tensor": 1} if method == "allgather" else {"all_to_all_single": 1}

    def rank_fn(rank, inside):
        mesh = dtensor.init_device_mesh("cpu", (2, 2), mesh_dim_names=names)
        qd, kd, vd = (distribute_tensor(t, mesh, placements).requires_grad_() for t in (q, k, v))
        block = context_parallel(mesh["cp"]) if inside else contextlib.nullcontext()
        with block, CommDebugMode() as fwd:
            out = F.scaled_dot_product_attention(qd, kd, vd, **kw)
        out.backward(distribute_tensor(dout, mesh, placements))
        for t in (out, qd.grad, kd.grad, vd.grad):
            assert list(t.placements) == placements, t.placements
        assert fwd.get_comm_counts() == ring, fwd.get_comm_counts()
        return [t.full_tensor().detach() for t in (out, qd.grad, kd.grad, vd.grad)]

    for got in dtensor.run_threads(4, lambda r: rank_fn(r, True)):
        _check(got, ref, ("out", "dq", "dk", "dv"))
    _enable_context_parallel_dispatcher()
    try:
        results = dtensor.run_threads(4, lambda r: rank_fn(r, False))
    finally:
        _disable_context_parallel_dispatcher()
    for got in results:
        _check(got, ref, ("out", "dq", "dk", "dv"))


# Layouts with the sequence sharded that ring attention does not take: (q heads, kv heads,
# placements of q, k, v, the error's words).
_REFUSED = {
    "head size on tp": (4, 4, [[Shard(2), Shard(3)]] * 3, "mesh dim 1 is placed"),
    "sequence on both dims": (4, 4, [[Shard(2), Shard(2)]] * 3, "sequence is sharded on 2"),
    "k placed apart": (4, 4, [[Shard(2), Shard(1)], [Shard(2), Replicate()],
                              [Shard(2), Shard(1)]], "placed differently"),
    "GQA heads not divisible": (6, 3, [[Shard(2), Shard(1)]] * 3, "divisible by 2"),
}


@pytest.mark.parametrize("case", list(_REFUSED))
def test_layouts_ring_attention_does_not_take(case):
    """Inside context_parallel: a ValueError naming the placements. Through the dispatcher: the
    engine's own SDPA (exact, one device's values; v's head size is q's, which the engine's
    causal SDPA with gradients needs)."""
    heads, kv_heads, placements, words = _REFUSED[case]
    q, k, v, dout = _qkv(12, heads=heads, kv_heads=kv_heads, v_dim=8)
    kw = dict(is_causal=True, enable_gqa=heads != kv_heads)
    ref = reference(q, k, v, dout, **kw)

    def rank_fn(rank, inside):
        mesh = dtensor.init_device_mesh("cpu", (2, 2), mesh_dim_names=("cp", "tp"))
        qd, kd, vd = (distribute_tensor(t, mesh, p).requires_grad_()
                      for t, p in zip((q, k, v), placements))
        if inside:
            with context_parallel(mesh["cp"]):
                with pytest.raises(ValueError, match=words):
                    F.scaled_dot_product_attention(qd, kd, vd, **kw)
            return None
        out = F.scaled_dot_product_attention(qd, kd, vd, **kw)
        out.backward(distribute_tensor(dout, mesh, [Replicate(), Replicate()]))
        return [t.full_tensor().detach() for t in (out, qd.grad, kd.grad, vd.grad)]

    dtensor.run_threads(4, lambda r: rank_fn(r, True))
    _enable_context_parallel_dispatcher()
    try:
        results = dtensor.run_threads(4, lambda r: rank_fn(r, False))
    finally:
        _disable_context_parallel_dispatcher()
    for got in results:
        _check(got, ref, ("out", "dq", "dk", "dv"))


def test_context_parallel_takes_a_1d_mesh():
    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2, 2), mesh_dim_names=("cp", "tp"))
        with pytest.raises(ValueError, match=r"must be 1-D.*mesh\['cp'\]"):
            with context_parallel(mesh):
                pass
        return True

    assert all(dtensor.run_threads(4, rank_fn))


# ---- CP x TP: parallelize_module inside context_parallel ----------------------------------------

DIM, HEADS, KV_HEADS, HEAD_DIM = 16, 4, 2, 4


class Attention(nn.Module):
    """q/k/v/o projections around causal SDPA with GQA; the head count is inferred (-1), so the
    same code runs on TP's local heads (torchtitan's way)."""

    def __init__(self):
        super().__init__()
        self.wq = nn.Linear(DIM, HEADS * HEAD_DIM, bias=False)
        self.wk = nn.Linear(DIM, KV_HEADS * HEAD_DIM, bias=False)
        self.wv = nn.Linear(DIM, KV_HEADS * HEAD_DIM, bias=False)
        self.wo = nn.Linear(HEADS * HEAD_DIM, DIM, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, HEAD_DIM).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, HEAD_DIM).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, HEAD_DIM).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    """A transformer block: norm, Attention, norm, MLP (for the training tests)."""

    def __init__(self):
        super().__init__()
        self.attention_norm = nn.LayerNorm(DIM)
        self.attention = Attention()
        self.ffn_norm = nn.LayerNorm(DIM)
        self.w1 = nn.Linear(DIM, 2 * DIM)
        self.w2 = nn.Linear(2 * DIM, DIM)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.w2(F.gelu(self.w1(self.ffn_norm(x))))


def _attention_case():
    """An Attention, its input and output gradient [2, 12, DIM], and one process's run of it
    (the reference module after backward, its input with .grad, its output)."""
    torch.manual_seed(0)
    base = Attention()
    g = torch.Generator().manual_seed(1)
    x, dout = torch.randn(2, 12, DIM, generator=g), torch.randn(2, 12, DIM, generator=g)
    ref = copy.deepcopy(base)
    xr = x.clone().requires_grad_()
    out_ref = ref(xr)
    out_ref.backward(dout)
    return base, x, dout, ref, xr, out_ref


def _tp_plan(prefix=""):
    return {f"{prefix}wq": ColwiseParallel(), f"{prefix}wk": ColwiseParallel(),
            f"{prefix}wv": ColwiseParallel(), f"{prefix}wo": RowwiseParallel()}


@pytest.mark.parametrize("method", ["allgather", "alltoall"])
@pytest.mark.parametrize("load_balance", [False, True])
def test_cp_x_tp_parallelize_module(method, load_balance):
    """Colwise q/k/v and Rowwise o on "tp" of a (cp, tp) mesh, run inside
    context_parallel(mesh["cp"]) on the input and output gradient sharded along the sequence:
    output, input gradient and every weight's gradient (summed over cp) equal one process's.
    Collectives: forward the ring's and TP's all_reduce of o's output; backward the ring's and
    TP's all_reduce of the input gradient of each Colwise projection (each prepares its own
    input, as PyTorch's ColwiseParallel: 3)."""
    set_rotate_method(method)
    _cp_options.enable_load_balance = load_balance
    base, x, dout, ref, xr, out_ref = _attention_case()

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2, 2), mesh_dim_names=("cp", "tp"))
        model = parallelize_module(copy.deepcopy(base), mesh["tp"], _tp_plan())
        bufs = [x.clone(), dout.clone()]
        with context_parallel(mesh["cp"], buffers=bufs, buffer_seq_dims=[1, 1],
                              no_restore_buffers=set(bufs)):
            xl = bufs[0].clone().requires_grad_()
            with CommDebugMode() as fwd:
                out = model(xl)
            with CommDebugMode() as bwd:
                out.backward(bufs[1])
            whole = context_parallel_unshard(mesh["cp"], [out.detach(), xl.grad], [1, 1])
        grads = {n: fc.all_reduce(p.grad.to_local(), "sum", mesh["cp"]).wait()
                 for n, p in model.named_parameters()}
        grads = {n: DTensor.from_local(gr, mesh["tp"], p.placements).full_tensor()
                 for (n, p), gr in zip(model.named_parameters(), grads.values())}
        return whole, grads, fwd.get_comm_counts(), bwd.get_comm_counts()

    # On cp=2: the alltoall ring takes W-1 = 1 rotation forward, and 2W-1 = 3 backward (the
    # k/v block sent ahead, the dk/dv accumulators one step behind, the last returned home).
    ring_fwd = ({"all_gather_into_tensor": 1} if method == "allgather"
                else {"all_to_all_single": 1})
    ring_bwd = ({"all_gather_into_tensor": 1, "reduce_scatter_tensor": 1} if method == "allgather"
                else {"all_to_all_single": 3})
    for (out, dx), grads, fwd, bwd in dtensor.run_threads(4, rank_fn):
        _check((out, dx), (out_ref.detach(), xr.grad), ("out", "dx"))
        for n, p in ref.named_parameters():
            torch.testing.assert_close(grads[n], p.grad, **TOL, msg=n)
        assert fwd == {**ring_fwd, "all_reduce": 1}, fwd
        assert bwd == {**ring_bwd, "all_reduce": 3}, bwd


@pytest.mark.parametrize("method", ["allgather", "alltoall"])
def test_cp_x_tp_with_distributed_projections(method):
    """NOTE [pieces on another mesh]: Colwise q/k/v with use_local_output=False hand SDPA
    distributed tensors on "tp" (heads sharded) whose sequence is this cp rank's piece: ring
    attention over cp runs on them (left to the engine, each rank would attend within its
    piece). Output, input gradient and weight gradients equal one process's."""
    set_rotate_method(method)
    base, x, dout, ref, xr, out_ref = _attention_case()
    plan = {"wq": ColwiseParallel(use_local_output=False),
            "wk": ColwiseParallel(use_local_output=False),
            "wv": ColwiseParallel(use_local_output=False), "wo": RowwiseParallel()}

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2, 2), mesh_dim_names=("cp", "tp"))
        model = parallelize_module(copy.deepcopy(base), mesh["tp"], plan)
        bufs = [x.clone(), dout.clone()]
        with context_parallel(mesh["cp"], buffers=bufs, buffer_seq_dims=[1, 1],
                              no_restore_buffers=set(bufs)):
            xl = bufs[0].clone().requires_grad_()
            out = model(xl)
            out.backward(bufs[1])
            whole = context_parallel_unshard(mesh["cp"], [out.detach(), xl.grad], [1, 1])
        grads = {n: DTensor.from_local(fc.all_reduce(p.grad.to_local(), "sum", mesh["cp"]).wait(),
                                       mesh["tp"], p.placements).full_tensor()
                 for n, p in model.named_parameters()}
        return whole, grads

    for (out, dx), grads in dtensor.run_threads(4, rank_fn):
        _check((out, dx), (out_ref.detach(), xr.grad), ("out", "dx"))
        for n, p in ref.named_parameters():
            torch.testing.assert_close(grads[n], p.grad, **TOL, msg=n)


@pytest.mark.parametrize("kind", ["dropout", "mask"])
def test_distributed_qkv_with_dropout_or_a_mask_inside_the_block(kind):
    """Inside context_parallel, SDPA on distributed q/k/v sharded on the sequence with arguments
    ring attention does not take (dropout, a mask) runs on the engine: output and gradients equal
    one device's, dropout drawn as one device draws it for the same seed."""
    import dtensor.random
    q, k, v, dout = _qkv(12, v_dim=8)
    mask = torch.rand(12, 12, generator=torch.Generator().manual_seed(3)) > 0.3
    kw = dict(dropout_p=0.25, is_causal=True) if kind == "dropout" else dict(attn_mask=mask)
    torch.manual_seed(7)
    want = reference(q, k, v, dout, **kw)

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        qd, kd, vd = (dtensor.distribute_tensor(t, mesh, [Shard(2)]).requires_grad_()
                      for t in (q, k, v))
        with context_parallel(mesh):
            dtensor.random.manual_seed(7, mesh)
            out = F.scaled_dot_product_attention(qd, kd, vd, **kw)
            out.backward(dtensor.distribute_tensor(dout, mesh, [Shard(2)]))
        return [t.full_tensor() for t in (out, qd.grad, kd.grad, vd.grad)]

    for got in dtensor.run_threads(2, rank_fn):
        _check(got, want, ("out", "dq", "dk", "dv"))


# ---- CP x FSDP, and dp x cp x tp ----------------------------------------------------------------

BATCH, SEQ, STEPS = 4, 16, 2


def _train_reference(base, batches):
    """One process: each step's loss (mean over the batch) and gradients, and the parameters
    after AdamW's steps."""
    model = copy.deepcopy(base)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, grads = [], []
    for x, y in batches:
        loss = F.mse_loss(model(x), y)
        loss.backward()
        losses.append(loss.detach())
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
    return losses, grads, {n: p.detach() for n, p in model.named_parameters()}


def _batches(seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(BATCH, SEQ, DIM, generator=g), torch.randn(BATCH, SEQ, DIM, generator=g))
            for _ in range(STEPS)]


def _train_cp(model, batches, dp_rank, dp, cp_mesh, fsdp_mesh):
    """dp x cp training: this dp rank's rows of each batch, sharded along the sequence by
    context_parallel(cp_mesh); the loss is the mean over this rank's tokens and FSDP (over the
    dp x cp ranks, ``fsdp_mesh``) averages the gradients, so the step is one process's on the
    whole batch (every rank holds as many tokens). Returns each step's loss (averaged over the
    ranks), gradients and the final parameters, whole."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, grads = [], []
    rows = slice(dp_rank * BATCH // dp, (dp_rank + 1) * BATCH // dp)
    for x, y in batches:
        bufs = [x[rows].clone(), y[rows].clone()]
        with context_parallel(cp_mesh, buffers=bufs, buffer_seq_dims=[1, 1]):
            loss = F.mse_loss(model(bufs[0]), bufs[1])
            loss.backward()
        losses.append(fc.all_reduce(loss.detach(), "avg", fsdp_mesh).wait())
        grads.append({n: p.grad.full_tensor() for n, p in model.named_parameters()})
        opt.step()
        opt.zero_grad()
    return losses, grads, {n: p.full_tensor() for n, p in model.named_parameters()}


def _check_training(got, ref):
    losses, grads, params = got
    torch.testing.assert_close(torch.stack(losses), torch.stack(ref[0]), **TOL)
    for step, (g, r) in enumerate(zip(grads, ref[1])):
        for n in r:
            torch.testing.assert_close(g[n], r[n], **TOL, msg=lambda m, n=n: f"{step} {n}: {m}")
    for n in ref[2]:
        torch.testing.assert_close(params[n], ref[2][n], **TOL, msg=n)


@pytest.mark.parametrize("method", ["allgather", "alltoall"])
def test_cp_x_fsdp(method):
    """fully_shard (the attention, then the block) over the flattened dp x cp ranks of a
    (dp, cp) mesh, as torchtitan's dp_shard x cp: each step's loss and gradients and the
    parameters after two AdamW steps equal one process's."""
    set_rotate_method(method)
    torch.manual_seed(0)
    base = Block()
    batches = _batches()
    ref = _train_reference(base, batches)

    def rank_fn(rank):
        world = dtensor.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "cp"))
        dp_cp = world["dp", "cp"]._flatten("dp_cp")
        model = copy.deepcopy(base)
        fully_shard(model.attention, mesh=dp_cp)
        fully_shard(model, mesh=dp_cp)
        assert isinstance(model, FSDPModule)
        return _train_cp(model, batches, world.get_local_rank("dp"), 2, world["cp"], dp_cp)

    for got in dtensor.run_threads(4, rank_fn):
        _check_training(got, ref)


_WORKER_3D = r'''
import copy
import os

import torch

import dtensor
from dtensor.experimental import set_rotate_method
from dtensor.fsdp import fully_shard
from dtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from context_parallel_compose_test import (Block, _batches, _check_training, _tp_plan,
                                           _train_cp, _train_reference)

torch.set_num_threads(1)
set_rotate_method(os.environ["ROTATE"])
dp, cp, tp = 2, 2, 2
torch.manual_seed(0)
base = Block()
batches = _batches()
ref = _train_reference(base, batches)
world = dtensor.init_device_mesh("cpu", (dp, cp, tp), mesh_dim_names=("dp", "cp", "tp"))
# FSDP over TP needs its data-parallel dim named in the root mesh of the TP mesh: the same ranks
# as a (dp_cp, tp) mesh, whose groups are the 3-D mesh's (groups are named by their ranks).
fsdp_tp = dtensor.init_device_mesh("cpu", (dp * cp, tp), mesh_dim_names=("dp_cp", "tp"))
model = copy.deepcopy(base)
plan = {**_tp_plan("attention."), "w1": ColwiseParallel(), "w2": RowwiseParallel()}
parallelize_module(model, fsdp_tp["tp"], plan)
fully_shard(model.attention, mesh=fsdp_tp["dp_cp"])
fully_shard(model, mesh=fsdp_tp["dp_cp"])
_check_training(_train_cp(model, batches, world.get_local_rank("dp"), dp, world["cp"],
                          fsdp_tp["dp_cp"]), ref)
print("ok")
'''


@pytest.mark.parametrize("method", ["allgather", "alltoall"])
def test_dp_x_cp_x_tp_on_8_processes(method, tmp_path):
    """A 2x2x2 (dp, cp, tp) mesh on 8 processes: the block's attention and MLP parallelize_module'd
    on "tp", fully_shard over dp x cp, each dp rank's rows sharded along the sequence over "cp":
    each step's loss and gradients and the parameters after two AdamW steps equal one
    process's."""
    run_on_ranks(_WORKER_3D, 8, tmp_path, ROTATE=method)


# ---- torch.compile ------------------------------------------------------------------------------

_WORKER_COMPILE = r'''
import copy
import os

import torch
import torch._dynamo.utils

import dtensor
from dtensor import DTensor
from dtensor import _functional_collectives as fc
from dtensor.experimental import context_parallel, context_parallel_unshard
from dtensor.parallel import parallelize_module
from context_parallel_compose_test import TOL, Attention, _tp_plan

torch.set_num_threads(1)
BACKEND, TP = os.environ["COMPILE_BACKEND"], int(os.environ["TP"])
torch.manual_seed(0)
base = Attention()
g = torch.Generator().manual_seed(1)
x, dout = torch.randn(2, 12, 16, generator=g), torch.randn(2, 12, 16, generator=g)
ref = copy.deepcopy(base)
xr = x.clone().requires_grad_()
ref(xr).backward(dout)
ref_out = ref(x).detach()
world = int(os.environ["WORLD_SIZE"])
mesh = dtensor.init_device_mesh("cpu", (world // TP, TP), mesh_dim_names=("cp", "tp"))


def run(model):
    """Output, input gradient and weight gradients (summed over cp), whole."""
    bufs = [x.clone(), dout.clone()]
    with context_parallel(mesh["cp"], buffers=bufs, buffer_seq_dims=[1, 1],
                          no_restore_buffers=set(bufs)):
        xl = bufs[0].clone().requires_grad_()
        out = model(xl)
        out.backward(bufs[1])
        whole = context_parallel_unshard(mesh["cp"], [out.detach(), xl.grad], [1, 1])
    grads = {}
    for n, p in model.named_parameters():
        local = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
        local = fc.all_reduce(local, "sum", mesh["cp"]).wait()
        grads[n] = (DTensor.from_local(local, mesh["tp"], p.placements).full_tensor()
                    if isinstance(p.grad, DTensor) else local)
    return whole, grads


def parallel():
    model = copy.deepcopy(base)
    return parallelize_module(model, mesh["tp"], _tp_plan()) if TP > 1 else model


eager = run(parallel())
compiled_model = parallel()
compiled_model.compile(backend=BACKEND)
compiled = run(compiled_model)
for (out, dx), grads in (eager, compiled):
    torch.testing.assert_close(out, ref_out, **TOL)
    torch.testing.assert_close(dx, xr.grad, **TOL)
    for n, p in ref.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, **TOL, msg=n)
torch.testing.assert_close(compiled[0], eager[0], **TOL)
counters = torch._dynamo.utils.counters
breaks = [k for k in counters["graph_break"] if "ring attention runs eagerly" in k]
assert breaks, dict(counters["graph_break"])
if TP == 1:  # SDPA is the only graph break (TP's distributed tensors add their own)
    assert set(counters["graph_break"]) == set(breaks), dict(counters["graph_break"])
assert counters["stats"]["unique_graphs"] > 0, dict(counters["stats"])
print("ok")
'''


@pytest.mark.parametrize("mode, backend, ranks", [
    ("cp", "inductor", 2),
    ("cp", "aot_eager", 2),
    ("cp x tp", "aot_eager", 4),
])
def test_compiled_module_inside_context_parallel(mode, backend, ranks, tmp_path):
    """The attention module compiled (``module.compile``), run inside
    context_parallel(mesh["cp"]) (cp = 2; "cp x tp": also parallelize_module'd on tp = 2): output,
    input gradient and weight gradients equal eager and one process. SDPA is one graph break
    (ring attention runs eagerly, NOTE [context parallel under torch.compile]); the projections
    around it compile (TP's parallel linears on distributed tensors run eagerly, NOTE [distributed
    tensors under torch.compile])."""
    run_on_ranks(_WORKER_COMPILE, ranks, tmp_path, COMPILE_BACKEND=backend,
                 TP="2" if mode == "cp x tp" else "1")
