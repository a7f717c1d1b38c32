"""pytest_test: a py_test that runs pytest (run_pytest.py) on one test file."""

def pytest_test(name, test, srcs = [], data = [], launches_ranks = False, pytest_args = [],
                **kwargs):
    """`test` is the test file. launches_ranks: the test starts processes with ./x launch's
    launcher (LAUNCH_PY). Such tests share the machine with other tests (every job has its own
    port, shm segments and store, and bounds measured inside the ranks hold on a loaded machine);
    a test whose bound is wall time across process starts says so with the tag "exclusive". shard_count (Bazel's) splits the file's cases over that many processes
    (NOTE [test shards] in run_pytest.py). pytest_args: more pytest arguments (e.g. "-k" to run
    some of the file's cases in one target and the rest in another).

    The test imports the package from its runfiles: //python:dtensor's `imports = ["."]` puts
    <runfiles>/<workspace>/python on sys.path, where dtensor/_C.so lies beside the .py files (the
    layout `./x pythonpath` stages in out/python). Nothing looks into bazel-bin."""
    env = dict(kwargs.pop("env", {}))
    tags = kwargs.pop("tags", [])
    if launches_ranks:
        data = data + ["//tools:launch.py", "//tools:shm_clean.py"]
        env["LAUNCH_PY"] = "$(location //tools:launch.py)"
        # Ranks forked from a launcher that imported torch once (NOTE [preloaded ranks] in
        # tools/launch.py): torch's import was ~70% of the suite's CPU. launch_test checks that
        # such ranks see what exec'd ones see.
        env.setdefault("DTENSOR_LAUNCH_PRELOAD", "1")
    native.py_test(
        name = name,
        srcs = [test, "//python/tests:run_pytest.py"] + srcs,
        args = ["$(location %s)" % test] + pytest_args,
        data = data,
        env = env,
        main = "//python/tests:run_pytest.py",
        python_version = "PY3",
        tags = tags,
        deps = ["//python:dtensor"],
        **kwargs
    )
