"""The full op_db sweep (`./x test --full` and CI run it, `./x test` does not): every
sample of every float32 OpInfo, every tensor argument sharded in turn on every dim, on a 1-D mesh
of 4 ranks and a 2x2 mesh (sweep.full_modes_for), samples drawn from a seed that changes per run
(NOTE [sweep seed]): the seed is printed first and in every failure; replay one with
`DTENSOR_SWEEP_SEED=S ./x run python/tests/op_db/sweep.py --full --ops NAME`.

A chunk fails on any wrong answer or hang. An OpInfo that raises in the full sweep must be listed,
with its reason, whatever sample raised: in the default tier's EXPECTED_FAILURES or in
FULL_EXPECTED_FAILURES (expected_failures.py), for OpInfos whose first three samples pass. Each OpInfo gets at most BUDGET_S seconds (it stops at a sample boundary,
says so, and counts as far as it ran), so the whole sweep stays inside CI's time.
"""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sweep  # noqa: E402
from expected_failures import EXPECTED_FAILURES, FULL_EXPECTED_FAILURES  # noqa: E402

CHUNKS = 8
BUDGET_S = float(os.environ.get("DTENSOR_SWEEP_BUDGET_S", "4"))
SEED = sweep.run_seed()
_OPS = sweep.float32_opinfos()


def test_seed():
    print(f"op_db full sweep: seed {SEED} (replay with DTENSOR_SWEEP_SEED={SEED})")


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_op_db_full_chunk(chunk, capsys):
    problems = []
    for op in _OPS[chunk::CHUNKS]:
        name = sweep.opinfo_name(op)
        outcome, detail = sweep.sweep_full_one(op, SEED, budget_s=BUDGET_S)
        listed = name in EXPECTED_FAILURES or name in FULL_EXPECTED_FAILURES
        with capsys.disabled():
            print(f"op_db full {outcome:6s} {name:40s} {'(listed) ' if listed else ''}"
                  f"{detail[:300]}")
        if outcome in ("wrong", "hang"):
            problems.append(f"{name}: {outcome}: {detail}")
        elif outcome not in ("pass", "skip") and not listed:
            problems.append(f"{name}: {outcome} (seed {SEED}) and not listed in expected_failures.py: "
                            f"{detail}")
    assert not problems, "\n".join(problems)
