"""In-place variants (the written self must hold one device's values: run_inplace_mode,
_sweep_inplace) and torch's foreach ops (ForeachCase, foreach_cases, sweep_foreach)."""

import torch
from torch.utils._pytree import tree_flatten, tree_map

import dtensor
import sweep_check  # run_mode and _check, looked up at each call (op_db_procs_test patches them)
from sweep_check import Outcome
from sweep_modes import _Target, _distribute, _is_tensor, _mode_mesh, _runnable, modes_for
from sweep_ranks import _run_on_ranks
from sweep_seeding import SEED, SampleInput


def _clone_args(sample):
    clone = lambda t: t.detach().clone() if _is_tensor(t) else t  # noqa: E731
    return tree_map(clone, sample.input), tree_map(clone, sample.args), tree_map(clone,
                                                                                 sample.kwargs)


def _inplace_expected(fn, sample):
    """The in-place variant's written self on one device, or None when one device refuses it."""
    inp, args, kwargs = _clone_args(sample)

    def run():
        torch.manual_seed(SEED)
        fn(inp, *args, **kwargs)

    try:
        run()
    except Exception:  # noqa: BLE001
        return None
    return inp


def run_inplace_mode(fn, sample, mode, want_self, compare_values):
    """The in-place variant on distributed arguments: the written self (each element of a list)
    must hold one device's values. Raises Failure."""
    world = 1
    for s in mode.mesh_shape:
        world *= s

    def body(rank):
        mesh = _mode_mesh(mode)
        inp, args, kwargs = _clone_args(sample)
        inp, args, kwargs, _ = _distribute(SampleInput(inp, args=args, kwargs=kwargs), mode,
                                           mesh, False)
        torch.manual_seed(SEED)
        fn(inp, *args, **kwargs)
        for i, (g, w) in enumerate(zip(tree_flatten(inp)[0], tree_flatten(want_self)[0])):
            sweep_check._check(f"self {i} after the in-place variant", g, w, mesh, compare_values,
                               rank)
        return True

    _run_on_ranks(world, body)


def _sweep_inplace(fn, sample_list, compare_values):
    """(outcome, detail) of the in-place variant ``fn`` over the samples one device accepts."""
    out = Outcome()
    for si, sample in enumerate(sample_list):
        if not any(_is_tensor(t) for t in tree_flatten(sample.input)[0]):
            continue
        want_self = _inplace_expected(fn, sample)
        if want_self is None:
            continue
        for mode in _runnable(modes_for(sample, si == 0)):
            if out.attempt(f"in-place sample {si} mode {mode.name}",
                           lambda: run_inplace_mode(fn, sample, mode, want_self, compare_values)):
                return out.result()
    return out.result()


# ---- the _foreach_* ops (torch's foreach OpInfos) -----------------------------------------------
# torch 1.13's ForeachFuncInfo samples are bare tensor lists; the arguments of each family are
# built here as torch's test_foreach does: a second list, a scalar or a scalar list (binary), two
# lists and a value (pointwise), an ord (norm). Values lie in [0.5, 1.5) (no zero divisors).

class ForeachCase:
    def __init__(self, info, samples):
        self.info = info
        self.name = info.name
        self.variant_test_name = ""
        self.samples = samples


def _foreach_lists(seed, count=3):
    g = torch.Generator().manual_seed(seed)
    shapes = [(5, 4), (3,), (6, 2)][:count]
    return [(torch.rand(s, generator=g) + 0.5).to(_Target.device) for s in shapes]


def foreach_cases():
    from torch.testing._internal import common_methods_invocations as cmi
    cases = []
    x = lambda: _foreach_lists(1)  # noqa: E731
    y = lambda: _foreach_lists(2)  # noqa: E731
    z = lambda: _foreach_lists(3)  # noqa: E731
    for info in cmi.foreach_unary_op_db:
        cases.append(ForeachCase(info, [SampleInput(x())]))
    for info in cmi.foreach_binary_op_db:
        cases.append(ForeachCase(info, [SampleInput(x(), args=(y(),)),
                                        SampleInput(x(), args=(1.5,)),
                                        SampleInput(x(), args=([0.5, 2.0, -1.0],))]))
    for info in cmi.foreach_pointwise_op_db:
        cases.append(ForeachCase(info, [SampleInput(x(), args=(y(), z()), kwargs={"value": 0.5}),
                                        SampleInput(x(), args=(y(), z(), [0.5, 2.0, -1.0]))]))
    for info in getattr(cmi, "foreach_minmax_op_db", []):  # folded into the others in torch 2.x
        cases.append(ForeachCase(info, [SampleInput(x(), args=(y(),))]))
    for info in getattr(cmi, "foreach_reduce_op_db", []):
        cases.append(ForeachCase(info, [SampleInput(x(), args=(2,))]))
    return cases


def sweep_foreach(case):
    """(outcome, detail) for one foreach op: its out-of-place and in-place variants."""
    dtensor.debug.reset_fallback_counts()
    out = Outcome()
    for si, sample in enumerate(case.samples):
        try:
            want = case.info.op(*_clone_args(sample)[:1], *sample.args, **sample.kwargs)
        except Exception:  # noqa: BLE001
            continue
        for mode in _runnable(modes_for(sample, si == 0)):
            if out.attempt(f"sample {si} mode {mode.name}",
                           lambda: sweep_check.run_mode(case.info.op, sample, mode, want, None,
                                                        True)):
                return out.result()
    if case.info.inplace_variant is not None:
        out.add(*_sweep_inplace(case.info.inplace_variant, case.samples, True))
    return out.result()
