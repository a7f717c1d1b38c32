"""loss_parallel (NOTE [loss parallel]): cross-entropy on logits sharded on the class dim equals
one device's loss and gradients for every reduction, class weights, ignore_index, label
smoothing, uneven class splits, 2-D meshes and 3-D inputs (ranks are threads); and on real
processes a vocabulary-heavy loss step's peak memory per rank scales as 1/N of the logits."""

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dtensor
from dtensor import DTensor, Replicate, Shard, distribute_tensor
from dtensor.parallel import loss_parallel
from launch_ranks import run_on_ranks

TOL = dict(rtol=1e-5, atol=1e-6)


def _case(shape, seed=0, ignore=None):
    g = torch.Generator().manual_seed(seed)
    classes = shape[1] if len(shape) >= 2 else shape[0]
    x = torch.randn(shape, generator=g)
    rows = shape[:1] + shape[2:] if len(shape) >= 2 else ()
    t = torch.randint(0, classes, rows, generator=g)
    if ignore is not None and t.dim():
        t.view(-1)[::3] = ignore
    return x, t


def _reference(fn, x, *args, **kwargs):
    x = x.clone().requires_grad_()
    loss = fn(x, *args, **kwargs)
    loss.sum().backward()
    return loss.detach(), x.grad


def _sharded(n, fn, x, placements_of, *args, mesh_shape=None, target_of=None, **kwargs):
    """Runs ``fn`` under loss_parallel on ``n`` thread ranks; returns each rank's full loss and
    full input gradient, and the input gradient's placements."""

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", mesh_shape or (n,))
        xd = distribute_tensor(x.clone(), mesh, placements_of(mesh)).requires_grad_()
        a = [target_of(mesh, v) if target_of and torch.is_tensor(v) else v for v in args]
        with loss_parallel():
            loss = fn(xd, *a, **kwargs)
            assert isinstance(loss, DTensor)
            loss.sum().backward()
        return loss.full_tensor().detach(), xd.grad.full_tensor(), xd.grad.placements

    return dtensor.run_threads(n if mesh_shape is None else mesh_shape[0] * mesh_shape[1],
                               rank_fn)


def _check(results, ref, placements):
    ref_loss, ref_grad = ref
    for loss, grad, grad_placements in results:
        torch.testing.assert_close(loss, ref_loss, **TOL)
        torch.testing.assert_close(grad, ref_grad, **TOL)
        assert grad_placements == tuple(placements)


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_cross_entropy_equals_one_device(n, reduction, weighted, smoothing):
    classes = 13  # uneven on 2 and 4 ranks (7+6, 4+4+4+1)
    x, t = _case((6, classes), seed=n, ignore=-100)
    w = torch.rand(classes, generator=torch.Generator().manual_seed(1)) + 0.5 if weighted \
        else None
    kw = dict(weight=w, reduction=reduction, label_smoothing=smoothing)
    ref = _reference(F.cross_entropy, x, t, **kw)
    _check(_sharded(n, F.cross_entropy, x, lambda m: [Shard(1)], t, **kw), ref, [Shard(1)])


def test_more_ranks_than_classes_and_all_rows_of_one_rank():
    x, t = _case((5, 3), seed=3)
    ref = _reference(F.cross_entropy, x, t)
    _check(_sharded(4, F.cross_entropy, x, lambda m: [Shard(1)], t), ref, [Shard(1)])


def test_three_dim_input_and_module_and_custom_ignore_index():
    x, t = _case((3, 10, 4), seed=4, ignore=7)
    loss_fn = nn.CrossEntropyLoss(ignore_index=7)
    ref = _reference(loss_fn, x, t)
    _check(_sharded(2, loss_fn, x, lambda m: [Shard(1)], t), ref, [Shard(1)])


def test_two_dim_mesh_batch_and_class_sharded_with_distributed_target():
    x, t = _case((8, 12), seed=5)
    ref = _reference(F.cross_entropy, x, t)
    place = [Shard(0), Shard(1)]
    results = _sharded(4, F.cross_entropy, x, lambda m: place, t, mesh_shape=(2, 2),
                       target_of=lambda m, v: distribute_tensor(v, m, [Shard(0), Replicate()]))
    _check(results, ref, place)


@pytest.mark.parametrize("form", ["functional", "method", "torch"])
def test_log_softmax_then_nll_loss(form):
    x, t = _case((6, 11), seed=6, ignore=-100)

    def fn(v, target):
        logp = {"functional": lambda: F.log_softmax(v, dim=1),
                "method": lambda: v.log_softmax(-1),
                "torch": lambda: torch.log_softmax(v, 1)}[form]()
        if isinstance(logp, DTensor):
            assert logp.placements == (Shard(1),)  # never gathered
        return F.nll_loss(logp, target, reduction="sum")

    ref = _reference(fn, x, t)
    _check(_sharded(2, fn, x, lambda m: [Shard(1)], t), ref, [Shard(1)])


@pytest.mark.parametrize("form", ["cross_entropy", "log_softmax_nll"])
def test_every_target_ignored_gives_zero_gradients_as_one_device(form):
    """A batch whose targets are all ignore_index (a micro-batch of prompt tokens only): the mean
    loss is NaN on one device too, but its gradient is zeros; the backward multiplied the
    incoming inf (1 / zero weight) by the rows' weight 0 and gave NaN everywhere."""
    x, _ = _case((4, 7), seed=8)
    t = torch.full((4,), -100)

    def fn(v, target):
        if form == "cross_entropy":
            return F.cross_entropy(v, target)
        return F.nll_loss(F.log_softmax(v, dim=1), target)

    ref_loss, ref_grad = _reference(fn, x, t)
    assert torch.isnan(ref_loss) and torch.equal(ref_grad, torch.zeros_like(ref_grad))
    for loss, grad, _ in _sharded(2, fn, x, lambda m: [Shard(1)], t):
        assert torch.isnan(loss)
        torch.testing.assert_close(grad, ref_grad, **TOL)


def test_log_softmax_result_is_contiguous_as_one_device():
    """log_softmax of a transposed class-sharded input: torch returns a contiguous result (so
    .view works); the engine's said the input's strides and refused the view."""
    x = torch.randn(2, 3, 6)
    ref = F.log_softmax(x.transpose(1, 2), dim=1)

    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        xd = distribute_tensor(x, mesh, [Shard(2)])
        with loss_parallel():
            lp = F.log_softmax(xd.transpose(1, 2), dim=1)
        assert lp.stride() == ref.stride() and lp.is_contiguous()
        return lp.view(2, 18).full_tensor()

    for out in dtensor.run_threads(2, rank_fn):
        torch.testing.assert_close(out, ref.view(2, 18), **TOL)


def test_input_not_sharded_on_the_class_dim_takes_the_ordinary_path():
    x, t = _case((8, 5), seed=7)
    ref = _reference(F.cross_entropy, x, t)
    _check(_sharded(2, F.cross_entropy, x, lambda m: [Shard(0)], t), ref, [Shard(0)])


def test_bad_targets_raise_clear_errors():
    def rank_fn(rank):
        mesh = dtensor.init_device_mesh("cpu", (2,))
        x = distribute_tensor(torch.randn(4, 6), mesh, [Shard(1)])
        errors = []
        with loss_parallel():
            for target in (torch.rand(4, 6), torch.zeros(5, dtype=torch.long)):
                try:
                    F.cross_entropy(x, target)
                except (NotImplementedError, ValueError) as e:
                    errors.append(str(e))
        return errors

    for errors in dtensor.run_threads(2, rank_fn):
        assert len(errors) == 2
        assert "class-probability targets" in errors[0]
        assert "target has shape [5]" in errors[1] and "[4]" in errors[1]


# ---- peak memory on real processes ---------------------------------------------------------

MEMORY_WORKER = r'''
import contextlib, json, sys
import torch
import torch.nn.functional as F
from torch.profiler import profile, ProfilerActivity
import dtensor
from dtensor import DTensor, Shard, Replicate, distribute_tensor
from dtensor.parallel import loss_parallel

ROWS, DIM, VOCAB = 256, 64, 16384
n = int(sys.argv[1])
torch.manual_seed(0)
hidden = torch.randn(ROWS, DIM)
head = torch.randn(VOCAB, DIM) / DIM ** 0.5
target = torch.randint(0, VOCAB, (ROWS,))
if n > 1:
    mesh = dtensor.init_device_mesh("cpu", (n,))
    head = distribute_tensor(head, mesh, [Shard(0)])  # ColwiseParallel's weight layout
    hidden = distribute_tensor(hidden, mesh, [Replicate()])
h = hidden.detach().requires_grad_()
w = head.detach().requires_grad_()


def step():
    # The vocabulary-heavy part of a step: the head's logits, the loss, and their backward.
    with loss_parallel() if n > 1 else contextlib.nullcontext():
        logits = torch.mm(h, w.t())
        loss = F.cross_entropy(logits, target)
        loss.backward()
    return loss


step()  # warm-up (propagation caches, workspaces) outside the measurement
h.grad = w.grad = None
with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
    loss = step()
events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
current = peak = 0
# torch 2.x's Kineto events give start_ns (1.13's start_us).
start = (lambda e: e.start_ns()) if hasattr(events[0], "start_ns") else (lambda e: e.start_us())
for e in sorted(events, key=start):
    current += e.nbytes()
    peak = max(peak, current)
value = loss.full_tensor() if isinstance(loss, DTensor) else loss
print("MEMORY " + json.dumps({"n": n, "peak": peak, "loss": float(value)}))
print("ok")
'''


def _peaks(tmp_path, n):
    out = run_on_ranks(MEMORY_WORKER.replace("sys.argv[1]", repr(str(n))), n, tmp_path,
                       name=f"memory{n}")
    # "MEMORY {": a warning may quote the print's source line (print("MEMORY " + ...)).
    return [json.loads(line.split("MEMORY ", 1)[1]) for line in out.splitlines()
            if "MEMORY {" in line]


def test_peak_memory_of_a_vocabulary_heavy_loss_step_scales_as_one_over_n(tmp_path):
    rows, vocab = 256, 16384
    logits_bytes = rows * vocab * 4
    (one,) = _peaks(tmp_path, 1)
    # The part of the step that is not the logits' size: the hidden state's gradient (rows x dim,
    # one all-reduced copy and its sum) and per-row statistics.
    rest = 4 * rows * 64 * 4 + 64 * rows * 4
    for n in (2, 4):
        ranks = _peaks(tmp_path, n)
        assert len(ranks) == n
        for r in ranks:
            assert r["loss"] == pytest.approx(one["loss"], rel=1e-5)
            # Figures (bytes): printed for the README.
            print(json.dumps({"bench": "loss_parallel_memory", "ranks": n, "peak": r["peak"],
                              "one_device_peak": one["peak"], "logits_bytes": logits_bytes,
                              "peak_over_logits_share": r["peak"] / (logits_bytes / n)}))
            # The target: <= 1.2 x (logits bytes / N) per logits-sized buffer the single
            # device holds at its peak, plus the rest.
            assert r["peak"] <= 1.2 * one["peak"] / n + rest, (n, r, one)
