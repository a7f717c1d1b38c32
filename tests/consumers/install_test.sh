#!/usr/bin/env bash
# Consumer test without Bazel (NOTE [install] in ./x): `./x install` into a temporary prefix, then
# build tests/consumers/hello_dtensor.cc with plain g++ and `pkg-config --cflags --libs dtensor`
# against that copy, run it (2 ranks as threads: distributed matmul against one device,
# checkpoint save/load) and expect "OK". Last line: "consumers: install passed", or a message
# naming the failing step and a nonzero exit.
# Usage: tests/consumers/install_test.sh   (from anywhere; DTENSOR_KEEP_PREFIX=1 keeps the prefix)
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD

fail() {
  echo "consumers: install FAILED: $*" >&2
  exit 1
}

tmp=$(mktemp -d /tmp/dtensor_install_test.XXXXXX)
if [ "${DTENSOR_KEEP_PREFIX:-0}" != 1 ]; then
  trap 'rm -rf "$tmp"' EXIT
fi
prefix=$tmp/prefix

start=$(date +%s)
./x install "$prefix" || fail "./x install $prefix"
for f in include/dtensor/api.h include/checkpoint/checkpoint.h lib/libdtensor.so \
  lib/pkgconfig/dtensor.pc; do
  [ -f "$prefix/$f" ] || fail "./x install left no $prefix/$f"
done
# The library exports the public API (C++ names, demangled).
for sym in 'dtensor::api::distribute_tensor(' 'dtensor::checkpoint::save(' \
  'dtensor::collectives::run_threads('; do
  nm -DC --defined-only "$prefix/lib/libdtensor.so" | grep -F "$sym" >/dev/null ||
    fail "lib/libdtensor.so does not export $sym"
done

# Build outside the repository, so that nothing but the installed copy is found.
cp tests/consumers/hello_dtensor.cc "$tmp/"
cd "$tmp"
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
flags=$(pkg-config --cflags --libs dtensor) || fail "pkg-config does not find dtensor.pc"
echo "g++ hello_dtensor.cc -o hello_dtensor $flags"
# shellcheck disable=SC2086  # the flags are words
g++ -O1 hello_dtensor.cc -o hello_dtensor $flags || fail "g++ against the installed copy"
# Loaded from the prefix (rpath), not from the Bazel output tree.
ldd ./hello_dtensor | grep -F "$prefix/lib/libdtensor.so" >/dev/null ||
  fail "hello_dtensor does not load $prefix/lib/libdtensor.so: $(ldd ./hello_dtensor | grep dtensor)"
out=$(./hello_dtensor) || fail "hello_dtensor exited nonzero (output: $out)"
[ "$out" = OK ] || fail "hello_dtensor printed '$out', not OK"
echo "install, g++ and run: $(($(date +%s) - start)) s (repository $repo)"
echo "consumers: install passed"
