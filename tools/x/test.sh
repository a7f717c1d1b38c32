# shellcheck shell=bash
# ./x test: the tiers (NOTE [what ./x test runs]), the sanitizer runs and the summaries.

x_help test '  test            install missing packages, build, run every C++ and Python test but the "full"
                  tier; print "N passed, N failed" (./x test PACKAGE|TARGET...: only those, e.g.
                  ./x test python or ./x test //dtensor:dispatch_test)'
x_help test '  test --full     the same plus the full op_db sweep, every fuzz target for 10 s, the consumer
                  builds and the core C++ tests under ASan + UBSan (what CI runs)'
x_help test '  test --asan | --tsan
                  every C++ and Python test built with AddressSanitizer + UBSan, or
                  ThreadSanitizer (own output base; the Python tests preload the runtime)'

# NOTE [what ./x test runs]: two tiers. `./x test` runs the normal suite: every C++ and Python
# test but those tagged "full" (the full op_db sweep). `./x test --full` (CI: .ci/run)
# runs the normal suite with the "full" tests, then a short libFuzzer run of every fuzz target
# (NOTE [fuzz runs]), the consumer builds (NOTE [consumer tests]) and the core packages' C++ tests
# under ASan + UBSan (NOTE [sanitizer runs]); the last line totals them all. The extras are
# skipped with DTENSOR_TEST_FUZZ=0 / DTENSOR_TEST_CONSUMERS=0 / DTENSOR_TEST_ASAN=0, and the ASan
# step also when the run has already taken DTENSOR_TEST_ASAN_AFTER_MIN minutes (default 30),
# which keeps a cold run on a new machine inside CI's hour. With other arguments (bazel targets
# or flags), only the suite on those.
cmd_test() {
  case "${1:-}" in
    --asan | --tsan)
      local san=${1#--}
      shift
      cmd_test_sanitized "$san" "$@"
      return
      ;;
  esac
  local full=0
  if [ "${1:-}" = --full ]; then
    full=1
    shift
  fi
  local logf status=0 extras=$# more=()
  # Asked for up front (not after the long suite) when the fuzz step will need them.
  [ "$full" -eq 1 ] && [ "$extras" -eq 0 ] && [ "${DTENSOR_TEST_FUZZ:-1}" != 0 ] &&
    more=("${FUZZ_PACKAGES[@]}")
  ensure_packages "${more[@]}"
  mkdir -p "$DISK_CACHE"
  logf=$(mktemp)
  local start tiers=(--test_tag_filters=-full)
  [ "$full" -eq 1 ] && tiers=()
  start=$(date +%s)
  # Targets or packages given (./x test //python/tests:api_test, ./x test python): only those.
  local targets=(//...) a
  if [ "$extras" -ne 0 ]; then
    targets=()
    for a in "$@"; do
      case "$a" in
        -*|//*|@*) targets+=("$a") ;;
        *) targets+=("//${a%/}/...") ;;  # a package folder: every test under it
      esac
    done
    set --
  fi
  bz test --keep_going "${tiers[@]}" "${targets[@]}" "$@" 2>&1 | tee "$logf" || status=$?
  local testlogs
  testlogs=$(bazel "${bazel_startup[@]}" info "${bazel_flags[@]}" bazel-testlogs 2>/dev/null || true)
  if [ "$extras" -ne 0 ]; then
    /usr/bin/python3 tools/test_summary.py "$logf" "$testlogs" "$start" "$status" || status=1
    rm -f "$logf"
    return $status
  fi
  summarize "normal suite" "$logf" "$testlogs" "$start" "$status"
  passed=$SUM_PASSED failed=$SUM_FAILED
  if [ "$full" -eq 0 ]; then
    rm -f "$logf"
    echo "./x test: $((($(date +%s) - start) / 60)) min (./x test --full adds the full op_db sweep,"
    echo "fuzzing, the consumer builds and ASan)"
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
    return
  fi
  [ "${DTENSOR_TEST_FUZZ:-1}" != 0 ] && test_fuzz_step "$logf"
  [ "${DTENSOR_TEST_CONSUMERS:-1}" != 0 ] && test_consumers_step "$logf"
  test_asan_step "$logf" "$start"
  rm -f "$logf"
  echo "./x test: $((($(date +%s) - start) / 60)) min; suite, fuzz and asan together:"
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}

# The extra steps of ./x test --full. Each adds its results to the run's totals, the globals
# `passed` and `failed`; LOGF is a scratch file for output shown only on failure.

# A short libFuzzer run of every fuzz target (NOTE [fuzz runs]).
test_fuzz_step() {
  local logf=$1 t
  log "fuzz: every target for ${DTENSOR_FUZZ_SECONDS:-10} s (NOTE [fuzz runs])"
  if ! fuzz_build $(fuzz_targets) >"$logf" 2>&1; then
    tail -n 40 "$logf" >&2
    echo "fuzz: the fuzz targets failed to build (clang, NOTE [fuzz config])" >&2
    failed=$((failed + 1))
    return 0
  fi
  for t in $(fuzz_targets); do
    if fuzz_run "$t" "${DTENSOR_FUZZ_SECONDS:-10}"; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1))
    fi
  done
}

# NOTE [consumer tests]: the library as other projects use it, outside Bazel's test runner
# (nested Bazel inside `bazel test` is fragile): `./x install` + pkg-config + plain g++, and
# an external Bazel workspace with local_repository (tests/consumers/).
test_consumers_step() {
  local logf=$1 t
  log "consumers: ./x install with pkg-config, and an external Bazel workspace"
  for t in install external_workspace; do
    if tests/consumers/${t}_test.sh >"$logf" 2>&1; then
      tail -n 1 "$logf"
      passed=$((passed + 1))
    else
      tail -n 40 "$logf" >&2
      failed=$((failed + 1))
    fi
  done
}

# The core packages' C++ tests under ASan + UBSan, unless DTENSOR_TEST_ASAN=0 or the run (begun
# at START) has taken DTENSOR_TEST_ASAN_AFTER_MIN minutes already (CI's hour).
test_asan_step() {
  local logf=$1 start=$2 elapsed san_start san_status=0
  elapsed=$((($(date +%s) - start) / 60))
  [ "${DTENSOR_TEST_ASAN:-1}" = 0 ] && return 0
  if [ "$elapsed" -ge "${DTENSOR_TEST_ASAN_AFTER_MIN:-30}" ]; then
    log "asan: skipped, the run has taken $elapsed min (DTENSOR_TEST_ASAN_AFTER_MIN)"
    return 0
  fi
  log "asan: the core packages' C++ tests under ASan + UBSan"
  san_start=$(date +%s)
  : >"$logf"
  san_test asan core "$logf" || san_status=$?
  summarize "asan (core C++ tests)" "$logf" \
    "$(bz_side asan info --config=asan bazel-testlogs 2>/dev/null)" "$san_start" "$san_status"
  passed=$((passed + SUM_PASSED)) failed=$((failed + SUM_FAILED))
}

# NOTE [side output bases]: the sanitizer and fuzz builds run in output bases of their own,
# ~/.cache/dtensor-bazel-{asan,tsan,fuzz}/<hash of the clone's path> (as Bazel names its own), not
# in the main one: they take no Bazel lock from the normal build (a sanitized build of everything
# takes long on 2 cores), clang's toolchain for the fuzzers never replaces gcc's (switching CC in
# one output base reconfigures the toolchain and rebuilds everything), and the main build's
# outputs and analysis cache stay valid. Compiled objects still come from the one disk cache.
# Their .bazelrc configs (asan, tsan, fuzz) also name output folders of their own and make no
# bazel-* links, so they are harmless in the main output base as well.
side_base() {
  echo "${HOME:-/tmp}/.cache/dtensor-bazel-$1/$(printf %s "$PWD" | md5sum | cut -c1-32)"
}

# bz_side KIND VERB ARGS...: bz in KIND's output base (query takes no build flags).
bz_side() {
  local kind=$1 verb=$2 flags=("${bazel_flags[@]}")
  shift 2
  [ "$verb" = query ] && flags=()
  bazel "${bazel_startup[@]}" --output_base="$(side_base "$kind")" "$verb" "${flags[@]}" "$@"
}

# The whole tree as target patterns: in a side output base //... would also walk the bazel-<name>
# links into the main output base (Bazel skips only links into its own).
tree_patterns() {
  local d out=(//:all)
  for d in */; do
    d=${d%/}
    # Folders without a Bazel package (docs/) would make the whole query fail.
    [ -L "$d" ] || [ "$d" = out ] || [ -z "$(find "$d" -name BUILD -print -quit)" ] ||
      out+=("//$d/...")
  done
  echo "${out[@]}"
}

# What ./x test runs under ASan after the normal suite: the C++ tests of the core packages.
CORE_PATTERNS=(//base/... //device_mesh/... //layout/... //collectives/... //sharding_prop/...
  //dtensor/... //fsdp/... //tests/fuzz/...)

# NOTE [sanitizer runs]: san_test builds with --config=asan|tsan (.bazelrc, NOTE [sanitizer
# configs]) and runs
#   - the C++ tests (cc_test), LeakSanitizer reading tools/sanitizers/lsan.supp (only the
#     torch::Library registrations dispatch.cc leaks on purpose, by function name);
#   - the Python tests (py_test) against the sanitized dtensor._C. python3 is not instrumented,
#     so the runtime is preloaded (it must be the first library) together with libstdc++: the
#     sanitizers look __cxa_throw up when they start, and python3 does not link libstdc++, so
#     without it the first C++ exception aborts. Leak detection is off there (CPython does not
#     free its heap at exit).
# Under TSan every process also preloads the absl::Mutex annotations (tsan_absl_shim, NOTE [TSan
# and Debian's Abseil]); without them each absl::Mutex-guarded access is reported as a race.
# --test_env is no build flag, so the two bazel test calls share one build.
# san_test asan|tsan all|core LOG [BAZEL ARGS...]: appends bazel's output to LOG.
san_test() {
  local san=$1 scope=$2 log=$3 status=0
  shift 3
  local patterns set cc py
  if [ "$scope" = core ]; then
    patterns=("${CORE_PATTERNS[@]}")
  else
    read -ra patterns <<<"$(tree_patterns)"
  fi
  set="set(${patterns[*]})"
  cc=$(bz_side "$san" query "kind(cc_test, $set) except attr(tags, manual, $set)" 2>/dev/null)
  # The op_db sweep (every ATen kernel: all libtorch, none of it instrumented) crashes TSan's own
  # runtime at random (a segfault, or a failed 541 TB shadow mapping), with no report to act on;
  # it runs in the normal and ASan builds.
  local skip=()
  [ "$san" = tsan ] && skip=(//python/tests:op_db_test)
  [ "$scope" = all ] && py=$(bz_side "$san" query "kind(py_test, $set) except set(${skip[*]})" 2>/dev/null)
  local rt stdcxx opts=(--config="$san" --jobs=2 --keep_going "$@") cc_env=() py_env=()
  rt=$(realpath "$(gcc -print-file-name="lib$san.so")")
  stdcxx=$(realpath "$(gcc -print-file-name=libstdc++.so)")
  if [ "$san" = asan ]; then
    # detect_stack_use_after_return stays off: it made redistribute_plan_test's planner search
    # over 5x slower (past 600 s), for a class of bug the other checks mostly catch.
    local asan=strict_init_order=1
    cc_env=(--test_env=ASAN_OPTIONS="detect_leaks=1:$asan"
      --test_env=LSAN_OPTIONS="suppressions=$PWD/tools/sanitizers/lsan.supp:print_suppressions=0")
    py_env=(--test_env=ASAN_OPTIONS="detect_leaks=0:$asan" --test_env=LD_PRELOAD="$rt $stdcxx")
    opts+=(--test_timeout=180,600,1800,3600)
  else
    local shim
    shim=$(tsan_absl_shim) || return 1
    cc_env=(--test_env=LD_PRELOAD="$shim"
      # Timed to normal speed (a peer that dies 300 ms in, read 1 s in): under TSan's slowdown
      # the read completes first. Not a race; it runs in the other builds.
      --test_env=GTEST_FILTER=-ShmDeadPeerTest.RankThatDiesBeforeItsInputIsReadIsNamed)
    py_env=(--test_env=LD_PRELOAD="$rt $shim $stdcxx")
    opts+=(--test_timeout=300,1200,3600,3600)
  fi
  # pytest captures fd 2 per test; a sanitizer that aborts the process would take its report along.
  py_env+=(--test_env=PYTEST_ADDOPTS=--capture=no)
  log "$san: $([ "$scope" = core ] && echo "the core C++ tests" || echo "every test") with --config=$san"
  # shellcheck disable=SC2086  # target lists are words
  bz_side "$san" test "${opts[@]}" "${cc_env[@]}" $cc 2>&1 | tee -a "$log" || status=$?
  if [ -n "${py:-}" ]; then
    # shellcheck disable=SC2086
    bz_side "$san" test "${opts[@]}" "${py_env[@]}" $py 2>&1 | tee -a "$log" || status=$?
  fi
  return $status
}

# tsan_absl_shim: builds tools/sanitizers/tsan_absl_mutex.cc (NOTE [TSan and Debian's Abseil])
# into out/sanitizers/ when missing or older than its source; prints its path. Linked lazily and
# without libtsan: it is preloaded into every process of a test, bash included, and resolves the
# TSan interface only when an absl::Mutex is used. It links libabsl_synchronization, the library
# it wraps (see the note).
tsan_absl_shim() {
  local src=tools/sanitizers/tsan_absl_mutex.cc out=$PWD/out/sanitizers/libtsan_absl_mutex.so
  if [ ! -f "$out" ] || [ "$src" -nt "$out" ]; then
    mkdir -p "$(dirname "$out")"
    g++ -std=c++17 -O1 -fPIC -shared -Wl,-z,lazy -o "$out" "$src" -labsl_synchronization -labsl_time -ldl >&2 ||
      return 1
  fi
  echo "$out"
}

# summarize LABEL LOG TESTLOGS START STATUS: test_summary.py's table, its last line ("N passed,
# N failed") prefixed by "LABEL: " unless LABEL is empty; sets SUM_PASSED and SUM_FAILED.
summarize() {
  local label=$1 out
  shift
  out=$(/usr/bin/python3 tools/test_summary.py "$@") || true
  if [ -n "$label" ]; then
    printf '%s\n' "$out" | sed "\$s/^/$label: /"
  else
    printf '%s\n' "$out"
  fi
  read -r SUM_PASSED SUM_FAILED < <(printf '%s\n' "$out" | tail -n 1 |
    sed -n 's/^\([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p')
  SUM_PASSED=${SUM_PASSED:-0} SUM_FAILED=${SUM_FAILED:-1}
}

cmd_test_sanitized() {
  local san=$1 logf start status=0
  shift
  ensure_packages
  mkdir -p "$DISK_CACHE"
  logf=$(mktemp)
  start=$(date +%s)
  san_test "$san" all "$logf" "$@" || status=$?
  echo "./x test --$san: $(($(date +%s) - start)) s"
  summarize "" "$logf" "$(bz_side "$san" info --config="$san" bazel-testlogs 2>/dev/null)" \
    "$start" "$status"
  rm -f "$logf"
  [ "$SUM_FAILED" -eq 0 ]
}
