"""Cases `./x fuzz ops` found (fuzz_ops.py): each a case seed, replayed by op_db_test.py in every
run (fuzz_ops.Case(seed) redraws the OpInfo, sample, mesh and placements from it). A seed goes in
with the fix of what it found, and the comment names it.
"""

FUZZ_CASES = {
    # seed: what it found (and the fix)
}
