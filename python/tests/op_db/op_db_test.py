"""The op_db sweep as a project test (python/tests/op_db/sweep.py says what it runs and compares).

Every float32 CPU OpInfo of torch's op_db runs in every mode; the OpInfos are split into chunks
so the test log shows progress and each chunk fails on its own. A chunk fails when:
  - any OpInfo gives a wrong answer or hangs (never allowed, listed or not);
  - an OpInfo raises and is not listed in expected_failures.py;
  - a listed OpInfo passes (the list may only shrink: remove its entry).
  - fewer of its OpInfos than its entry of NATIVE_AT_LEAST pass on native rules alone (no op run
    by the replicate fallback): coverage by native rules may only grow (raise the floor with it).
The floor is per chunk, not one total, so that each chunk checks it alone: Bazel runs the test in
shards (NOTE [test shards] in python/tests/run_pytest.py), and no shard sees every chunk.
Each OpInfo's outcome is printed (pytest -s, or the test log).
The in-place variants (x.add_(y): the written self) follow the same rules with their own list,
INPLACE_EXPECTED_FAILURES; torch's foreach OpInfos (torch._foreach_* and their in-place forms,
what optimizers with foreach=True run) must all pass.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # sweep.py and its list
import sweep  # noqa: E402
from expected_failures import EXPECTED_FAILURES, INPLACE_EXPECTED_FAILURES  # noqa: E402
from fuzz_cases import FUZZ_CASES  # noqa: E402

CHUNKS = 12
# OpInfos of chunk k (op_db's float32 OpInfos k, k + CHUNKS, ...) that pass on native rules alone:
# torch 2.11, 2026-11-26, 533 in all (the floor: 520).
NATIVE_AT_LEAST = (47, 46, 43, 44, 44, 46, 44, 44, 44, 39, 46, 46)
_OPS = sweep.float32_opinfos()


def test_expected_failures_name_real_opinfos():
    names = {sweep.opinfo_name(op) for op in _OPS}
    from expected_failures import FULL_EXPECTED_FAILURES

    stale = sorted((set(EXPECTED_FAILURES) | set(FULL_EXPECTED_FAILURES)) - names)
    assert not stale, f"expected_failures.py names OpInfos that op_db has not: {stale}"
    both = sorted(set(EXPECTED_FAILURES) & set(FULL_EXPECTED_FAILURES))
    assert not both, f"listed in both tiers (keep the default tier's entry): {both}"
    assert all(reason.strip() for reason in FULL_EXPECTED_FAILURES.values())
    assert all(reason.strip() for reason in EXPECTED_FAILURES.values()), "every entry needs a reason"


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_op_db_chunk(chunk, capsys):
    problems = []
    native_count = 0
    for op in _OPS[chunk::CHUNKS]:
        name = sweep.opinfo_name(op)
        outcome, detail = sweep.sweep_one(op)
        listed = name in EXPECTED_FAILURES
        fallbacks = sweep.fallback_ops()
        native = "native " if outcome == "pass" and not fallbacks else ""
        native_count += bool(native)
        with capsys.disabled():
            print(f"op_db {outcome:6s} {native}{name:40s} {'(listed) ' if listed else ''}"
                  f"{detail[:240]}{' (fallback: ' + ','.join(fallbacks) + ')' if fallbacks else ''}")
        if outcome in ("wrong", "hang"):
            problems.append(f"{name}: {outcome}: {detail}")
        elif outcome != "pass" and not listed:
            problems.append(f"{name}: {outcome} and not in expected_failures.py: {detail}")
        elif outcome == "pass" and listed:
            problems.append(f"{name}: passes now; remove its entry from expected_failures.py")
    print(f"op_db chunk {chunk}: {native_count} OpInfos pass on native rules alone "
          f"(floor {NATIVE_AT_LEAST[chunk]})")
    if native_count < NATIVE_AT_LEAST[chunk]:
        problems.append(f"chunk {chunk}: {native_count} OpInfos pass on native rules alone, fewer "
                        f"than {NATIVE_AT_LEAST[chunk]}: an op lost its rule (its OpInfo now "
                        "prints 'pass ... (fallback: ...)')")
    assert not problems, "\n".join(problems)


def test_native_floor_covers_every_chunk():
    assert len(NATIVE_AT_LEAST) == CHUNKS and sum(NATIVE_AT_LEAST) >= 520  # the floor


def _problems(name, outcome, detail, listed):
    if outcome in ("wrong", "hang"):
        return [f"{name}: {outcome}: {detail}"]
    if outcome not in ("pass", "skip") and not listed:
        return [f"{name}: {outcome} and not in the expected failures: {detail}"]
    if outcome == "pass" and listed:
        return [f"{name}: passes now; remove its entry from the expected failures"]
    return []


def test_inplace_variants(capsys):
    stale = sorted(set(INPLACE_EXPECTED_FAILURES) - {sweep.opinfo_name(op) for op in _OPS})
    assert not stale, f"INPLACE_EXPECTED_FAILURES names OpInfos that op_db has not: {stale}"
    problems = []
    for op in _OPS:
        name = sweep.opinfo_name(op)
        outcome, detail = sweep.sweep_inplace_one(op)
        if outcome == "skip":
            continue
        listed = name in INPLACE_EXPECTED_FAILURES
        with capsys.disabled():
            print(f"op_db in-place {outcome:6s} {name:40s} {'(listed) ' if listed else ''}"
                  f"{detail[:200]}")
        problems += _problems(name, outcome, detail, listed)
    assert not problems, "\n".join(problems)


def test_foreach_ops(capsys):
    cases = sweep.foreach_cases()
    assert len(cases) >= 30, "torch's foreach OpInfos went missing"
    problems = []
    for case in cases:
        outcome, detail = sweep.sweep_foreach(case)
        with capsys.disabled():
            print(f"op_db foreach {outcome:6s} {case.name:40s} {detail[:200]}")
        problems += _problems(case.name, outcome, detail, False)
    assert not problems, "\n".join(problems)


def test_fuzz_cases():
    """What `./x fuzz ops` found (fuzz_cases.py), replayed: never wrong, never a hang."""
    import fuzz_ops

    problems = []
    for seed, what in FUZZ_CASES.items():
        case, kind, detail = fuzz_ops.run_case(seed)
        print(f"op_db fuzz case {seed}: {kind} {getattr(case, 'where', case.name)} ({what})")
        if kind in ("wrong", "hang"):
            problems.append(f"fuzz case {seed} ({what}): {kind}: {detail}")
    assert not problems, "\n".join(problems)


def test_istft_window_gradient_matches_finite_differences():
    """sweep.ONE_DEVICE_DROPS_GRAD: torch 1.13's istft gave `window` no gradient on its
    real-input path; the engine's gradient must equal the finite-difference one (torch 2.x takes
    the complex input only)."""
    import torch

    import dtensor
    from dtensor import Replicate, Shard, distribute_tensor, init_device_mesh

    torch.manual_seed(0)
    x, w = torch.view_as_complex(torch.randn(10, 5, 6, 2)), torch.rand(8) + 0.5
    f = lambda ww: torch.istft(x, n_fft=8, window=ww, center=True).sum()  # noqa: E731
    eps = 1e-3
    eye = torch.eye(8)
    fd = torch.stack([(f(w + eps * eye[i]) - f(w - eps * eye[i])) / (2 * eps) for i in range(8)])

    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        dx = distribute_tensor(x, mesh, [Shard(0)])
        dw = distribute_tensor(w, mesh, [Replicate()]).requires_grad_()
        out = torch.istft(dx, n_fft=8, window=dw, center=True)
        g, = torch.autograd.grad(out.sum(), [dw])
        return g.full_tensor()

    for g in dtensor.run_threads(2, fn):
        torch.testing.assert_close(g, fd, atol=5e-3, rtol=5e-3)


def test_dim_ops_on_a_zero_dim_tensor():
    """ATen wraps a 0-dim tensor's dim 0 or -1 (softmax, log_softmax of a scalar); the engine
    refused them ("dim 0 is out of range for a 0-D tensor"), found by the full sweep."""
    import torch

    import dtensor
    from dtensor import Replicate, distribute_tensor, init_device_mesh

    x = torch.tensor(0.3)

    def fn(rank):
        mesh = init_device_mesh("cpu", (2,))
        d = distribute_tensor(x, mesh, [Replicate()])
        for dim in (0, -1):
            torch.testing.assert_close(torch.softmax(d, dim).full_tensor(), torch.softmax(x, dim))
            torch.testing.assert_close(torch.log_softmax(d, dim).full_tensor(),
                                       torch.log_softmax(x, dim))
        return True

    assert dtensor.run_threads(2, fn) == [True, True]
