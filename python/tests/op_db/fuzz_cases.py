"""Cases `./x fuzz ops` found (fuzz_ops.py): each a case seed, replayed by op_db_test.py in every
run (fuzz_ops.Case(seed) redraws the OpInfo, sample, mesh and placements from it). A seed goes in
with the fix of what it found, and the comment names it.
"""

FUZZ_CASES = {
    # seed: what it found (and the fix)
    2148284159839383: "_scaled_dot_product_attention with dropout on 2 thread ranks, q and v "
                      "S(1): each rank's fallback drew from the shared default generator "
                      "(dispatch_fallback.cc: every fallback op draws from the rank's generator)",
    2148284159839555: "the same on a 3x2 mesh, q [S(2),S(2)], k [R,S(1)], v [S(0),S(2)]",
    3559854946714361: "cov's aweights gradient, 0 in float64: one device and the engine differ by "
                      "float32 rounding only (NOTE [sweep tolerance])",
}
