"""Running one mode of a sample and checking it against one device (values within NOTE [sweep
tolerance], shapes, dtypes, each rank's piece), and Outcome, the worst over an OpInfo's samples
and modes."""

import torch
from torch.utils._pytree import tree_flatten, tree_map

from dtensor import DTensor
from sweep_modes import _distribute, _is_tensor, _mode_mesh
from sweep_ranks import Failure, _run_on_ranks
from sweep_seeding import _op_seed

RTOL, ATOL = 1e-4, 1e-4
# NOTE [sweep tolerance]: a sharded reduction sums in another order than one device (partial sums,
# then the all-reduce), so an element that is a small difference of large terms differs by a few
# ulps of the terms, not of the element (seen: linalg.multi_dot's gradient, 4.9e-4 off in an
# element near 0 where the problem's values reach 7900; cov's aweights gradient, 2e-13 in float64,
# 2e-4 on one device and -4e-4 here, with values near 40: both float32 results are rounding
# noise). Each comparison therefore also allows SCALE_TOL times the problem's scale: the largest
# magnitude among the sample's tensors, the expected outputs and the tensor compared. A wrong
# sharding errs by the size of the values themselves, four orders of magnitude above.
SCALE_TOL = 5e-5
_problem_scale = [0.0]  # set by run_mode for the mode being checked


def _scale(t):
    """The largest finite magnitude in `t` (0 for empty, integer or boolean tensors)."""
    if t.layout != torch.strided or t.numel() == 0 or not (t.is_floating_point() or t.is_complex()):
        return 0.0  # sparse layouts (SparseCUDA lacks the ops below) count as no scale
    try:
        a = t.detach().abs()
        a = a[torch.isfinite(a)]
        return float(a.max()) if a.numel() else 0.0
    except (RuntimeError, NotImplementedError):
        return 0.0


# OpInfos whose values are undefined on one device too (uninitialised memory): only metadata is
# compared.
UNDEFINED_VALUES = {
    "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided",
    "nn.functional.dropout", "nn.functional.dropout2d", "nn.functional.dropout3d",
    "nn.functional.alpha_dropout", "nn.functional.feature_alpha_dropout",
}


# OpInfos whose one-device gradient is missing (None) where the engine computes one: torch's own
# kernel drops it. Each entry's test checks the engine's gradient against finite differences.
ONE_DEVICE_DROPS_GRAD = {
    "istft": "torch 1.13's istft returns no gradient for `window` on its real-input path, though "
             "the output depends on it; the engine's gradient equals finite differences "
             "(op_db_test.py::test_istft_window_gradient_matches_finite_differences)",
}


# Outputs whose values are undefined on one device too, by OpInfo and flattened output index:
# only their metadata is compared.
UNDEFINED_OUTPUTS = {
    # philox seed and offset: uninitialized memory when dropout_p = 0 (seen on an H200, torch
    # 2.11: "Expected 139832893539328 but got 1753284119").
    "torch.ops.aten._efficient_attention_forward": {2, 3},
}


def opinfo_name(op):
    return op.name + ("." + op.variant_test_name if op.variant_test_name else "")


def _name_of(op):
    """The OpInfo name of `op`, or "" for a bare callable (the foreach cases pass one)."""
    return opinfo_name(op) if hasattr(op, "variant_test_name") else ""


def _local_shape(shape, mesh_shape, placements, coord):
    """The piece shape a rank at `coord` holds (torch.chunk semantics, as PyTorch's Shard)."""
    shape = list(shape)
    for mdim, p in enumerate(placements):
        if p.is_shard():
            d = p.dim if p.dim >= 0 else p.dim + len(shape)
            n = mesh_shape[mdim]
            size = shape[d]
            chunk = -(-size // n) if size else 0
            start = min(chunk * coord[mdim], size)
            shape[d] = max(0, min(start + chunk, size) - start)
    return tuple(shape)


def _describe(x):
    if _is_tensor(x):
        return f"{x.dtype}{list(x.shape)}"
    return repr(x)


def _float_outputs(out):
    return [t for t in tree_flatten(out)[0]
            if _is_tensor(t) and (t.is_floating_point() or t.is_complex()) and t.requires_grad]


def _check(what, got, want, mesh, compare_values, rank):
    """Compares one output leaf; raises Failure("wrong", ...)."""
    if _is_tensor(want):
        if not _is_tensor(got):
            raise Failure("wrong", f"{what}: got {_describe(got)}, one device gives {_describe(want)}")
        if isinstance(got, DTensor):
            placements = tuple(got.placements)
            local = got.to_local()
            coord = mesh.get_coordinate() if hasattr(mesh, "get_coordinate") else None
            if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
                raise Failure("wrong", f"{what}: DTensor says {got.dtype}{list(got.shape)} "
                                       f"{list(placements)}, one device gives {_describe(want)}")
            if local.device.type != want.device.type:
                raise Failure("wrong", f"{what}: rank {rank}'s piece lives on {local.device}, "
                                       f"one device gives {want.device}")
            if local.dtype != want.dtype:
                raise Failure("wrong", f"{what}: rank {rank}'s piece is {local.dtype}, the "
                                       f"DTensor says {got.dtype}")
            if coord is not None and not any(p.is_partial() for p in placements):
                exp = _local_shape(want.shape, tuple(mesh.shape), placements, coord)
                if tuple(local.shape) != exp:
                    raise Failure("wrong", f"{what}: rank {rank}'s piece is {list(local.shape)}, "
                                           f"{list(placements)} of {list(want.shape)} gives "
                                           f"{list(exp)}")
            got = got.full_tensor()
        if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
            raise Failure("wrong", f"{what}: got {_describe(got)}, one device gives {_describe(want)}")
        if compare_values:
            try:
                torch.testing.assert_close(got.detach(), want.detach(), rtol=RTOL,
                                           atol=ATOL + SCALE_TOL * max(_scale(want),
                                                                       _problem_scale[0]),
                                           equal_nan=True, check_stride=False)
            except AssertionError as e:
                raise Failure("wrong", f"{what}: values differ: {str(e).splitlines()[0:3]}")
        return
    if isinstance(want, (bool, int, float, complex)) or want is None:
        if isinstance(got, torch.Tensor):
            got = got.full_tensor().item() if isinstance(got, DTensor) else got.item()
        same = (got == want) or (isinstance(want, float) and got != got and want != want)
        if not same and isinstance(want, float) and isinstance(got, float):
            same = abs(got - want) <= ATOL + RTOL * abs(want)
        if not same:
            raise Failure("wrong", f"{what}: got {got!r}, one device gives {want!r}")


def _expected(op, sample, backward):
    """One device's outputs and gradients. NOTE [fresh leaves]: with ``backward`` the op runs on
    fresh leaves (``detach().requires_grad_()``) of the sample's tensors that require grad, as the
    engine's run does (_distribute): the sample's own tensors may be views or reused across
    samples, and one device's autograd then gave no gradient at all where the output depends on
    them (_efficient_attention_forward on an H100, torch 2.11: None for query, key and value;
    a leaf copy of the query got one). Values and strides are the sample's (detach shares
    storage); gradients come back in the sample's flattened order."""
    inp, args, kwargs = sample.input, sample.args, sample.kwargs
    if backward:
        fresh = lambda t: (t.detach().requires_grad_()  # noqa: E731
                           if _is_tensor(t) and t.requires_grad and t.is_floating_point() else t)
        inp, args, kwargs = tree_map(fresh, (inp, args, kwargs))
    torch.manual_seed(_op_seed[0])
    out = op(inp, *args, **kwargs)
    grads = None
    if backward:
        leaves = [t for t in tree_flatten((inp, args, kwargs))[0]
                  if _is_tensor(t) and t.requires_grad and t.is_floating_point()]
        outs = _float_outputs(out)
        if leaves and outs:
            loss = sum(o.sum() for o in outs)
            grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return out, grads


def run_mode(op, sample, mode, want, want_grads, compare_values):
    """Runs one mode on WORLD ranks as threads; raises Failure."""
    world = 1
    for s in mode.mesh_shape:
        world *= s

    _problem_scale[0] = max([_scale(t) for t in tree_flatten(
        (sample.input, sample.args, sample.kwargs, want))[0] if _is_tensor(t)] or [0.0])

    def fn(rank):
        mesh = _mode_mesh(mode)
        backward = want_grads is not None
        inp, args, kwargs, leaves = _distribute(sample, mode, mesh, backward)
        torch.manual_seed(_op_seed[0])
        got = op(inp, *args, **kwargs)
        g_leaves, w_leaves = tree_flatten(got)[0], tree_flatten(want)[0]
        if len(g_leaves) != len(w_leaves):
            raise Failure("wrong", f"{len(g_leaves)} outputs, one device gives {len(w_leaves)}")
        undefined = UNDEFINED_OUTPUTS.get(_name_of(op), ())
        for i, (g, w) in enumerate(zip(g_leaves, w_leaves)):
            _check(f"output {i}", g, w, mesh, compare_values and i not in undefined, rank)
        if backward:
            outs = _float_outputs(got)
            if outs and leaves:
                loss = sum(o.sum() for o in outs)
                grads = torch.autograd.grad(loss, [dt for _, dt in leaves], allow_unused=True)
                want_by_leaf = dict(zip(
                    [id(t) for t in tree_flatten((sample.input, sample.args, sample.kwargs))[0]
                     if _is_tensor(t) and t.requires_grad and t.is_floating_point()],
                    want_grads))
                for k, ((x, _), g) in enumerate(zip(leaves, grads)):
                    w = want_by_leaf.get(id(x))
                    if w is None or g is None:
                        if w is None and _name_of(op) in ONE_DEVICE_DROPS_GRAD:
                            continue
                        if (w is None) != (g is None):
                            raise Failure("wrong", f"grad {k}: got {_describe(g)}, one device "
                                                   f"gives {_describe(w)}")
                        continue
                    _check(f"grad {k}", g, w, mesh, compare_values, rank)
        return True

    _run_on_ranks(world, fn)


class Outcome:
    """The worst result over an OpInfo's samples and modes: pass < error < hang < wrong."""

    RANK = {"pass": 0, "error": 1, "hang": 2, "wrong": 3}

    def __init__(self):
        self.kind, self.detail = "pass", ""

    def add(self, kind, detail):
        if self.RANK[kind] > self.RANK[self.kind]:
            self.kind, self.detail = kind, detail

    def attempt(self, label, run):
        """Runs one mode, recording a Failure; True when the OpInfo's sweep must stop there."""
        try:
            run()
        except Failure as f:
            self.add(f.kind, f"{label}: {f}")
        return self.kind in ("wrong", "hang")

    def result(self):
        return self.kind, self.detail
