#!/usr/bin/env bash
# Consumer test with Bazel: a tiny workspace of its own (tests/consumers/external_workspace/,
# copied to a temporary directory) declares this repository with local_repository, calls
# dtensor_dependencies() from //:deps.bzl, and builds and runs tests/consumers/hello_dtensor.cc
# as a cc_binary depending on @dtensor//:dtensor (NOTE [public library] in //:BUILD). It expects
# "OK". The nested Bazel has an output base of its own (temporary, shut down at the end) and
# shares ./x's disk cache, so only its first run compiles the engine (the actions of an external
# repository differ from the main workspace's). Last line: "consumers: external_workspace passed",
# or a message naming the failing step and a nonzero exit.
# Usage: tests/consumers/external_workspace_test.sh   (from anywhere)
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
disk_cache="${DTENSOR_DISK_CACHE:-${HOME:-/tmp}/.cache/dtensor-bazel-disk}"

fail() {
  echo "consumers: external_workspace FAILED: $*" >&2
  exit 1
}

tmp=$(mktemp -d /tmp/dtensor_external_workspace_test.XXXXXX)
ws=$tmp/workspace
output_base=$tmp/output_base
nested() {
  bazel --output_base="$output_base" --max_idle_secs=60 "$@"
}
cleanup() {
  nested shutdown >/dev/null 2>&1 || true
  # The output base holds read-only files.
  chmod -R u+w "$tmp" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

mkdir -p "$ws" "$disk_cache"
sed "s|@DTENSOR_PATH@|$repo|" tests/consumers/external_workspace/WORKSPACE.in >"$ws/WORKSPACE"
cp tests/consumers/external_workspace/BUILD.in "$ws/BUILD"
cp tests/consumers/external_workspace/bazelrc "$ws/.bazelrc"
cp tests/consumers/hello_dtensor.cc "$ws/"

cd "$ws"
start=$(date +%s)
ci_flags=()
[ "${CI:-}" = "true" ] && ci_flags=(--color=no --curses=no --show_progress_rate_limit=30)
nested build "${ci_flags[@]}" --disk_cache="$disk_cache" //:hello_dtensor ||
  fail "bazel build //:hello_dtensor in the consumer workspace $ws"
built=$(($(date +%s) - start))
out=$(./bazel-bin/hello_dtensor) || fail "hello_dtensor exited nonzero (output: $out)"
[ "$out" = OK ] || fail "hello_dtensor printed '$out', not OK"
echo "consumer workspace: build $built s (new output base, disk cache $disk_cache), run OK"
echo "consumers: external_workspace passed"
