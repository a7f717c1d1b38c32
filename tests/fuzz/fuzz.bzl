"""fuzz_target: a libFuzzer target and the regression test that replays its seed corpus."""

def fuzz_target(name, srcs, deps = []):
    """One parser's fuzz target (NOTE [fuzz targets] in tests/fuzz/BUILD).

    Makes two targets from `srcs` (which define LLVMFuzzerTestOneInput):
      <name>: the libFuzzer binary. Built only by ./x fuzz / ./x test with clang and
        --config=fuzz (tagged manual, so `bazel build //...` with gcc never tries it).
      <name>_corpus_test: a cc_test that runs every file of corpus/<name>/ through the target
        once (replay_main.cc), in every normal and sanitizer build.
    """
    native.cc_binary(
        name = name,
        srcs = srcs,
        linkopts = ["-fsanitize=fuzzer"],
        tags = ["manual"],
        testonly = 1,
        deps = deps + [":fuzz_check"],
    )
    native.cc_test(
        name = name + "_corpus_test",
        srcs = srcs,
        args = ["tests/fuzz/corpus/" + name],
        data = native.glob(["corpus/" + name + "/**"]),
        deps = deps + [
            ":fuzz_check",
            ":replay_main",
        ],
    )
