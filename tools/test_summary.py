"""Summarises a `bazel test` run as test cases: prints per-target counts and a final line
"N passed, N failed". Usage: test_summary.py BAZEL_LOG TESTLOGS_DIR START_EPOCH [BAZEL_STATUS]

A target's cases come from its JUnit XML (gtest and pytest both write one). A target that failed
to build, or failed without fresh XML, counts as one failed case, so nothing broken goes unseen.
"""

import os
import re
import sys
import xml.etree.ElementTree as ET

STATUS = re.compile(r"^(//\S+)\s+(?:\(cached\) )?(PASSED|FAILED TO BUILD|FAILED|TIMEOUT|FLAKY|NO STATUS|SKIPPED)")


def count_cases(xml_path):
    passed = failed = skipped = 0
    root = ET.parse(xml_path).getroot()
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.find("skipped") is not None or case.get("result") == "skipped":
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped


def target_xmls(folder):
    """The target's JUnit XML: one file, or one per shard and run (shard_K_of_N/test.xml, NOTE
    [test shards] in python/tests/run_pytest.py; run_J_of_M/ with --runs_per_test, or both). A shard
    without its file makes the list empty (not fresh: counted as failed)."""
    shards = sorted(d for d in os.listdir(folder) if d.startswith(("shard_", "run_"))) \
        if os.path.isdir(folder) else []
    if shards:
        # Folders of an earlier shard_count (or run count) stay behind: keep the newest run's.
        newest = max(shards, key=lambda d: os.path.getmtime(os.path.join(folder, d)))
        kind = re.sub(r"\d+_of_", "K_of_", newest)
        shards = [d for d in shards if re.sub(r"\d+_of_", "K_of_", d) == kind]
        xmls = [os.path.join(folder, d, "test.xml") for d in shards]
        top = os.path.join(folder, "test.xml")
        # A target no longer sharded leaves its shard folders too: a newer top-level file wins.
        if not (os.path.exists(top) and all(os.path.exists(x) for x in xmls) and
                os.path.getmtime(top) > max(os.path.getmtime(x) for x in xmls)):
            return xmls if all(os.path.exists(x) for x in xmls) else []
    xml = os.path.join(folder, "test.xml")
    return [xml] if os.path.exists(xml) else []


def main():
    log_path, testlogs, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
    bazel_status = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    targets = {}
    with open(log_path, errors="replace") as f:
        for line in f:
            m = STATUS.match(line.strip())
            if m:
                targets[m.group(1)] = m.group(2)
    total_p = total_f = total_s = 0
    print("\nTest cases per target:")
    for target, status in sorted(targets.items()):
        pkg, name = target[2:].split(":")
        xmls = target_xmls(os.path.join(testlogs, pkg, name))
        fresh = bool(xmls) and all(
            status == "PASSED" or os.path.getmtime(x) >= start for x in xmls)
        if status in ("PASSED", "FAILED", "FLAKY", "TIMEOUT") and fresh:
            p = f_ = s = 0
            for x in xmls:
                counts = count_cases(x)
                p, f_, s = p + counts[0], f_ + counts[1], s + counts[2]
            if status != "PASSED" and f_ == 0:
                f_ = 1  # crashed or timed out after its cases passed
        else:
            p, f_, s = 0, 1, 0
        total_p, total_f, total_s = total_p + p, total_f + f_, total_s + s
        extra = f", {s} skipped" if s else ""
        print(f"  {target:<48} {status:<16} {p} passed, {f_} failed{extra}")
    if not targets:
        print("  (no test results: the build failed before any test ran)")
        total_f += 1
    elif bazel_status not in (0, 3) and total_f == 0:
        # 3 = tests failed (counted above); anything else is a build or infrastructure failure,
        # e.g. a non-test target that does not compile.
        print(f"  bazel exited with status {bazel_status}: a target failed to build")
        total_f += 1
    print(f"{len(targets)} test targets; {total_s} test cases skipped")
    print(f"{total_p} passed, {total_f} failed")
    return 0 if total_f == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
