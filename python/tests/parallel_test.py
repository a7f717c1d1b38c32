"""dtensor.parallel (tensor parallelism) against the same module on one device.

Each test builds the single-device module with torch.manual_seed(0), deep-copies it for every rank
(ranks are threads: dtensor.run_threads), parallelizes the copy and checks losses, outputs,
gradients and updated full weights against the single-device run.
"""

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dtensor
from dtensor import DTensor, Replicate, Shard
from dtensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

TOL = dict(rtol=1e-5, atol=1e-5)


class MLP(nn.Module):
    def __init__(self, dim=8, hidden=16):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.w2(F.relu(self.w1(x)))


def _optimizer(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.Adam(params, lr=0.01)


def _train(model, x, kind, steps=3):
    """Loss of every step of ``steps`` optimizer steps on sum(model(x)**2)."""
    opt = _optimizer(kind, model.parameters())
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(x).pow(2).sum()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _full_params(model):
    return {name: p.full_tensor() for name, p in model.named_parameters()}


def _assert_params_equal(ref, got):
    for name, p in ref.named_parameters():
        torch.testing.assert_close(got[name], p.detach(), **TOL, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("mesh_shape,hidden", [((2,), 16), ((4,), 16), ((4,), 10)])
def test_mlp_colwise_rowwise_train(mesh_shape, hidden, kind):
    torch.manual_seed(0)
    ref = MLP(8, hidden)
    x = torch.randn(4, 8)
    n = mesh_shape[0]

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", mesh_shape)
        # An uneven hidden dim keeps the DTensor between the two: from_local (in RowwiseParallel's
        # input hook) cannot tell the global size from uneven local pieces, as in PyTorch.
        even = hidden % n == 0
        model = parallelize_module(copy.deepcopy(ref), mesh, {
            "w1": ColwiseParallel(use_local_output=even), "w2": RowwiseParallel()})
        placements = {name: p.placements for name, p in model.named_parameters()}
        assert all(isinstance(p, nn.Parameter) and isinstance(p, DTensor)
                   for p in model.parameters())
        losses = _train(model, x, kind)
        return losses, placements, _full_params(model)

    results = dtensor.run_threads(n, rank_fn)
    ref_losses = _train(ref, x, kind)
    for losses, placements, params in results:
        assert placements == {"w1.weight": (Shard(0),), "w1.bias": (Shard(0),),
                              "w2.weight": (Shard(1),), "w2.bias": (Replicate(),)}
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), **TOL)
        _assert_params_equal(ref, params)


@pytest.mark.parametrize("tp_mesh_dim", [None, "tp", 0])
def test_mlp_on_2d_mesh(tp_mesh_dim):
    torch.manual_seed(0)
    ref = MLP()
    x = torch.randn(4, 8)
    tp = 0 if tp_mesh_dim == 0 else 1

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        model = parallelize_module(copy.deepcopy(ref), mesh,
                                   {"w1": ColwiseParallel(), "w2": RowwiseParallel()},
                                   tp_mesh_dim=tp_mesh_dim)
        w1 = model.w1.weight.placements
        return _train(model, x, "adam"), w1, _full_params(model)

    results = dtensor.run_threads(4, rank_fn)
    ref_losses = _train(ref, x, "adam")
    expected = [Replicate(), Replicate()]
    expected[tp] = Shard(0)
    for losses, w1, params in results:
        assert w1 == tuple(expected)
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), **TOL)
        _assert_params_equal(ref, params)


class Attention(nn.Module):
    """torchtitan's attention: no biases, the head count inferred (-1), so with
    ``use_local_output`` each rank runs its own heads on plain pieces."""

    def __init__(self, dim=8, heads=4):
        super().__init__()
        self.head_dim = dim // heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        scores = q @ k.transpose(-2, -1) / self.head_dim ** 0.5
        a = torch.softmax(scores, dim=-1) @ v
        return self.wo(a.transpose(1, 2).reshape(b, s, -1))


@pytest.mark.parametrize("n", [2, 4])
def test_attention_on_local_heads_trains(n):
    """Colwise q/k/v and rowwise o with local outputs (torchtitan's plan) train as one device.
    k's gradient reaches to_local's output with the sequence dim innermost in memory (from
    ``k.transpose(-2, -1)``), while the distributed gradient claimed the forward's row-major
    strides, so linear's backward reshape took the view path and raised "view size is not
    compatible" (NOTE [to_local gradients in the forward's layout])."""
    torch.manual_seed(0)
    ref = Attention()
    x = torch.randn(2, 6, 8)

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (n,))
        model = parallelize_module(copy.deepcopy(ref), mesh, {
            "wq": ColwiseParallel(), "wk": ColwiseParallel(), "wv": ColwiseParallel(),
            "wo": RowwiseParallel()})
        return _train(model, x, "adam"), _full_params(model)

    results = dtensor.run_threads(n, rank_fn)
    ref_losses = _train(ref, x, "adam")
    for losses, params in results:
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), **TOL)
        _assert_params_equal(ref, params)


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([MLP(), MLP()])
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def test_wildcard_plan_and_single_style():
    torch.manual_seed(0)
    ref = Stack()
    x = torch.randn(3, 8)

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        model = copy.deepcopy(ref)
        parallelize_module(model, mesh, {"layers.*.w1": ColwiseParallel(),
                                         "layers.*.w2": RowwiseParallel()})
        # A style given directly applies to the module itself.
        parallelize_module(model.head, mesh, ColwiseParallel(output_layouts=Replicate()))
        sharded = sorted(name for name, p in model.named_parameters()
                         if p.placements[0].is_shard())
        return _train(model, x, "sgd"), sharded, _full_params(model)

    results = dtensor.run_threads(2, rank_fn)
    ref_losses = _train(ref, x, "sgd")
    for losses, sharded, params in results:
        assert sharded == ["head.bias", "head.weight", "layers.0.w1.bias", "layers.0.w1.weight",
                           "layers.0.w2.weight", "layers.1.w1.bias", "layers.1.w1.weight",
                           "layers.1.w2.weight"]
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), **TOL)
        _assert_params_equal(ref, params)


class EmbedHead(nn.Module):
    def __init__(self, vocab=16, dim=8, classes=12):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, idx):
        return self.head(self.emb(idx))


def _ce_train(model, idx, target, steps=3, ctx=None, wrap_target=None):
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        with ctx() if ctx else _nothing():
            logits = model(idx)
            t = wrap_target(target) if wrap_target else target
            loss = F.cross_entropy(logits.flatten(0, 1), t.flatten())
            loss.backward()
        opt.step()
        losses.append(loss.full_tensor().item() if isinstance(loss, DTensor) else loss.item())
    return losses


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _embedding_loss_parallel(target_kind, n):
    torch.manual_seed(0)
    ref = EmbedHead()
    idx = torch.randint(0, 16, (3, 5))
    target = torch.randint(0, 12, (3, 5))

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (n,))
        model = parallelize_module(copy.deepcopy(ref), mesh, {
            "emb": RowwiseParallel(),
            "head": ColwiseParallel(use_local_output=False),
        })
        logits = model(idx)
        assert isinstance(logits, DTensor) and logits.placements == (Shard(2),)
        wrap = None
        if target_kind == "dtensor":
            def wrap(t):
                return DTensor.from_local(t, mesh, [Replicate()])
        losses = _ce_train(model, idx, target, ctx=loss_parallel, wrap_target=wrap)
        return losses, model.emb.weight.placements, _full_params(model)

    results = dtensor.run_threads(n, rank_fn)
    ref_losses = _ce_train(ref, idx, target)
    for losses, emb_placements, params in results:
        assert emb_placements == (Shard(0),)
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), **TOL)
        _assert_params_equal(ref, params)


@pytest.mark.parametrize("n", [2, 4])
def test_embedding_rowwise_linear_colwise_loss_parallel_dtensor_target(n):
    _embedding_loss_parallel("dtensor", n)


def test_embedding_rowwise_linear_colwise_loss_parallel_plain_target():
    _embedding_loss_parallel("plain", 2)


class NormBlock(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.ffn = MLP(dim, 16)

    def forward(self, x):
        return self.ffn(self.norm(x))


def test_sequence_parallel_layernorm_with_prepare_module_input():
    torch.manual_seed(0)
    ref = NormBlock()
    with torch.no_grad():  # not the ones/zeros init, so the check sees the parameters
        ref.norm.weight.uniform_(0.5, 1.5)
        ref.norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(2, 6, 8)  # [batch, sequence, dim]
    n = 2

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (n,))
        model = parallelize_module(copy.deepcopy(ref), mesh, {
            "norm": SequenceParallel(),
            "ffn": PrepareModuleInput(input_layouts=(Shard(1),),
                                      desired_input_layouts=(Replicate(),)),
            "ffn.w1": ColwiseParallel(),
            "ffn.w2": RowwiseParallel(output_layouts=Shard(1)),
        })
        assert model.norm.weight.placements == (Replicate(),)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        outs = []
        for _ in range(2):
            opt.zero_grad()
            out = model(x.chunk(n, dim=1)[rank])  # this rank's part of the sequence
            outs.append(out.detach().clone())
            out.pow(2).sum().backward()  # the per-rank terms add up to the global loss
            opt.step()
        return outs, _full_params(model)

    results = dtensor.run_threads(n, rank_fn)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    ref_outs = []
    for _ in range(2):
        opt.zero_grad()
        out = ref(x)
        ref_outs.append(out.detach().clone())
        out.pow(2).sum().backward()
        opt.step()
    for rank, (outs, params) in enumerate(results):
        for got, want in zip(outs, ref_outs):
            torch.testing.assert_close(got, want.chunk(n, dim=1)[rank], **TOL)
        _assert_params_equal(ref, params)


def test_rowwise_output_shard0_gradients():
    torch.manual_seed(0)
    ref = nn.Linear(8, 6)
    x = torch.randn(4, 8)
    ref_out = ref(x)
    ref_out.pow(2).sum().backward()
    n = 2

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (n,))
        model = parallelize_module(copy.deepcopy(ref), mesh,
                                   RowwiseParallel(output_layouts=Shard(0)))
        model.zero_grad()
        out = model(x.chunk(n, dim=-1)[rank])  # default input layout: Shard(-1)
        out.pow(2).sum().backward()
        return out.detach(), model.weight.grad.full_tensor(), model.bias.grad.full_tensor()

    for rank, (out, gw, gb) in enumerate(dtensor.run_threads(n, rank_fn)):
        torch.testing.assert_close(out, ref_out.detach().chunk(n, dim=0)[rank], **TOL)
        torch.testing.assert_close(gw, ref.weight.grad, **TOL)
        torch.testing.assert_close(gb, ref.bias.grad, **TOL)


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, *, scale):
        return self.lin(x) * scale, x.sum(-1)


def test_prepare_module_input_kwargs_and_output():
    torch.manual_seed(0)
    ref = TwoInputs()
    x = torch.randn(4, 8)
    scale = torch.rand(4, 8) + 0.5
    ref_a, ref_b = ref(x, scale=scale)
    n = 2

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (n,))
        model = copy.deepcopy(ref)
        parallelize_module(model, mesh, {"lin": ColwiseParallel(output_layouts=Shard(0),
                                                                use_local_output=False)})
        parallelize_module(model, mesh, PrepareModuleInput(
            input_layouts=(Shard(0),), desired_input_layouts=(Replicate(),),
            input_kwarg_layouts={"scale": Shard(0)},
            desired_input_kwarg_layouts={"scale": Shard(0)}))
        parallelize_module(model, mesh, PrepareModuleOutput(
            output_layouts=(Shard(0), Replicate()),
            desired_output_layouts=(Replicate(), Shard(0))))
        a, b = model(x.chunk(n, 0)[rank], scale=scale.chunk(n, 0)[rank])
        assert not isinstance(a, DTensor) and not isinstance(b, DTensor)
        return a, b

    for rank, (a, b) in enumerate(dtensor.run_threads(n, rank_fn)):
        torch.testing.assert_close(a, ref_a.detach(), **TOL)
        torch.testing.assert_close(b, ref_b.detach().chunk(n, 0)[rank], **TOL)


def test_prepare_module_input_kwargs_survive_deepcopy():
    """A copy of a module prepared with input_kwarg_layouts (an EMA or eval copy) runs its own
    forward and weights: the style wrapped forward in a closure over the original's bound
    method, which deepcopy shared, so the copy computed with the original's weights."""
    torch.manual_seed(0)
    ref = TwoInputs()
    x, scale = torch.randn(4, 8), torch.rand(4, 8) + 0.5

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        model = copy.deepcopy(ref)
        parallelize_module(model, mesh, PrepareModuleInput(
            input_layouts=(Replicate(),), desired_input_layouts=(Replicate(),),
            input_kwarg_layouts={"scale": Replicate()},
            desired_input_kwarg_layouts={"scale": Replicate()}, use_local_output=True))
        twin = copy.deepcopy(model)
        with torch.no_grad():
            for p in twin.parameters():
                p.mul_(2)
        expect = copy.deepcopy(ref)
        with torch.no_grad():
            for p in expect.parameters():
                p.mul_(2)
        for got, want in zip(twin(x, scale=scale), expect(x, scale=scale)):
            torch.testing.assert_close(got, want, **TOL)
        for got, want in zip(model(x, scale=scale), ref(x, scale=scale)):
            torch.testing.assert_close(got, want, **TOL)

    dtensor.run_threads(2, rank_fn)


def test_empty_plan_key_is_the_module_itself():
    """As PyTorch's parallelize_module: the plan key "" applies its style to the module given."""
    torch.manual_seed(0)
    ref = MLP()
    x = torch.randn(2, 4, 8)
    out = ref(x)

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        model = parallelize_module(copy.deepcopy(ref), mesh, {
            "": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "w1": ColwiseParallel(), "w2": RowwiseParallel()})
        torch.testing.assert_close(model(x.chunk(2, 1)[rank]), out, **TOL)

    dtensor.run_threads(2, rank_fn)


def test_meta_device_model_parallelized_then_to_empty_trains():
    """torchtitan's deferred init: build on the meta device, parallelize, to_empty, fill, train.
    to_empty assigns .data; the distributed tensor kept reporting the meta device, and backward
    failed ("expected device meta but got cpu")."""
    torch.manual_seed(0)
    ref = MLP()
    x = torch.randn(4, 8)
    ref(x).pow(2).sum().backward()

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        with torch.device("meta"):
            model = MLP()
        parallelize_module(model, mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
        model.to_empty(device="cpu")
        with torch.no_grad():
            for p, q in zip(model.parameters(), ref.parameters()):
                p.copy_(dtensor.distribute_tensor(q.detach(), mesh, list(p.placements)))
        for p in model.parameters():
            assert p.device.type == "cpu" and not p.is_meta and p.to_local().device.type == "cpu"
        model(x).pow(2).sum().backward()
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad.full_tensor(), q.grad, **TOL)

    dtensor.run_threads(2, rank_fn)


def test_overriding_a_pytorch_style_hook_raises_instead_of_being_skipped():
    """torchao's float8 styles subclass ColwiseParallel and override PyTorch's static
    _prepare_input_fn; this package's styles do not call such hooks, so the override was
    silently ignored. It raises, naming the method."""

    class Custom(ColwiseParallel):
        @staticmethod
        def _prepare_input_fn(input_layouts, desired_input_layouts, mod, inputs, device_mesh):
            return inputs

    with pytest.raises(NotImplementedError, match="_prepare_input_fn"):
        _on_mesh(lambda mesh: parallelize_module(nn.Linear(4, 4), mesh, Custom()))


def _on_mesh(fn):
    def rank_fn(rank):
        return fn(dtensor.init_device_mesh("cpu", (2,)))
    return dtensor.run_threads(2, rank_fn)


def test_unknown_submodule_name_warns_and_the_rest_of_the_plan_applies():
    # PyTorch's contract: a plan entry that matches nothing is skipped with a UserWarning.
    def parallelize(mesh):
        model = MLP()
        parallelize_module(model, mesh, {"w1": ColwiseParallel(), "w3": RowwiseParallel()})
        return tuple(model.w1.weight.placements)

    with pytest.warns(UserWarning, match="'w3'"):  # the rank threads warn into the main's record
        assert _on_mesh(parallelize) == [(Shard(0),), (Shard(0),)]


def test_no_plan_warns_and_leaves_the_module_alone():
    def parallelize(mesh):
        model = MLP()
        assert parallelize_module(model, mesh) is model
        return isinstance(model.w1.weight, DTensor)

    with pytest.warns(UserWarning, match="does nothing"):
        assert _on_mesh(parallelize) == [False, False]


@pytest.mark.parametrize("style,module,name", [
    (ColwiseParallel(), nn.LayerNorm(8), "LayerNorm"),
    (RowwiseParallel(), nn.Conv1d(2, 2, 3), "Conv1d"),
])
def test_unsupported_module_type_raises(style, module, name):
    with pytest.raises(NotImplementedError, match=name):
        _on_mesh(lambda mesh: parallelize_module(copy.deepcopy(module), mesh, style))


def test_bad_mesh_dim_raises():
    def fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp", "tp"))
        parallelize_module(MLP(), mesh, {"w1": ColwiseParallel()}, tp_mesh_dim="cp")
    with pytest.raises(ValueError, match="cp"):
        dtensor.run_threads(2, fn)


@pytest.mark.parametrize("src", [0, 1, None])
def test_src_data_rank_decides_whose_parameters_count(src):
    base = nn.Linear(4, 6)

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        m = copy.deepcopy(base)
        with torch.no_grad():
            m.weight.add_(rank)  # every rank holds different values
        expected = base.weight.detach() + (rank if src is None else src)
        parallelize_module(m, mesh, ColwiseParallel(), src_data_rank=src)
        got = m.weight.to_local()
        torch.testing.assert_close(got, expected.chunk(2, 0)[rank])
        return True

    assert all(dtensor.run_threads(2, rank_fn))


def test_tp_training_step_reads_no_scalar_to_the_host():
    """The "no hidden host round trip": a TP training step (LayerNorm, ColwiseParallel,
    RowwiseParallel, a residual, SGD with momentum) on 2 ranks calls no op that reads a value back
    to the host (item, _local_scalar_dense, is_nonzero, nonzero, equal: on CUDA each is a
    device-to-host copy and a sync). The profiler records every ATen call of rank 0's step, the
    engine's own included. python/tests/cuda_test.py counts the CUDA memcpys themselves on a GPU."""
    import collections

    from torch.profiler import ProfilerActivity, profile

    from dtensor import _functional_collectives as funcol

    reads = ("aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::nonzero",
             "aten::equal")

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(16)
            self.w1 = nn.Linear(16, 32)
            self.w2 = nn.Linear(32, 16)

        def forward(self, x):
            return x + self.w2(F.relu(self.w1(self.norm(x))))

    torch.manual_seed(0)
    ref, x0 = Block(), torch.randn(4, 8, 16)

    def fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        model = parallelize_module(copy.deepcopy(ref), mesh, {
            "w1": ColwiseParallel(), "w2": RowwiseParallel(use_local_output=False)})
        dtensor.distribute_module(model, mesh)
        x = dtensor.distribute_tensor(x0, mesh, [Replicate()])
        opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)

        def step():
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()

        step()  # the first step makes the momentum buffers and fills the caches
        prof = profile(activities=[ProfilerActivity.CPU])
        funcol.all_reduce(torch.zeros(1))
        if rank == 0:
            prof.__enter__()
        funcol.all_reduce(torch.zeros(1))
        step()
        funcol.all_reduce(torch.zeros(1))
        if rank != 0:
            return None
        prof.__exit__(None, None, None)
        events = prof.events()
        assert any(e.name == "aten::mm" for e in events), "the profiler saw no matrix product"
        return collections.Counter(e.name for e in events if e.name in reads)

    assert dtensor.run_threads(2, fn)[0] == collections.Counter()

