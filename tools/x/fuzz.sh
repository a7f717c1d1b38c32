# shellcheck shell=bash
# ./x fuzz: the libFuzzer targets and the ops differential fuzzer (NOTE [fuzz runs]).

x_help fuzz '  fuzz [TARGET...] [--time S] [FILE...]
                  build the libFuzzer targets of tests/fuzz with clang and run each for S seconds
                  (default 60); findings go to out/fuzz/TARGET/; with FILEs, replay them'
x_help fuzz '  fuzz ops [--time S] [--seed S] [--replay SEED,...] [--ops NAME,...]
                  the ops differential fuzzer: random OpInfo x sample x placements x mesh shape
                  against one device for S seconds (default 60); prints each failure'\''s seed'

# NOTE [fuzz runs]: the fuzz targets (tests/fuzz, NOTE [fuzz targets]) are built with clang in
# their own output base (NOTE [side output bases]). A run reads the checked-in seeds
# (tests/fuzz/corpus/TARGET) and keeps what it discovers in out/fuzz/TARGET/corpus (ignored by
# git), so later local runs start further; a finding is written to out/fuzz/TARGET/ and its path
# printed. ./x test runs each target for DTENSOR_FUZZ_SECONDS (default 10).
fuzz_targets() {
  awk '/^fuzz_target\(/ { f = 1 } f && /name = "/ { sub(/.*name = "/, ""); sub(/".*/, "");
       print; f = 0 }' tests/fuzz/BUILD
}

fuzz_build() {
  ensure_packages "${FUZZ_PACKAGES[@]}"
  mkdir -p "$DISK_CACHE"
  local t targets=()
  for t in "$@"; do targets+=("//tests/fuzz:$t"); done
  # ld.gold (Bazel's choice with clang) warns about every ASan check symbol it cannot export.
  bz_side fuzz build --repo_env=CC=clang --config=fuzz "${targets[@]}" 2>&1 |
    { grep -v "warning: Cannot export local symbol '__asan" || true; }
}

fuzz_bin() {
  echo "$(bz_side fuzz info --repo_env=CC=clang --config=fuzz bazel-bin 2>/dev/null)/tests/fuzz/$1"
}

# fuzz_run TARGET SECONDS [LIBFUZZER ARGS...]: non-zero on a finding, after naming its file.
fuzz_run() {
  local t=$1 secs=$2 dir=out/fuzz/$1 status=0
  shift 2
  mkdir -p "$dir/corpus"
  "$(fuzz_bin "$t")" -max_total_time="$secs" -timeout=10 -rss_limit_mb=4096 \
    -artifact_prefix="$dir/" "$@" "$dir/corpus" "tests/fuzz/corpus/$t" >"$dir/last.log" 2>&1 ||
    status=$?
  if [ $status -ne 0 ]; then
    tail -n 40 "$dir/last.log" >&2
    local unit
    unit=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$dir/last.log" | tail -1)
    echo "fuzz: $t FAILED; reproducer: ${unit:-none written, see $dir/last.log}" >&2
    [ -n "$unit" ] && echo "fuzz: replay with ./x fuzz $t $unit" >&2
    return 1
  fi
  echo "fuzz: $t passed ($(grep -o 'Done [0-9]* runs' "$dir/last.log" | tail -1) in ${secs}s)"
}

# ./x fuzz ops [--time S] [--seed S] [--replay SEED,...]: the ops differential fuzzer
# (python/tests/op_db/fuzz_ops.py): random OpInfo x sample x placements x mesh against one device.
cmd_fuzz_ops() {
  local dir root=$PWD
  dir=$(stage_python)
  cd "$CALLER_PWD"
  PYTHONPATH="$dir" PYTHONSAFEPATH=1 DTENSOR_COLLECTIVE_TIMEOUT_MS=${DTENSOR_COLLECTIVE_TIMEOUT_MS:-20000} \
    exec "$PY" "$root/python/tests/op_db/fuzz_ops.py" "$@"
}

cmd_fuzz() {
  if [ "${1:-}" = ops ]; then
    shift
    cmd_fuzz_ops "$@"
    return
  fi
  local secs=${DTENSOR_FUZZ_SECONDS:-60} targets=() files=() all
  all=$(fuzz_targets)
  while [ $# -gt 0 ]; do
    case "$1" in
      --time) secs=$2; shift 2 ;;
      --time=*) secs=${1#--time=}; shift ;;
      -*) echo "usage: ./x fuzz [TARGET...] [--time SECONDS] [FILE...]" >&2; return 2 ;;
      *)
        if grep -qx -- "$1" <<<"$all"; then targets+=("$1")
        elif [ -e "$CALLER_PWD/$1" ] || [ -e "$1" ]; then files+=("$(cd "$CALLER_PWD" && realpath "$1")")
        else echo "./x fuzz: '$1' is no fuzz target (${all//$'\n'/, }) nor a file" >&2; return 2
        fi
        shift ;;
    esac
  done
  [ ${#targets[@]} -eq 0 ] && mapfile -t targets <<<"$all"
  fuzz_build "${targets[@]}" >&2
  if [ ${#files[@]} -gt 0 ]; then  # replay: run the target on the files once, report as it goes
    [ ${#targets[@]} -eq 1 ] || { echo "./x fuzz: name one target to replay files" >&2; return 2; }
    "$(fuzz_bin "${targets[0]}")" "${files[@]}"
    return
  fi
  local t status=0
  for t in "${targets[@]}"; do fuzz_run "$t" "$secs" || status=1; done
  return $status
}

# ./x test --asan|--tsan: everything, C++ and Python, under one sanitizer.
