"""A stand-in for the `expecttest` package, which torch's test utilities import and Debian does not
ship (no PyPI here). torch.testing._internal.common_utils needs only these two names to import;
the op_db sweep never calls assertExpectedInline."""

import unittest

ACCEPT = False  # expecttest's "rewrite expected outputs" switch; common_utils reads and sets it


class TestCase(unittest.TestCase):
    def assertExpectedInline(self, actual, expect, skip=0):  # noqa: N802  (expecttest's name)
        self.assertEqual(actual, expect)
