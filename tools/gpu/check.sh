#!/bin/bash
# NOTE [GPU check]
# Builds the CUDA pieces of the collectives layer (the NCCL backend, CUDA symmetric memory, the
# collective torch ops' CUDA kernels) and their tests without Bazel, against the PyTorch that the
# machine's python3 holds (its headers and libraries, so CUDA tensors work: Debian's libtorch is
# CPU-only), CUDA under $CUDA_HOME and the NCCL and CUDA runtime that torch itself loads; then
# runs the tests. It is written for the device machine (one GPU, PyTorch 2.x + CUDA, nvcc, no
# Bazel, no registry). Abseil and GoogleTest travel from this machine's Debian packages in .gpu/
# (tools/gpu/carry_deps.sh).
#   here:   tools/gpu/carry_deps.sh
#   there:  tools/gpu/check.sh [TEST ...]       (device run with carry [".gpu"])
# Then builds the whole engine and the Python extension dtensor._C the same way (no Bazel) and
# runs tools/gpu/cuda_probe.py: the distributed tensor's user paths on a 1-rank NCCL mesh of CUDA
# tensors, each checked against plain CUDA tensors, and per-call costs against PyTorch's DTensor;
# then python/tests/cuda_test.py (pytest) when the device's python has pytest; then the op_db
# sweep on CUDA tensors (python/tests/op_db/sweep.py --device cuda --time-budget 85, NOTE [sweep
# on CUDA]: each OpInfo's samples made on the GPU, on a 1-rank mesh of the process, against plain
# CUDA tensors; log op_db_cuda.log), and again on 2 processes sharing the GPU on cuda_ipc
# (--ranks-as processes --world 2, NOTE [sweep with processes]; log op_db_cuda_2proc.log), then
# every sample of the OpInfos a full CUDA sweep failed on once (log op_db_cuda_full.log), when the
# device's python can import torch's op database
# (torch.testing._internal.common_methods_invocations; its `expecttest` import is met by PyPI's
# expecttest that carry_deps.sh puts in .gpu/python): its counts and the "wrong" and "hang"
# OpInfos, which must be 0 (as must a CUDA failure that stops the sweep; errors are allowed);
# then the TP demo on CUDA (examples/llama_train.py --device cuda, 1 rank: loss equal to one
# device's within 1e-5) and bench/python_bench.py --device cuda (per call against PyTorch's
# DTensor, bench/pytorch_anchor.py).
# Tests: nccl_link_test (world size 1: NCCL refuses two ranks on one GPU),
# symmetric_memory_cuda_test (2 processes sharing the GPU) and cuda_ipc_test (every collective on
# 2 and 3 processes sharing the GPU, NOTE [cuda_ipc backend]); after the 1-rank TP demo, the demo
# on 2 and 4 ranks sharing the GPU (cuda_ipc), then ./x demo pp's and ./x demo cp's two runs each
# on ranks sharing the GPU (stages pp and cp: examples/llama_pp.py and examples/llama_cp.py
# --device cuda, 3 steps, on 4 ranks and on 8 as pp x dp x tp or dp x cp x tp; each loss equal
# to one process's on the GPU within the script's --tol), random ops on 2 processes against one
# device's draw (stage random, tools/gpu/random_ranks.py), the inference server's model on the
# GPU (stage serve: serving/llama_test and tools/llama_generate, 1 and 2 processes, tokens
# against the CPU's)
# then Hugging Face models in the server's model (stage hf: tests/serving/hf_logits on tiny random
# Llama 3 and Qwen2 models that tools/gpu/hf_reference.py wrote with transformers into .gpu/hf,
# float32 on 1 process and on 2 sharing the GPU, bfloat16 on 1; tools/gpu/hf_compare.py holds
# each to transformers' CPU logits and greedy tokens) and tools/gpu/ipc_bandwidth.py (its bus
# bandwidth against a device copy). Logs go to the build folder, and
# all of them as one file to $OUT when that is set (the device run's folder that comes back).
# Ends with one summary line per stage; exits non-zero when something failed to build or a test
# failed. SKIP_ENGINE=1 stops after the collectives' tests.
# NCCL_BACKEND_SRC / VARIANT build the tests with another nccl_backend.cc (objects of the other
# sources are reused), e.g. to show that a test fails without a fix.
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
DEPS=${DTENSOR_GPU_DEPS:-$ROOT/.gpu}
BUILD=${DTENSOR_GPU_BUILD:-/tmp/dtensor-gpu-build}
VARIANT=${VARIANT:-}
LOGS=${DTENSOR_GPU_LOGS:-$BUILD/logs$VARIANT}
PY=${PYTHON:-python3}
# A relative interpreter path (PYTHON=.venv/bin/python) must work from the build folder too.
case $PY in */*) PY=$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY") ;; esac
JOBS=${JOBS:-$(nproc)}
NCCL_BACKEND_SRC=${NCCL_BACKEND_SRC:-collectives/nccl_backend.cc}
TESTS=("$@")
[ ${#TESTS[@]} -gt 0 ] || TESTS=(nccl_link_test symmetric_memory_cuda_test cuda_ipc_test)
# STAGES: which stages run (all by default), e.g. STAGES=tp,bench for a short rerun.
STAGES=${STAGES:-tests,probe,cuda_test,op_db,tp,tp_shared,pp,cp,random,serve,hf,ipc_bench,bench}
stage() { [[ ",$STAGES," == *",$1,"* ]]; }
stage tests || TESTS=()
rm -rf "$LOGS"
mkdir -p "$BUILD/obj" "$LOGS"
[ -d "$DEPS/include/absl" ] || { echo "no $DEPS: run tools/gpu/carry_deps.sh here first"; exit 2; }

if [ -z "${TORCH_INCLUDE:-}" ]; then
  TORCH_DIR=$($PY -c 'import os, torch; print(os.path.dirname(torch.__file__))') || exit 2
  TORCH_INCLUDE=$TORCH_DIR/include
  TORCH_LIB=$TORCH_DIR/lib
  SITE=$(dirname "$TORCH_DIR")
else
  SITE=/nonexistent
fi
ABI=$($PY -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>/dev/null || echo 1)
CUDA=${CUDA_HOME:-/usr/local/cuda}
# The first match: torch's own (pip's nvidia packages) before the toolkit's.
first() { find "$@" 2>/dev/null | sort | head -1; }
NCCL_H=$(first "$SITE/nvidia" "$CUDA/include" -name nccl.h)
NCCL_SO=$(first "$SITE/nvidia" "$CUDA/lib64" "$CUDA/lib" -name 'libnccl.so*' -type f)
CUDART_SO=$(first "$SITE/nvidia" "$CUDA/lib64" "$CUDA/lib" -name 'libcudart.so*' -type f)
{
  echo "torch headers $TORCH_INCLUDE, libraries $TORCH_LIB, CXX11 ABI $ABI"
  echo "nccl.h $NCCL_H; libnccl $NCCL_SO; libcudart $CUDART_SO; nvcc $(command -v nvcc || echo none)"
  command -v nvidia-smi >/dev/null && nvidia-smi -L
  $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())' 2>&1
} | tee "$LOGS/env.log"
[ -n "$NCCL_H" ] && [ -n "$NCCL_SO" ] && [ -n "$CUDART_SO" ] || { echo "NCCL or the CUDA runtime not found"; exit 2; }

sys_include() { [ "$1" = /usr/include ] || echo "-isystem $1"; }
CXXFLAGS="-std=c++17 -O2 -fPIC -D_GLIBCXX_USE_CXX11_ABI=$ABI -DDTENSOR_WITH_CUDA -Wall
  -Wno-unused-parameter -Wno-sign-compare -Wno-deprecated-declarations
  -DUSE_C10D_GLOO -I$ROOT -I$DEPS/include -I$DEPS/googletest/include -I$DEPS/googletest
  $(sys_include "$TORCH_INCLUDE") -isystem $TORCH_INCLUDE/torch/csrc/api/include
  -isystem $CUDA/include -isystem $(dirname "$NCCL_H")"
# base/ by folder: base/cpu_memory.cc (NOTE [CPU memory meter]) was missing from this list,
# so the extension linked with an undefined symbol and `import dtensor` failed on the GPU.
LIB_SRCS=($(ls base/*.cc | grep -v -e _test.cc -e _fuzz.cc) layout/placement.cc device_mesh/device_mesh.cc
  collectives/communicator.cc collectives/functional.cc collectives/rank_context.cc
  collectives/reduce.cc collectives/work.cc collectives/shm_segment.cc collectives/shm_backend.cc
  collectives/shm_cma.cc collectives/shm_symmetric.cc collectives/symmetric_memory.cc
  collectives/symmetric_memory_cuda.cc collectives/threads_backend.cc collectives/launch_env.cc
  collectives/torch_ops.cc collectives/cuda_ipc_backend.cc
  "$NCCL_BACKEND_SRC")
# The rest of the engine and the extension (c10d_backend.cc builds without Gloo headers:
# NOTE [Gloo headers]).
# Listed by folder, so a new source (or package) of the engine or the extension is built here
# too without editing this file.
ENGINE_SRCS=(collectives/c10d_backend.cc $(ls layout/*.cc sharding_prop/*.cc sharding_prop/ops/*.cc dtensor/*.cc \
  checkpoint/*.cc fsdp/*.cc | grep -v -e _test.cc -e '^layout/placement.cc$'))
EXT_SRCS=($(ls python/csrc/*.cc))
PYINC=$($PY -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)
PYBIND=$($PY -c 'import pybind11; print(pybind11.get_include())' 2>/dev/null)
GTEST_SRCS=("$DEPS/googletest/src/gtest-all.cc" "$DEPS/googletest/src/gtest_main.cc")
obj_of() { local r=${1#$ROOT/}; echo "$BUILD/obj/${r//\//_}.o"; }
compile() {  # source -> object, log under $LOGS/compile-*.log (kept only on failure)
  local o; o=$(obj_of "$1")
  [ -f "$o" ] && [ "$o" -nt "$1" ] && return 0
  local log="$LOGS/compile-$(basename "$o" .o).log"
  rm -f "$o"
  if g++ $CXXFLAGS -c "$1" -o "$o" >"$log" 2>&1; then rm -f "$log"; else echo "FAILED to compile $1"; return 1; fi
}
export -f compile obj_of
CXXFLAGS+=" -isystem $PYINC${PYBIND:+ -isystem $PYBIND}"
export CXXFLAGS BUILD LOGS ROOT
SRCS=("${LIB_SRCS[@]}" "${GTEST_SRCS[@]}")
[ "${SKIP_ENGINE:-}" = 1 ] || SRCS+=("${ENGINE_SRCS[@]}" "${EXT_SRCS[@]}")
# The serving model and its programs (stage serve).
SERVE_SRCS=(serving/llama.cc tools/llama_flags.cc serving/llama_test.cc tools/llama_generate.cc)
[ "${SKIP_ENGINE:-}" != 1 ] && stage serve && SRCS+=("${SERVE_SRCS[@]}")
# Hugging Face models (stage hf): the serving model's families and hf_logits.
HF_SRCS=(serving/llama.cc tools/llama_flags.cc $(ls serving/models/*.cc | grep -v _test.cc)
  tests/serving/hf_logits.cc)
[ "${SKIP_ENGINE:-}" != 1 ] && stage hf && SRCS+=("${HF_SRCS[@]}")
for t in "${TESTS[@]}"; do SRCS+=("collectives/$t.cc"); done
t0=$(date +%s)
printf '%s\n' "${SRCS[@]}" | xargs -P "$JOBS" -I{} bash -c 'compile "$@"' _ {}
status=$?
echo "compiled in $(( $(date +%s) - t0 )) s"

TORCH_LIBS="-L$TORCH_LIB -Wl,-rpath,$TORCH_LIB -Wl,--no-as-needed -ltorch -ltorch_cpu -lc10"
[ -f "$TORCH_LIB/libtorch_cuda.so" ] && TORCH_LIBS+=" -ltorch_cuda -lc10_cuda"
TORCH_LIBS+=" -Wl,--as-needed"
LIBOBJS=()
for s in "${LIB_SRCS[@]}" "${GTEST_SRCS[@]}"; do LIBOBJS+=("$(obj_of "$s")"); done
failed=0
for t in "${TESTS[@]}"; do
  bin="$BUILD/$t$VARIANT"
  if ! g++ -o "$bin" "${LIBOBJS[@]}" "$(obj_of "collectives/$t.cc")" $TORCH_LIBS "$DEPS"/lib/libabsl_*.so.* \
      "$NCCL_SO" "$CUDART_SO" -Wl,-rpath,"$DEPS/lib:$(dirname "$NCCL_SO"):$(dirname "$CUDART_SO")" \
      -Wl,--disable-new-dtags -lrt -ldl -pthread >"$LOGS/link-$t$VARIANT.log" 2>&1; then
    echo "FAILED to link $t$VARIANT (log link-$t$VARIANT.log)"; tail -20 "$LOGS/link-$t$VARIANT.log"; failed=1; continue
  fi
  timeout 300 "$bin" --gtest_color=no >"$LOGS/$t$VARIANT.log" 2>&1
  rc=$?
  grep -E '^\[ +(OK|FAILED|SKIPPED|PASSED) +\]|Failure|uncaught|error' "$LOGS/$t$VARIANT.log" | head -40
  echo "$t$VARIANT: exit $rc"
  [ $rc -eq 0 ] || failed=1
done
summary=("collectives tests: $([ ${#TESTS[@]} -eq 0 ] && echo "not run (STAGES)" || { [ $failed -eq 0 ] && echo passed || echo FAILED; })")
engine=0
if [ "${SKIP_ENGINE:-}" != 1 ]; then
  # The extension: every library object and the bindings, as Bazel's //python:dtensor/_C.so.
  EXTOBJS=("${LIBOBJS[@]}")
  for s in "${ENGINE_SRCS[@]}" "${EXT_SRCS[@]}"; do EXTOBJS+=("$(obj_of "$s")"); done
  EXTOBJS=("${EXTOBJS[@]/*gtest*/}")
  PYPKG=$BUILD/python
  rm -rf "$PYPKG"; mkdir -p "$PYPKG"
  cp -r python/dtensor "$PYPKG"/
  if g++ -shared -o "$PYPKG/dtensor/_C.so" ${EXTOBJS[@]} $TORCH_LIBS -ltorch_python \
      "$DEPS"/lib/libabsl_*.so.* "$NCCL_SO" "$CUDART_SO" /lib/x86_64-linux-gnu/libz.so.1 \
      -Wl,-rpath,"$DEPS/lib:$(dirname "$NCCL_SO"):$(dirname "$CUDART_SO")" \
      -Wl,--disable-new-dtags -lrt -ldl -pthread >"$LOGS/link-ext.log" 2>&1; then
    # A shared object links with undefined symbols; importing it is the check (cheap, no GPU).
    if (cd "$BUILD" && PYTHONPATH=$PYPKG $PY -c 'import dtensor') >"$LOGS/import.log" 2>&1; then
      summary+=("extension: built and imports")
    else
      tail -5 "$LOGS/import.log"
      summary+=("extension: built but FAILED to import (log import.log)")
      engine=1
    fi
    if stage probe; then
      PYTHONPATH=$PYPKG timeout 300 $PY tools/gpu/cuda_probe.py 2>&1 | tee "$LOGS/cuda_probe.log" \
        | grep -E '^(PASS|FAIL|probe:|\{)'
      engine=${PIPESTATUS[0]}
      summary+=("$(grep '^probe:' "$LOGS/cuda_probe.log" || echo "probe: did not finish (exit $engine)")")
    fi
    # The package's CUDA tests (python/tests/cuda_test.py, NOTE [mesh device]), run from the build
    # folder so that python/dtensor (no _C.so) does not shadow the built package.
    if ! stage cuda_test; then
      :
    elif $PY -c 'import pytest' 2>/dev/null; then
      cp python/tests/cuda_test.py "$BUILD/cuda_test.py"
      (cd "$BUILD" && PYTHONPATH=$PYPKG timeout 300 $PY -m pytest -q -p no:cacheprovider \
        cuda_test.py) >"$LOGS/cuda_test.log" 2>&1
      rc=$?
      grep -E '^(FAILED|ERROR)|passed|failed' "$LOGS/cuda_test.log" | tail -15
      summary+=("cuda_test: $(tail -1 "$LOGS/cuda_test.log")")
      [ $rc -eq 0 ] || engine=1
    else
      summary+=("cuda_test: not run (no pytest in $PY)")
    fi
    # The op_db sweep on CUDA tensors (NOTE [sweep on CUDA] in python/tests/op_db/sweep.py), run
    # from the root: the built package and the carried expecttest from PYTHONPATH.
    if ! stage op_db; then
      :
    elif PYTHONPATH=$DEPS/python $PY -c 'import torch.testing._internal.common_methods_invocations' \
        >/dev/null 2>&1; then
      # Three runs (the stage stays within ~4.5 min): ~85 s of OpInfos on the 1-rank NCCL mesh
      # of this process, then ~85 s on 2 processes sharing the GPU on cuda_ipc, the modes of a
      # 2-rank mesh (NOTE [sweep with processes]: the sweep starts its own launcher and prints
      # rank 0's lines unprefixed), then every sample (--full) of the OpInfos a full CUDA sweep
      # failed on once, with that sweep's seed (2026-11-28: an efficient attention gradient read
      # from uninitialized memory, errors in batch norm and logsigmoid, and dropout, whose CUDA
      # draws changed). Each must have 0 wrong, 0 hang, a summary, exit 0, no CUDA failure.
      for run in "1-rank:op_db_cuda:" \
          "2 processes (cuda_ipc):op_db_cuda_2proc:--ranks-as processes --world 2" \
          "1-rank, every sample of 6 OpInfos:op_db_cuda_full:--full --seed 768618223 --ops torch.ops.aten._efficient_attention_forward,native_batch_norm,nn.functional.batch_norm,nn.functional.logsigmoid,nn.functional.multilabel_soft_margin_loss,nn.functional.dropout"; do
        IFS=: read -r what log flags <<<"$run"
        PYTHONPATH=$PYPKG:$DEPS/python timeout 180 $PY python/tests/op_db/sweep.py --device cuda \
          $flags --time-budget 85 >"$LOGS/$log.log" 2>&1
        rc=$?
        grep -E '^(wrong|hang) |^summary:' "$LOGS/$log.log" | head -20
        wrong=$(grep -c '^wrong ' "$LOGS/$log.log")
        hang=$(grep -c '^hang ' "$LOGS/$log.log")
        counts=$(grep '^summary:' "$LOGS/$log.log" | sed -E 's/^summary: //; s/ \(native: [^)]*\)//')
        summary+=("op_db sweep on cuda, $what: ${counts:-did not finish (exit $rc)}; wrong $wrong, hang $hang")
        [ $rc -eq 0 ] && [ "$wrong" -eq 0 ] && [ "$hang" -eq 0 ] && [ -n "$counts" ] \
          && ! grep -q '^summary:.*; CUDA failed' "$LOGS/$log.log" || engine=1
      done
    else
      summary+=("op_db sweep on cuda: not run (torch's op database does not import in $PY)")
    fi
    # The TP demo on CUDA, 1 rank on NCCL: its loss against one device's, step by step.
    if stage tp; then
      PYTHONPATH=$PYPKG RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29531 \
        timeout 300 $PY examples/llama_train.py --device cuda --steps 3 --tol 1e-5 \
        --save "$BUILD/llama_ckpt" >"$LOGS/tp_demo_cuda.log" 2>&1
      rc=$?
      tail -6 "$LOGS/tp_demo_cuda.log"
      summary+=("TP demo on cuda (1 rank): $(grep '^loss vs one device' "$LOGS/tp_demo_cuda.log" \
        || echo "did not finish (exit $rc)")")
      [ $rc -eq 0 ] || engine=1
    fi
    # The TP demo with 2 and 4 ranks sharing the one GPU (cuda_ipc: NOTE [cuda_ipc backend];
    # the default backend when a host's ranks outnumber its GPUs), each against one device.
    if stage tp_shared; then
      for n in 2 4; do
        PYTHONPATH=$PYPKG timeout 300 $PY tools/launch.py -n $n -- $PY examples/llama_train.py \
          --device cuda --steps 3 --tol 1e-5 --save "$BUILD/llama_ckpt_$n" \
          >"$LOGS/tp_demo_cuda_$n.log" 2>&1
        rc=$?
        tail -4 "$LOGS/tp_demo_cuda_$n.log"
        summary+=("TP demo on cuda ($n ranks sharing the GPU): $(grep -o 'loss vs one device.*' \
          "$LOGS/tp_demo_cuda_$n.log" || echo "did not finish (exit $rc)")")
        [ $rc -eq 0 ] || engine=1
      done
    fi
    # ./x demo pp's and ./x demo cp's runs on CUDA ranks sharing the one GPU (cuda_ipc), 3 steps:
    # WHAT LOG N SCRIPT [ARGS]; the script exits 1 and says DIFFERENT when a step's loss is off
    # one process's by more than its --tol, and its last line names the largest difference.
    demo_on_shared_gpu() {
      local what=$1 log=$2 n=$3 t0 rc line
      shift 3
      t0=$(date +%s)
      PYTHONPATH=$PYPKG timeout 90 $PY tools/launch.py -n "$n" -- $PY "$@" --device cuda \
        --steps 3 >"$LOGS/$log.log" 2>&1
      rc=$?
      grep -v ' timeline, ms: ' "$LOGS/$log.log" | tail -4
      line=$(sed -n 's/^\[rank [0-9]*\] //; /largest |loss diff|/p' "$LOGS/$log.log" | head -1)
      summary+=("$what ($n ranks sharing the GPU, $(($(date +%s) - t0)) s): \
${line:-did not finish} (exit $rc)")
      [ $rc -eq 0 ] && [ -n "$line" ] || engine=1
    }
    # Pipeline parallelism: 2 stages x TP (pp=2 x tp=2), then with FSDP (pp=2 x dp=2 x tp=2).
    if stage pp; then
      demo_on_shared_gpu "PP demo" pp_demo_cuda_4 4 examples/llama_pp.py --mesh 2,2
      demo_on_shared_gpu "PP demo" pp_demo_cuda_8 8 examples/llama_pp.py --mesh 2,2,2
    fi
    # Context parallelism (ring attention's explicit blocks on CUDA: NOTE [ring attention
    # blocks]): cp on 4, then dp=2 x cp=2 x tp=2.
    if stage cp; then
      demo_on_shared_gpu "CP demo" cp_demo_cuda_4 4 examples/llama_cp.py
      demo_on_shared_gpu "CP demo" cp_demo_cuda_8 8 examples/llama_cp.py --mesh 2,2,2
    fi
    # Random ops across 2 processes sharing the GPU against one device's draw, bit for bit, with
    # the generator ending where one device's does (NOTE [random on a CUDA mesh]).
    if stage random; then
      PYTHONPATH=$PYPKG timeout 180 $PY tools/launch.py -n 2 -- $PY tools/gpu/random_ranks.py cuda \
        >"$LOGS/random_ranks.log" 2>&1
      rc=$?
      grep -E 'MISMATCH|random ops on' "$LOGS/random_ranks.log" | head -12
      summary+=("$(grep -o 'random ops on.*' "$LOGS/random_ranks.log" || echo "random ops on 2 cuda ranks: did not finish") (exit $rc)")
      [ $rc -eq 0 ] || engine=1
    fi
    # Linking a program of the engine (stages serve and hf). libstdc++ before libtorch: pip's
    # libtorch.so exports a partial std::filesystem whose remove_all jumps to 0 (llama_test's
    # teardown crashed here, resolving it there).
    NOGTEST=("${LIBOBJS[@]/*gtest*/}")
    LINK_TAIL=(-lstdc++ $TORCH_LIBS "$DEPS"/lib/libabsl_*.so.* "$NCCL_SO" "$CUDART_SO"
      /lib/x86_64-linux-gnu/libz.so.1
      -Wl,-rpath,"$DEPS/lib:$(dirname "$NCCL_SO"):$(dirname "$CUDART_SO")"
      -Wl,--disable-new-dtags -lrt -ldl -pthread)
    # The inference server's model on CUDA (serving/llama.h, what ./x serve --device cuda runs;
    # the C++ API with no Python): serving's tests (llama_test, its CUDA case against the CPU),
    # then llama_generate's greedy tokens on the GPU, in one process and in 2 processes sharing
    # it (cuda_ipc), each equal to the CPU's, from the TP demo's checkpoint (the tp stage's, else
    # saved here by a 1-step CPU run).
    if stage serve; then
      SERVE_OBJS=()
      for s in "${ENGINE_SRCS[@]}" serving/llama.cc tools/llama_flags.cc; do
        SERVE_OBJS+=("$(obj_of "$s")")
      done
      if g++ -o "$BUILD/llama_test" "${LIBOBJS[@]}" "${SERVE_OBJS[@]}" \
            "$(obj_of serving/llama_test.cc)" "${LINK_TAIL[@]}" >"$LOGS/link-llama_test.log" 2>&1 \
          && g++ -o "$BUILD/llama_generate" ${NOGTEST[@]} "${SERVE_OBJS[@]}" \
            "$(obj_of tools/llama_generate.cc)" "${LINK_TAIL[@]}" \
            >"$LOGS/link-llama_generate.log" 2>&1; then
        timeout 300 "$BUILD/llama_test" --gtest_color=no >"$LOGS/llama_test.log" 2>&1
        rc=$?
        grep -E '^\[ +(OK|FAILED|SKIPPED) +\]' "$LOGS/llama_test.log" | head -20
        summary+=("serving model tests: $(grep -E '^\[ +(PASSED|FAILED|SKIPPED) +\] [0-9]+ test' \
          "$LOGS/llama_test.log" | sed -E 's/^\[ +([A-Z]+) +\] ([0-9]+) tests?.*/\2 \1/' \
          | paste -sd, -) (exit $rc)")
        [ $rc -eq 0 ] || engine=1
        ckpt=$BUILD/llama_ckpt
        if [ ! -f "$ckpt/model.safetensors.index.json" ]; then
          ckpt=$BUILD/llama_ckpt_cpu
          PYTHONPATH=$PYPKG RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 \
            MASTER_PORT=29533 timeout 120 $PY examples/llama_train.py --steps 1 --save "$ckpt" \
            >"$LOGS/serve_ckpt.log" 2>&1
        fi
        gen=("$BUILD/llama_generate" --checkpoint "$ckpt" --prompt 1,2,3,4,5 --max_new_tokens 16)
        tokens() { grep -o '{"tokens".*}' | head -1; }
        want=$(timeout 120 "${gen[@]}" --device cpu 2>>"$LOGS/llama_generate.log" | tokens)
        one=$(timeout 120 "${gen[@]}" --device cuda 2>>"$LOGS/llama_generate.log" | tokens)
        two=$(timeout 180 $PY tools/launch.py -n 2 -- "${gen[@]}" --device cuda \
          2>>"$LOGS/llama_generate.log" | tokens)
        echo "llama_generate: cpu $want; cuda $one; cuda, 2 processes $two"
        if [ -n "$want" ] && [ "$one" = "$want" ] && [ "$two" = "$want" ]; then
          summary+=("serving model on cuda: tokens equal the CPU's (1 process, 2 sharing the GPU)")
        else
          summary+=("serving model on cuda: tokens DIFFER or missing (cpu '$want', cuda '$one', 2 processes '$two'; log llama_generate.log)")
          engine=1
        fi
      else
        echo "FAILED to link llama_test or llama_generate"; tail -20 "$LOGS"/link-llama_*.log
        summary+=("serving model: FAILED to link"); engine=1
      fi
    fi
    # Hugging Face models on the GPU against transformers' CPU logits (NOTE [GPU check] above).
    if stage hf; then
      HF_OBJS=()
      for s in "${ENGINE_SRCS[@]}" "${HF_SRCS[@]}"; do HF_OBJS+=("$(obj_of "$s")"); done
      if [ ! -d "$DEPS/hf" ]; then
        summary+=("hf models on cuda: no $DEPS/hf (run tools/gpu/carry_deps.sh here)"); engine=1
      elif g++ -o "$BUILD/hf_logits" ${NOGTEST[@]} "${HF_OBJS[@]}" "${LINK_TAIL[@]}" \
          >"$LOGS/link-hf_logits.log" 2>&1; then
        hf_ok=0 hf_runs=0
        for dir in "$DEPS"/hf/*/; do
          name=$(basename "$dir")
          prompts=$($PY -c "import torch; r = torch.load('$dir/reference.pt'); \
print(';'.join(','.join(map(str, p)) for p in r['prompts']), r['steps'])")
          for run in "float32 1" "float32 2" "bfloat16 1"; do
            set -- $run
            out="$BUILD/hf-$name-$1-$2.safetensors"
            cmd=("$BUILD/hf_logits" --model "$dir" --prompts "${prompts% *}" --steps "${prompts#* }"
              --out "$out" --dtype "$1" --device cuda --block_size 4 --prefill_chunk 5)
            [ "$2" -gt 1 ] && cmd=($PY tools/launch.py -n "$2" -- "${cmd[@]}")
            hf_runs=$((hf_runs + 1))
            if timeout 180 "${cmd[@]}" >>"$LOGS/hf.log" 2>&1 &&
                $PY tools/gpu/hf_compare.py "$dir" "$out" "$1" "$name $1 on $2 cuda rank(s)" \
                  | tee -a "$LOGS/hf.log"; then
              hf_ok=$((hf_ok + 1))
            else
              echo "$name $1 on $2 cuda rank(s): FAILED (log hf.log)"
            fi
          done
        done
        summary+=("hf models on cuda: $hf_ok of $hf_runs runs equal transformers' (log hf.log)")
        [ "$hf_ok" -eq "$hf_runs" ] || engine=1
      else
        echo "FAILED to link hf_logits"; tail -20 "$LOGS/link-hf_logits.log"
        summary+=("hf models: FAILED to link"); engine=1
      fi
    fi
    # cuda_ipc's bus bandwidth on 2 ranks sharing the GPU against a device copy (64 MiB).
    if stage ipc_bench; then
      PYTHONPATH=$PYPKG timeout 120 $PY tools/launch.py -n 2 -- $PY tools/gpu/ipc_bandwidth.py \
        >"$LOGS/ipc_bench.log" 2>&1
      rc=$?
      grep '{' "$LOGS/ipc_bench.log"
      summary+=("cuda_ipc bandwidth (2 ranks, one GPU): $(grep -o '"what": "[a-z_]*".*"ratio_to_copy": [0-9.]*' \
        "$LOGS/ipc_bench.log" | sed -E 's/"what": "([a-z_]*)".*"ratio_to_copy": ([0-9.]*)/\1 \2x copy/' \
        | paste -sd, - || true) (exit $rc)")
      [ $rc -eq 0 ] || engine=1
    fi
    # ./x bench python's rows against PyTorch's DTensor, on the GPU (bench/pytorch_anchor.py).
    if stage bench; then
      PYTHONPATH=$PYPKG PYTHONSAFEPATH=1 timeout 300 $PY bench/python_bench.py --device cuda \
        --reps 5 >"$LOGS/bench_python_cuda.log" 2>&1
      rc=$?
      grep '^{' "$LOGS/bench_python_cuda.log"
      rows=$(grep -c '"ratio_to_pytorch"' "$LOGS/bench_python_cuda.log")
      summary+=("bench python on cuda: $rows rows against PyTorch's DTensor (exit $rc)")
      [ $rc -eq 0 ] || engine=1
    fi
  else
    echo "FAILED to link the extension (log link-ext.log)"; tail -20 "$LOGS/link-ext.log"; engine=1
    summary+=("extension: FAILED to link")
  fi
fi
for f in "$LOGS"/compile-*.log; do [ -f "$f" ] && { echo "== $f"; grep -m 20 'error' "$f"; }; done
[ -n "${OUT:-}" ] && for f in "$LOGS"/*.log; do echo "==== $f"; cat "$f"; done >"$OUT/gpu-check$VARIANT.log"
echo "== summary"; printf '%s\n' "compile: $([ $status -eq 0 ] && echo ok || echo FAILED)" "${summary[@]}"
[ $status -eq 0 ] && [ $failed -eq 0 ] && [ $engine -eq 0 ]
