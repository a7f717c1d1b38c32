"""Runs pytest on the test files named on the command line, writing JUnit XML where Bazel asks."""

import os
import sys

# Python puts the symlink-resolved folder of this script (python/tests/ in the source tree) first
# on sys.path: drop it, and put this script's folder in the runfiles there instead, so that the
# tests import their helpers (launch_ranks.py, fsdp_testing.py) from the runfiles as they import
# the package (with its built extension).
_here = os.path.dirname(os.path.realpath(__file__))
sys.path = [p for p in sys.path if os.path.realpath(p or ".") != _here]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pytest  # noqa: E402


class _BazelShard:
    """NOTE [test shards]: Bazel's test sharding (shard_count in BUILD): shard i of n runs the
    collected cases whose position is i modulo n, so the cases of one long test file run in n
    processes at once (a case that waits for a timeout no longer holds up the others). Bazel
    sets TEST_SHARD_INDEX and TEST_TOTAL_SHARDS and asks for TEST_SHARD_STATUS_FILE to be
    touched by a runner that shards."""

    def __init__(self, index, total):
        self.index, self.total = index, total

    def pytest_collection_modifyitems(self, config, items):
        keep = [it for k, it in enumerate(items) if k % self.total == self.index]
        drop = [it for k, it in enumerate(items) if k % self.total != self.index]
        if drop:
            config.hook.pytest_deselected(items=drop)
        items[:] = keep


if __name__ == "__main__":
    # importlib mode: pytest must not put the (symlink-resolved) source folder on sys.path, or it
    # would import the package from the source tree, without its built extension.
    args = ["-q", "-p", "no:cacheprovider", "--import-mode=importlib"] + sys.argv[1:]
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        args.append("--junitxml=" + xml)
    plugins = []
    total = int(os.environ.get("TEST_TOTAL_SHARDS", "1"))
    if total > 1:
        status = os.environ.get("TEST_SHARD_STATUS_FILE")
        if status:
            open(status, "a").close()
        plugins.append(_BazelShard(int(os.environ["TEST_SHARD_INDEX"]), total))
    code = pytest.main(args, plugins=plugins)
    # A shard whose every case was deselected ran nothing, which is no failure (exit code 5).
    sys.exit(0 if code == 5 and total > 1 else code)
