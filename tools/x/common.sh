# shellcheck shell=bash
# ./x's shared part: Debian and PyPI packages, the Bazel flags and output bases, building and
# staging the Python package. Sourced by ./x (NOTE [x layout] there).

# Debian packages the build and tests need (README.md); torch,
# pybind11, pytest and the other Python packages come from PyPI (tools/requirements.txt, NOTE
# [venv]). libgloo-dev: Gloo's headers for the c10d backend (NOTE [Gloo headers]).
PACKAGES=(
  bazel-bootstrap bazel-rules-java bazel-platforms bazel-skylib
  libabsl-dev python3-dev python3-venv
  libgtest-dev googletest libbenchmark-dev libgloo-dev nlohmann-json3-dev zlib1g-dev libcpp-httplib-dev
  libopenblas0-pthread
)
# DTENSOR_TORCH=debian (NOTE [venv]): Debian's torch 1.13 and what its build takes from Debian.
DEBIAN_TORCH_PACKAGES=(libtorch-dev python3-torch pybind11-dev python3-pytest)
# NOTE [BLAS]: Debian's libtorch calls the BLAS through the libblas.so.3 alternative. The reference
# BLAS it falls back to computes a GEMM as slowly as GEMVs row by row (a decode step of 8
# sequences cost 8 single ones: 164 vs 21 ms on the bench's large model); OpenBLAS takes the
# alternative once installed (24.5 ms for 8). The pthread build, not the serial one: the serial
# build is not thread-safe and mixed the products of ranks run as threads (NOTE [thread-safe BLAS]
# in collectives/rank_context.h; run_threads refuses it). The launcher gives each rank process one
# BLAS thread (OPENBLAS_NUM_THREADS=1, as torchrun sets OMP_NUM_THREADS=1), and several ranks share
# the cores.
# libFuzzer and its runtimes (clang 14): ./x fuzz, and the short fuzz runs of ./x test.
FUZZ_PACKAGES=(clang libclang-rt-14-dev libfuzzer-14-dev)
DISK_CACHE="${DTENSOR_DISK_CACHE:-${HOME:-/tmp}/.cache/dtensor-bazel-disk}"

# Benchmarks: name -> Bazel target (a binary printing a table plus one JSON object per line).
declare -A BENCHES=([collectives]=//bench:collectives_bench [redistribute]=//bench:redistribute_bench
  [propagation]=//bench:propagation_bench [dispatch]=//bench:dispatch_bench
  [checkpoint]=//bench:checkpoint_bench)
# Python benchmarks: name -> script, run with the -c opt build of the dtensor package.
declare -A PY_BENCHES=([python]=bench/python_bench.py [fsdp]=bench/fsdp_bench.py
  [compile]=bench/compile_bench.py [pp]=bench/pipelining_bench.py [cp]=bench/cp_bench.py)

log() { printf '\033[1m[x]\033[0m %s\n' "$*" >&2; }

# ensure_packages [MORE...]: installs what is missing of PACKAGES and MORE.
ensure_packages() {
  local missing=()
  for p in "${PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  prune_stale_bases
  [ ${#missing[@]} -eq 0 ] && { ensure_venv; return 0; }
  local cmd="apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "Missing Debian packages: ${missing[*]}" >&2
    echo "Run as root:  sudo sh -c '$cmd'" >&2
    exit 1
  fi
  log "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  ensure_venv
}

bazel_startup=()
bazel_flags=(--disk_cache="$DISK_CACHE")
if [ "${CI:-}" = "true" ]; then
  bazel_startup+=(--max_idle_secs=60)
  bazel_flags+=(--config=ci)
fi
# NOTE [venv]: the torch the build uses (NOTE [torch from Python] in third_party/python_torch.bzl).
# Default: PyPI's torch pinned in tools/requirements.txt (2.11.0, the version the lent GPU
# machines carry), installed on first use with the other PyPI packages into .venv (git-ignored;
# made from the first python3 on PATH); its Bazel output base is
# ~/.cache/dtensor-bazel-torch-pip/<checkout hash>. DTENSOR_TORCH=debian builds against Debian's
# python3-torch / libtorch-dev 1.13 instead (its own output base): no longer tested, kept while it
# costs only the macros of base/torch_compat.h.
TORCH_KIND=${DTENSOR_TORCH:-pip}
if [ "$TORCH_KIND" = pip ]; then
  PY=$PWD/.venv/bin/python3
  bazel_startup+=(--output_base="${HOME:-/tmp}/.cache/dtensor-bazel-torch-pip/$(echo "$PWD" | md5sum | cut -c1-12)")
  bazel_flags+=(--repo_env=DTENSOR_PYTHON="$PY")
  # Nested Bazel runs (tests/consumers/external_workspace_test.sh) read it from the environment.
  export DTENSOR_PYTHON="$PY"
else
  PY=/usr/bin/python3
  PACKAGES+=("${DEBIAN_TORCH_PACKAGES[@]}")
fi

# ensure_venv: .venv with tools/requirements.txt (a no-op once it matches).
# NOTE [shared venv]: the environment itself lives once per set of requirements and Python
# version, in ~/.cache/dtensor-venv/<hash> (made under a lock, so two clones never build it at
# once), and .venv is a link to it. A fresh clone then starts in seconds instead of installing
# several GB of wheels, and clones (CI makes one per run) do not each hold a copy: a copy per
# clone once filled this machine's disk and failed CI in pip. The Bazel build does not see the
# path (@torch links torch's folders into its own repository), so the disk cache stays warm
# across clones. A checkout whose .venv is a real folder with the right requirements keeps it.
ensure_venv() {
  [ "$TORCH_KIND" = pip ] || return 0
  if [ -x .venv/bin/python3 ] && cmp -s tools/requirements.txt .venv/.requirements; then
    return 0
  fi
  local key shared
  key=$( { cat tools/requirements.txt; python3 -c 'import sys; print(sys.version)'; } |
    md5sum | cut -c1-12)
  shared="${HOME:-/tmp}/.cache/dtensor-venv/$key"
  mkdir -p "${shared%/*}"
  (
    flock 9
    [ -x "$shared/bin/python3" ] && cmp -s tools/requirements.txt "$shared/.requirements" && exit 0
    log "installing PyPI packages into $shared (tools/requirements.txt; torch is several GB)"
    rm -rf "$shared"
    python3 -m venv "$shared" && "$shared/bin/pip" install -q -r tools/requirements.txt &&
      cp tools/requirements.txt "$shared/.requirements"
  ) 9>"$shared.lock" || { log "installing the PyPI packages failed"; exit 1; }
  [ -L .venv ] || rm -rf .venv  # a clone's own environment of other requirements
  ln -sfn "$shared" .venv
}

# NOTE [stale output bases]: each checkout has its own Bazel output bases (its path's hash, see
# above and side_base in test.sh), about 1-3 GB each; once the checkout is deleted nothing else
# frees them. Every ./x run removes those whose workspace (the target of the execroot's WORKSPACE
# link) no longer exists.
prune_stale_bases() {
  local base ws
  for base in "${HOME:-/tmp}"/.cache/dtensor-bazel-{torch-pip,asan,tsan,fuzz}/*/; do
    ws=$(readlink "${base}execroot/dtensor_repo/WORKSPACE" 2>/dev/null) || continue
    [ -e "$ws" ] && continue
    log "removing the Bazel output base of deleted checkout ${ws%/WORKSPACE}: $base"
    chmod -R u+w "$base" 2>/dev/null
    rm -rf "$base"
  done
}

# NCCL is compiled (and its link checked) whenever CUDA + NCCL are installed.
if [ -f /usr/local/cuda/include/nccl.h ] && [ "${DTENSOR_NO_CUDA:-}" != "1" ]; then
  bazel_flags+=(--config=cuda)
fi

bz() {
  local verb=$1; shift
  bazel "${bazel_startup[@]}" "$verb" "${bazel_flags[@]}" "$@"
}

# bin_path PATH [BUILD FLAGS]: where a target built with those flags lies (-c opt has its own folder).
bin_path() {
  local path=$1; shift
  echo "$(bazel "${bazel_startup[@]}" info "${bazel_flags[@]}" "$@" bazel-bin 2>/dev/null)/$path"
}

# stage_python [-c opt]: builds //python:dtensor and lays the importable package out in
# out/python (out/python-opt for -c opt), a folder that does not depend on where bazel-bin points:
# out/python/dtensor/ holds symlinks to the tracked .py files (edits show at once) and to the
# _C.so of that configuration. Prints the folder (absolute).
stage_python() {
  ensure_packages
  mkdir -p "$DISK_CACHE"
  local dest=out/python
  [ "$*" = "-c opt" ] && dest=out/python-opt
  bz build "$@" //python:dtensor >&2
  local so
  so=$(bin_path python/dtensor/_C.so "$@")
  if [ ! -f "$so" ]; then
    echo "./x: built //python:dtensor but found no $so" >&2
    exit 1
  fi
  local root=$PWD
  mkdir -p "$dest"
  # place LINK TARGET: (re)points LINK at TARGET atomically, so running ranks never see a gap.
  place() {
    [ "$(readlink "$1" 2>/dev/null)" = "$2" ] && return 0
    mkdir -p "$(dirname "$1")"
    ln -sfn "$2" "$1.tmp$$" && mv -fT "$1.tmp$$" "$1"
  }
  local f d
  while IFS= read -r -d '' f; do
    place "$dest/${f#python/}" "$root/$f"
  done < <(find python/dtensor -name __pycache__ -prune -o -type f ! -name '*.pyc' \
             ! -name '_C*.so' -print0)
  place "$dest/dtensor/_C.so" "$(realpath "$so")"
  # Files removed from the source tree leave dangling links: drop them, and the folders of moved
  # or removed packages, which would still import (as namespace packages) with only bytecode
  # caches left in them.
  find "$dest" -xtype l -delete
  while IFS= read -r -d '' d; do
    if [ -z "$(ls -A "$d" | grep -vx __pycache__)" ]; then rm -rf "$d"; fi
  done < <(find "$dest" -mindepth 1 -depth -type d ! -name __pycache__ -print0)
  echo "$root/$dest"
}
