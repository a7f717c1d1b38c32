#!/bin/bash
# Fills .gpu/ (git-ignored) with what tools/gpu/check.sh needs on the device machine and cannot
# find there: Abseil's headers and shared libraries and GoogleTest's sources, from this machine's
# Debian packages (libabsl-dev, googletest). Run here, in the repository root; then name ".gpu" in
# the device run's carry. NOTE [GPU check] in tools/gpu/check.sh.
set -eu
cd "$(dirname "$0")/../.."
rm -rf .gpu
mkdir -p .gpu/include .gpu/lib
cp -r /usr/include/absl .gpu/include/
# Each library under its SONAME (what the others' DT_NEEDED entries name).
for f in /usr/lib/x86_64-linux-gnu/libabsl_*.so; do
  soname=$(objdump -p "$f" | awk '/SONAME/ {print $2}')
  cp -L "$f" ".gpu/lib/$soname"
done
cp -r /usr/src/googletest/googletest .gpu/googletest
# The engine's other header-only dependencies: nlohmann-json (checkpoint), zlib's headers.
cp -r /usr/include/nlohmann .gpu/include/
cp /usr/include/zlib.h /usr/include/zconf.h .gpu/include/
# PyPI's expecttest (torch's op database imports it; the device machine has no registry).
mkdir -p .gpu/python
cp -r "$(.venv/bin/python3 -c 'import expecttest, os; print(os.path.dirname(expecttest.__file__))')" \
  .gpu/python/
# Tiny random Hugging Face models and transformers' logits for them (the hf stage; the device
# machine has no transformers).
PYTHONPATH= .venv/bin/python3 tools/gpu/hf_reference.py .gpu/hf >/dev/null 2>&1
du -sh .gpu
