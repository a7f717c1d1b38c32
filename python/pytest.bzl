"""pytest_test: a py_test that runs pytest (run_pytest.py) on one test file."""

def pytest_test(name, test, srcs = [], data = [], launches_ranks = False, **kwargs):
    """`test` is the test file. launches_ranks: the test starts processes with ./x launch's
    launcher (LAUNCH_PY) and must not share the machine with other tests (tag exclusive)."""
    env = {}
    tags = kwargs.pop("tags", [])
    if launches_ranks:
        data = data + ["//tools:launch.py"]
        env = {"LAUNCH_PY": "$(location //tools:launch.py)"}
        tags = tags + ["exclusive"]
    native.py_test(
        name = name,
        srcs = [test, "run_pytest.py"] + srcs,
        args = ["$(location %s)" % test],
        data = data,
        env = env,
        main = "run_pytest.py",
        python_version = "PY3",
        tags = tags,
        deps = [":dtensor_engine"],
        **kwargs
    )
