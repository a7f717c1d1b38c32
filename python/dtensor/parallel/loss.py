"""``loss_parallel``: cross-entropy on logits sharded on the class dim, never gathered.

NOTE [loss parallel]: PyTorch's ``torch.distributed.tensor.parallel.loss_parallel`` replaces
``_log_softmax``, ``nll_loss_forward`` and their backwards by handlers that keep the class dim
sharded. Here a ``TorchFunctionMode`` active inside ``with loss_parallel():`` catches
``F.cross_entropy`` (and so ``nn.CrossEntropyLoss``), ``F.log_softmax`` / ``Tensor.log_softmax`` /
``torch.log_softmax`` and ``F.nll_loss`` when their input is a distributed tensor sharded on the
class dim (dim 1, or 0 for an unbatched input) along exactly one mesh dim, and runs them on each
rank's piece:

* log-softmax: the row max and the row sum of exponentials are all-reduced (max, then sum) over
  that mesh dim: two messages of one value per row, instead of gathering the logits;
* the target's log-probability: each rank picks the classes it holds (others count 0) and the
  per-row values are all-reduced (sum);
* backward: ``softmax - onehot`` is computed on the piece from the saved log-probabilities
  (``log_softmax``'s own backward all-reduces one value per row).

``cross_entropy`` runs as one fused function that keeps only the log-probabilities (one piece of
logits' size) for backward, so a rank's peak memory of a loss step is its share of the logits
times a small constant, as a single device's is of the whole (``python/tests/loss_parallel_test.py``
measures it). Other mesh dims may be Replicate or shard a row dim (batch, sequence); the target
(class indices, plain = replicated, or distributed) is laid out as the rows. Reductions
``none``/``sum``/``mean``, ``weight`` (plain, replicated), ``ignore_index`` and, beyond PyTorch,
``label_smoothing`` are supported; class-probability targets raise. The result is a distributed
tensor (Replicate for ``sum``/``mean``; the rows' layout for ``none``), as PyTorch's.
Inputs not sharded on the class dim take the engine's ordinary path (exact, nothing gathered
on the class dim either way).
"""

import contextlib
import inspect

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import dtensor
from dtensor import _C
from dtensor._api import DTensor
from dtensor.placement_types import Replicate, Shard

__all__ = ["loss_parallel"]

_LOG_SOFTMAX = (F.log_softmax, torch.log_softmax, torch.Tensor.log_softmax)
_CE_SIG = inspect.signature(F.cross_entropy)
_NLL_SIG = inspect.signature(F.nll_loss)


def _all_reduce(t, op, group):
    return torch.ops.dtensor_c10d.wait_tensor(torch.ops.dtensor_c10d.all_reduce(t, op, group))


class _Layout:
    """Where the class dim of ``x`` lives: its dim, the mesh dim sharding it, this rank's class
    range, the group of that mesh dim, and the layout of the rows (x without its class dim)."""

    def __init__(self, x, class_dim, what):
        self.mesh = x.device_mesh
        self.placements = tuple(x.placements)
        self.class_dim = class_dim
        self.shape = tuple(x.shape)
        sharding = [i for i, p in enumerate(self.placements) if p.is_shard(class_dim)]
        self.mesh_dim = sharding[0] if len(sharding) == 1 else None
        if len(sharding) > 1:
            raise ValueError(f"loss_parallel: {what}'s input {self._text()} shards the class dim "
                             f"{class_dim} over mesh dims {sharding}; loss_parallel supports one")
        self.rows = self.shape[:class_dim] + self.shape[class_dim + 1:]
        if self.mesh_dim is None:
            return
        partial = [p for p in self.placements if p.is_partial()]
        if partial:
            raise ValueError(f"loss_parallel: {what}'s input {self._text()} is Partial; reduce "
                             f"it first (redistribute to Replicate or Shard)")
        self.classes = self.shape[class_dim]
        coord = self.mesh.get_coordinate()
        self.local_classes, self.offset = Shard.local_shard_size_and_offset(
            self.classes, self.mesh.size(self.mesh_dim), coord[self.mesh_dim])
        self.group = _C.mesh_group_name(self.mesh._mesh, self.mesh_dim)
        self.row_placements = [self._row_placement(p) for p in self.placements]

    def _text(self):
        return f"(shape {list(self.shape)}, placements {list(self.placements)} on {self.mesh})"

    def _row_placement(self, p):
        if p.is_shard(self.class_dim):
            return Replicate()
        if isinstance(p, Shard):
            return Shard(p.dim - 1 if p.dim > self.class_dim else p.dim)
        return p

    def local_rows(self, t, what):
        """This rank's rows of ``t`` (plain: read as replicated; or distributed), as local."""
        if tuple(t.shape) != self.rows:
            raise ValueError(f"loss_parallel: {what}'s target has shape {list(t.shape)}, the "
                             f"input {self._text()} needs {list(self.rows)}")
        if not isinstance(t, DTensor):
            t = DTensor.from_local(t, self.mesh, [Replicate()] * self.mesh.ndim)
        return t.redistribute(self.mesh, self.row_placements).to_local()

    def rows_dtensor(self, local):
        stride = torch.empty(self.rows, device="meta").stride()
        return DTensor.from_local(local, self.mesh, self.row_placements, shape=self.rows,
                                  stride=stride)


class _Terms:
    """The target's terms, computed once per call: per-row validity and weight (0 for ignored
    rows), the local index of the target class and whether this rank holds it, the local slice
    of the class weights (None: all ones) and their sum over every class."""

    def __init__(self, valid, w_row, held, local, w_local, w_sum):
        self.valid, self.w_row, self.held, self.local = valid, w_row, held, local
        self.w_local, self.w_sum = w_local, w_sum


def _target_terms(lay, target, weight, ignore_index, dtype):
    valid = target != ignore_index
    safe = torch.where(valid, target, torch.zeros_like(target))
    if weight is None:
        w_row = valid.to(dtype)
        w_local = None
    else:
        w_row = weight.to(dtype)[safe] * valid
        w_local = weight.to(dtype).narrow(0, lay.offset, lay.local_classes)
    local = safe - lay.offset
    held = valid & (local >= 0) & (local < lay.local_classes)
    local = torch.where(held, local, torch.zeros_like(local))
    w_sum = float(lay.classes if weight is None else weight.sum())
    return _Terms(valid, w_row, held, local, w_local, w_sum)


def _valid_rows(g, t):
    """The incoming per-row gradient, 0 on ignored rows (as torch's nll_loss backward): with
    every target ignored, reduction="mean" divides by a zero weight and sends inf, and inf times
    an ignored row's weight 0 made every gradient NaN where one device gives zeros."""
    return torch.where(t.valid, g, torch.zeros((), dtype=g.dtype, device=g.device))


def _unsq(t, lay):
    return t.unsqueeze(lay.class_dim)


def _picked(logp, lay, held, local):
    """Global per-row log-probability of the target (sum over ranks of the held values)."""
    if lay.local_classes == 0:
        mine = torch.zeros(held.shape, dtype=logp.dtype, device=logp.device)
    else:
        mine = logp.gather(lay.class_dim, _unsq(local, lay)).squeeze(lay.class_dim)
    return _all_reduce(mine * held, "sum", lay.group)


def _local_log_softmax(x, lay):
    if lay.local_classes == 0:
        m = torch.full(lay.rows, float("-inf"), dtype=x.dtype, device=x.device)
    else:
        m = x.detach().amax(lay.class_dim)
    m = _all_reduce(m, "max", lay.group)
    shifted = x - _unsq(m, lay)
    sumexp = _all_reduce(shifted.exp().sum(lay.class_dim, dtype=torch.float32), "sum", lay.group)
    return shifted.sub_(_unsq(sumexp.log().to(x.dtype), lay))


class _CrossEntropy(torch.autograd.Function):
    """Per-row loss (1-eps) * w_t * (-logp_t) + eps/C * valid * sum_c w_c (-logp_c) on the local
    piece of class-sharded logits; saves only logp."""

    @staticmethod
    def forward(ctx, x, lay, t, eps):
        logp = _local_log_softmax(x, lay)
        loss = -_picked(logp, lay, t.held, t.local) * t.w_row
        if eps > 0:
            lp = logp if t.w_local is None else logp * _w_view(t.w_local, lay, logp)
            smooth = _all_reduce(-lp.sum(lay.class_dim), "sum", lay.group)
            loss = (1 - eps) * loss + (eps / lay.classes) * smooth * t.valid
        ctx.lay, ctx.terms, ctx.eps = lay, t, eps
        ctx.save_for_backward(logp)
        return loss

    @staticmethod
    def backward(ctx, g):
        (logp,) = ctx.saved_tensors
        lay, t, eps = ctx.lay, ctx.terms, ctx.eps
        g = _valid_rows(g, t)
        # d loss / d x = a - p * sum(a), a = d loss / d logp.
        sum_a = -(1 - eps) * t.w_row - (eps / lay.classes) * t.w_sum * t.valid
        grad = logp.exp().mul_(_unsq(-sum_a * g, lay))
        if eps > 0:
            gv = _unsq(g * t.valid * (eps / lay.classes), lay)
            grad.sub_(gv if t.w_local is None else gv * _w_view(t.w_local, lay, grad))
        if lay.local_classes:
            grad.scatter_add_(lay.class_dim, _unsq(t.local, lay),
                              _unsq(-(1 - eps) * t.w_row * g * t.held, lay))
        return grad, None, None, None


class _LogSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, lay):
        logp = _local_log_softmax(x, lay)
        ctx.lay = lay
        ctx.save_for_backward(logp)
        return logp

    @staticmethod
    def backward(ctx, g):
        (logp,) = ctx.saved_tensors
        lay = ctx.lay
        total = _all_reduce(g.sum(lay.class_dim), "sum", lay.group)
        return g - logp.exp() * _unsq(total, lay), None


class _NllLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logp, lay, t):
        ctx.lay, ctx.terms, ctx.shape = lay, t, logp.shape
        return -_picked(logp, lay, t.held, t.local) * t.w_row

    @staticmethod
    def backward(ctx, g):
        lay, t = ctx.lay, ctx.terms
        g = _valid_rows(g, t)
        grad = torch.zeros(ctx.shape, dtype=g.dtype, device=g.device)
        if lay.local_classes:
            grad.scatter_(lay.class_dim, _unsq(t.local, lay), _unsq(-t.w_row * g * t.held, lay))
        return grad, None, None


def _w_view(w_local, lay, like):
    shape = [1] * like.dim()
    shape[lay.class_dim] = w_local.numel()
    return w_local.view(shape)


def _class_dim(x):
    return 1 if x.dim() >= 2 else 0


def _reduce(lay, loss_local, w_row_local, reduction, what):
    loss = lay.rows_dtensor(loss_local)
    if reduction == "none":
        return loss
    replicate = [Replicate()] * lay.mesh.ndim
    total = loss.sum().redistribute(lay.mesh, replicate)
    if reduction == "sum":
        return total
    if reduction != "mean":
        raise ValueError(f"loss_parallel: {what}: unknown reduction {reduction!r}")
    denom = lay.rows_dtensor(w_row_local).sum().redistribute(lay.mesh, replicate)
    return total / denom


def _reduction(args):
    if args.get("size_average") is not None or args.get("reduce") is not None:
        from torch.nn import _reduction
        return _reduction.legacy_get_string(args.get("size_average"), args.get("reduce"))
    return args.get("reduction", "mean")


def _plain_weight(weight, lay, what):
    if weight is None:
        return None
    if isinstance(weight, DTensor):
        weight = weight.full_tensor()
    if tuple(weight.shape) != (lay.classes,):
        raise ValueError(f"loss_parallel: {what}'s weight has shape {list(weight.shape)}, "
                         f"expected [{lay.classes}] (one per class)")
    return weight.detach()


def _loss(bound, what):
    """cross_entropy or nll_loss on class-sharded input (None: not sharded on the class dim)."""
    a = bound.arguments
    x, target = a["input"], a["target"]
    lay = _Layout(x, _class_dim(x), what)
    if lay.mesh_dim is None:
        return None
    if target.dtype.is_floating_point:
        raise NotImplementedError(f"loss_parallel: {what} with class-probability targets "
                                  f"(a floating target) is not supported; pass class indices")
    weight = _plain_weight(a.get("weight"), lay, what)
    ignore_index = a.get("ignore_index", -100)
    tgt = lay.local_rows(target, what)
    terms = _target_terms(lay, tgt, weight, ignore_index, x.dtype)
    if what == "cross_entropy":
        eps = float(a.get("label_smoothing", 0.0))
        loss = _CrossEntropy.apply(x.to_local(), lay, terms, eps)
    else:
        loss = _NllLoss.apply(x.to_local(), lay, terms)
    return _reduce(lay, loss, terms.w_row, _reduction(a), what)


def _log_softmax(func, args, kwargs):
    """F.log_softmax(input, dim, _stacklevel, dtype), torch.log_softmax(input, dim, dtype) and
    Tensor.log_softmax(self, dim, dtype)."""
    names = ("input", "dim", "_stacklevel", "dtype") if func is F.log_softmax else \
        ("input", "dim", "dtype")
    a = dict(zip(names, args), **kwargs)
    x, dim, dtype = a.get("input", a.get("self")), a.get("dim"), a.get("dtype")
    if dim is None:
        return None
    if dtype is not None:
        x = x.to(dtype)
    lay = _Layout(x, dim % max(x.dim(), 1), "log_softmax")
    if lay.mesh_dim is None:
        return None
    # A fresh result, contiguous as torch's log_softmax returns it (whatever the input's
    # strides: a transposed input's piece would give its layout to the result).
    out = _LogSoftmax.apply(x.to_local(), lay).contiguous()
    return DTensor.from_local(out, lay.mesh, lay.placements, shape=x.shape,
                              stride=torch.empty(x.shape, device="meta").stride())


class _LossParallelMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = None
        first = args[0] if args else kwargs.get("input")
        if isinstance(first, DTensor):
            if func is F.cross_entropy:
                out = _loss(_bind(_CE_SIG, args, kwargs), "cross_entropy")
            elif func is F.nll_loss:
                out = _loss(_bind(_NLL_SIG, args, kwargs), "nll_loss")
            elif func in _LOG_SOFTMAX:
                out = _log_softmax(func, args, kwargs)
        return func(*args, **kwargs) if out is None else out


def _bind(sig, args, kwargs):
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    return bound


@contextlib.contextmanager
def loss_parallel():
    """``with loss_parallel():`` ``F.cross_entropy(logits, target)`` (or ``nn.CrossEntropyLoss``,
    ``F.log_softmax`` + ``F.nll_loss``) on logits sharded on the class dim, e.g. a
    ``ColwiseParallel(use_local_output=False)`` output, computes the loss without gathering the
    logits (NOTE [loss parallel]); gradients stay sharded. The target is class indices, plain
    (replicated) or distributed. Call ``loss.backward()`` inside the block too, as PyTorch asks.
    Plain tensors mixed with distributed ones inside the block are read as replicated."""
    with dtensor.replicate_plain_tensors(), _LossParallelMode():
        yield
