# shellcheck shell=bash
# ./x bench, plan, ops, install: benchmarks and figures, the planner and op table, the
# installed C++ library.

x_help bench '  bench [NAME] [--plot]  run a benchmark (--plot: PNGs in out/bench/); without NAME, list them'
x_help plan '  plan [args]     explain a redistribute without communicating: the plan, its cost, local shapes
                  (--mesh 2,2 --shape 8,8 --from "S(0),S(1)" --to "S(1),S(0)" [--dtype float32]
                   [--from-order "0:1,0"] [--to-order ...])'
x_help ops '  ops [args]      list the ATen overloads the sharding propagator supports, with example rules
                  ([--family NAME] [--json])'
x_help install '  install PREFIX  build the C++ library (-c opt) and install it for projects without Bazel:
                  PREFIX/include (dtensor/api.h, checkpoint/checkpoint.h and what they include),
                  PREFIX/lib/libdtensor.so, PREFIX/lib/pkgconfig/dtensor.pc (then:
                  g++ app.cc $(PKG_CONFIG_PATH=PREFIX/lib/pkgconfig pkg-config --cflags --libs dtensor))'

# ./x bench NAME --plot [args]: the bench as below, its output also in out/bench/NAME.log, then
# PNG figures from its JSON lines beside it (tools/plot_bench.py, matplotlib).
cmd_bench() {
  local a args=() plot=0
  for a in "$@"; do
    if [ "$a" = --plot ]; then plot=1; else args+=("$a"); fi
  done
  if [ "$plot" -eq 1 ] && [ ${#args[@]} -gt 0 ]; then
    mkdir -p out/bench
    local log=out/bench/${args[0]}.log status=0
    run_bench "${args[@]}" | tee "$log" || status=$?
    "$PY" tools/plot_bench.py "${args[0]}" "$log" out/bench || status=1
    return $status
  fi
  run_bench "${args[@]}"
}

run_bench() {
  if [ "${1:-}" = serve ]; then
    # The server under load from an HTTP client (bench/serve_bench.py): the opt server binary,
    # the checkpoint ./x demo saved (made first when missing).
    shift
    ensure_packages
    mkdir -p "$DISK_CACHE"
    ensure_demo_checkpoint "bench serve"
    bz build -c opt //tools:serve >&2
    SERVE_BIN="$(bin_path tools/serve -c opt)" "$PY" bench/serve_bench.py "$@"
    return
  fi
  if [ $# -gt 0 ] && [ -n "${PY_BENCHES[$1]+x}" ]; then
    local script=${PY_BENCHES[$1]} dir
    shift
    dir=$(stage_python -c opt)
    PYTHONPATH="$dir" PYTHONSAFEPATH=1 "$PY" "$script" "$@"
    return
  fi
  if [ $# -eq 0 ] || [ -z "${BENCHES[$1]+x}" ]; then
    [ $# -gt 0 ] && echo "unknown benchmark '$1'" >&2
    echo "available benchmarks: ${!BENCHES[*]} ${!PY_BENCHES[*]} serve"
    [ $# -eq 0 ] && return 0 || return 2
  fi
  ensure_packages
  mkdir -p "$DISK_CACHE"
  local target=${BENCHES[$1]}; shift
  bz build -c opt "$target" >&2
  "$(bin_path "$(echo "${target#//}" | tr ':' '/')" -c opt)" "$@"
}

cmd_plan() {
  ensure_packages
  mkdir -p "$DISK_CACHE"
  bz build //tools:plan_explain >&2
  "$(bin_path tools/plan_explain)" "$@"
}

cmd_ops() {
  ensure_packages
  mkdir -p "$DISK_CACHE"
  bz build //tools:ops_list >&2
  "$(bin_path tools/ops_list)" "$@"
}

# NOTE [install]: ./x install PREFIX lays out the public C++ library for projects that build without
# Bazel (README "Using the library from another project"; tests/consumers/install_test.sh):
#   PREFIX/include/  dtensor/api.h, checkpoint/checkpoint.h and every header of this repository they
#                    include, transitively (asked of the compiler: g++ -MM), at their paths
#   PREFIX/lib/libdtensor.so           //:libdtensor, -c opt (the whole engine, one library)
#   PREFIX/lib/pkgconfig/dtensor.pc    Cflags: C++17, libtorch's ABI and include dirs; Libs: the
#                    library with its rpath, then the system libraries its Bazel targets link
cmd_install() {
  if [ $# -ne 1 ] || [ -z "$1" ]; then
    echo "usage: ./x install PREFIX" >&2
    return 2
  fi
  local prefix=$1
  case "$prefix" in /*) ;; *) prefix=$CALLER_PWD/$prefix ;; esac
  ensure_packages
  mkdir -p "$DISK_CACHE"
  bz build -c opt --output_groups=+link_flags //:libdtensor >&2
  local bin
  bin=$(bin_path "" -c opt)
  local public=(dtensor_engine.h dtensor/api.h checkpoint/checkpoint.h)
  # torch's headers and std::string ABI, asked of the build's Python (the consumer compiles with
  # both); Debian's libtorch keeps its headers under /usr/include.
  local torch_include abi
  if [ "$TORCH_KIND" = pip ]; then
    torch_include=$("$PY" -c 'import os, torch; d = os.path.join(os.path.dirname(torch.__file__),
"include"); print(d + " -I" + os.path.join(d, "torch/csrc/api/include"))')
  else
    torch_include=/usr/include/torch/csrc/api/include
  fi
  abi=$("$PY" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')
  local cflags=(-std=c++17 "-D_GLIBCXX_USE_CXX11_ABI=$abi")
  # The headers: what the public ones include from this repository (relative paths; the system's
  # are absolute), found by the compiler with the include path the Bazel targets use.
  local headers
  headers=$(printf '#include "%s"\n' "${public[@]}" |
    g++ "${cflags[@]}" -I. -I$torch_include -MM -x c++ - |
    sed -e 's/[\\]$//' | tr -s ' ' '\n' | grep -v -e '^$' -e '^/' -e ':$' | sort -u)
  local h
  for h in $headers; do
    install -D -m 644 "$h" "$prefix/include/$h"
  done
  install -D -m 755 "$bin/libdtensor.so" "$prefix/lib/libdtensor.so"
  local libs
  libs=$(tr '\n' ' ' <"$bin/libdtensor.link_flags")
  mkdir -p "$prefix/lib/pkgconfig"
  cat >"$prefix/lib/pkgconfig/dtensor.pc" <<PC
prefix=$prefix
includedir=\${prefix}/include
libdir=\${prefix}/lib

Name: dtensor
Description: Distributed tensors over libtorch: dtensor_engine.h (dtensor/api.h, checkpoint/checkpoint.h)
Version: 0.1.0
Cflags: ${cflags[*]} -I\${includedir} -I$torch_include
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -ldtensor ${libs% }
PC
  log "installed $(echo "$headers" | wc -w) headers, lib/libdtensor.so and lib/pkgconfig/dtensor.pc" \
    "under $prefix"
}
