"""Runs pytest on the test files named on the command line, writing JUnit XML where Bazel asks."""

import os
import sys

# Python puts the symlink-resolved folder of this script (the source tree) first on sys.path;
# the package there has no built extension, so drop it and use the runfiles copy instead.
_here = os.path.dirname(os.path.realpath(__file__))
sys.path = [p for p in sys.path if os.path.realpath(p or ".") != _here]

import pytest  # noqa: E402

if __name__ == "__main__":
    # importlib mode: pytest must not put the (symlink-resolved) source folder on sys.path, or it
    # would import the package from the source tree, without its built extension.
    args = ["-q", "-p", "no:cacheprovider", "--import-mode=importlib"] + sys.argv[1:]
    xml = os.environ.get("XML_OUTPUT_FILE")
    if xml:
        args.append("--junitxml=" + xml)
    sys.exit(pytest.main(args))
