# shellcheck shell=bash
# ./x demo, run, pythonpath, serve, launch, clean: starting ranks and the programs on them.

x_help demo '  demo [-n N] [args]
                  train a Llama-style model parallelized with dtensor.parallel.parallelize_module
                  on N (default 4) processes (examples/llama_train.py); print its loss next to one
                  process'\''s, time per step and the collectives of a step ([--steps 5]
                  [--mesh 2,2])'
x_help demo '  demo cpp [-n N] [args]
                  the same kind of training from C++ (examples/tp_train.cc, plain ATen calls on
                  distributed tensors; [--steps 5] [--backend shm|c10d] [--mesh 2,2])'
x_help demo '  demo fsdp [-n N] [args]
                  the same model trained with FSDP (dtensor.fsdp.fully_shard) on N (default 4)
                  processes, then FSDP x TP on (N/2, 2); loss next to one process'\''s, the
                  collectives of a step and the training state per rank (examples/llama_fsdp.py;
                  [--steps 5] [--tp 2])'
x_help demo '  demo pp [-n N] [args]
                  the same model in 2 pipeline stages, each tensor parallel (pp=2 x tp=2 on 4
                  processes), then also fully_shard'\''ed (pp=2 x dp=2 x tp=2 on 8); -n N: only
                  pp=2 x tp=N/2 (dtensor.pipelining over cross-mesh redistributes); loss next to
                  one process'\''s and each rank'\''s schedule timeline (examples/llama_pp.py;
                  [--steps 5] [--microbatches 4] [--schedule 1f1b|gpipe])'
x_help demo '  demo cp [-n N] [args]
                  the same model (attention through causal SDPA) with context parallelism
                  (ring attention, dtensor.experimental.context_parallel) on 4 processes, on a
                  sequence 4x the demo'\''s, then composed with FSDP and tensor parallelism
                  (dp=2 x cp=2 x tp=2 on 8); -n N: only cp on N; loss next to one process'\''s
                  and the peak memory of a step per rank (examples/llama_cp.py; [--steps 5]
                  [--seq 128] [--rotate allgather|alltoall])'
x_help demo '  demo layout [args]
                  lay a real tensor out on a mesh and show what each rank holds
                  (--mesh 2,2 --shape 10,7 --placements "S(0),S(1)" [--names dp,tp] [--order "0:1,0"])'
x_help run '  run [-n N] [--backend shm|c10d] [--opt] [--as-torch] script.py [args...]
                  build the dtensor Python package and start N (default 2) local ranks of
                  `python3 script.py args` with torchrun'\''s variables and PYTHONPATH set, so
                  dtensor.init_device_mesh("cpu", (N,)) joins the job (backend: $DTENSOR_BACKEND,
                  default shm); --opt uses the -c opt build; --as-torch (or DTENSOR_AS_TORCH=1)
                  runs `python3 -m dtensor.as_torch script.py args`: torch.distributed.tensor'\''s
                  names resolve to the engine'\''s (NOTE [torch names on the engine])'
x_help pythonpath '  pythonpath [--opt]
                  build the dtensor Python package and print the `export PYTHONPATH=...
                  PYTHONSAFEPATH=1` line that makes `import dtensor` work anywhere, e.g. under
                  python3 -m torch.distributed.run --nproc_per_node N script.py
                  (use: eval "$(./x pythonpath)")'
x_help serve '  serve [-n N] [--model HF_DIR | --checkpoint DIR] [--port P] [--device cuda]
                  the tensor-parallel inference server (OpenAI /v1/completions) on N ranks
                  (on GPUs with --device cuda): a Hugging Face model directory (Llama, Mistral,
                  Qwen2, Qwen3; [--dtype bfloat16] [--kv-cache-memory 2G] [--context N]
                  [--prefill-chunk 512]), or the demo'\''s model'
x_help launch '  launch -n N [--backend B] -- CMD ARGS...
                  start N local ranks of CMD with torchrun'\''s variables and a launch token,
                  output prefixed by rank; removes the job'\''s shared memory when it ends'
x_help clean '  clean           remove leftover shared-memory segments of dead jobs from /dev/shm
                  (never a live job'\''s; NOTE [stale segments] in tools/shm_clean.py)'

cmd_pythonpath() {
  local flags=()
  case "$*" in
    "") ;;
    --opt|"-c opt") flags=(-c opt) ;;
    *) echo "usage: ./x pythonpath [--opt]" >&2; return 2 ;;
  esac
  local dir
  dir=$(stage_python "${flags[@]}")
  echo "export PYTHONPATH=$dir PYTHONSAFEPATH=1"
}

cmd_run() {
  local n=2 backend=() flags=() as_torch=()
  [ "${DTENSOR_AS_TORCH:-}" = 1 ] && as_torch=(-m dtensor.as_torch)
  while [ $# -gt 0 ]; do
    case "$1" in
      --as-torch) as_torch=(-m dtensor.as_torch); shift ;;
      -n) n=$2; shift 2 ;;
      -n*) n=${1#-n}; shift ;;
      --backend) backend=(--backend "$2"); shift 2 ;;
      --backend=*) backend=(--backend "${1#--backend=}"); shift ;;
      --opt) flags=(-c opt); shift ;;
      --) shift; break ;;
      -*) echo "./x run: unknown option '$1' (usage: ./x run -n N [--backend shm|c10d] [--opt] [--as-torch] script.py args...)" >&2
          return 2 ;;
      *) break ;;
    esac
  done
  if [ $# -eq 0 ]; then
    echo "usage: ./x run -n N [--backend shm|c10d] [--opt] [--as-torch] script.py args..." >&2
    return 2
  fi
  local dir launch=$PWD/tools/launch.py
  dir=$(stage_python "${flags[@]}")
  cd "$CALLER_PWD"
  PYTHONPATH="$dir${PYTHONPATH:+:$PYTHONPATH}" PYTHONSAFEPATH=1 \
    exec "$PY" "$launch" -n "$n" "${backend[@]}" -- "$PY" "${as_torch[@]}" "$@"
}

# demo_python WHAT SCRIPT [-n N] [args]: SCRIPT on N (default 4) processes (shm) with the -c opt
# package, after a line saying WHAT runs.
demo_python() {
  local what=$1 script=$2 n=4 dir
  shift 2
  if [ "${1:-}" = -n ]; then n=$2; shift 2; fi
  dir=$(stage_python -c opt)
  echo "./x demo: $what, on $n processes (shm)" >&2
  PYTHONPATH="$dir" PYTHONSAFEPATH=1 "$PY" tools/launch.py -n "$n" -- "$PY" "$script" "$@"
}

cmd_demo() {
  ensure_packages
  mkdir -p "$DISK_CACHE"
  case "${1:-}" in
    layout)
      shift
      bz build //examples:layout_demo >&2
      "$(bin_path examples/layout_demo)" "$@"
      return ;;
    fsdp)
      shift
      demo_python "FSDP, then FSDP x TP" examples/llama_fsdp.py "$@"
      return ;;
    cp)
      shift
      if [ "${1:-}" = -n ]; then  # one run: cp=N
        demo_python "context parallelism (ring attention)" examples/llama_cp.py "$@"
        return
      fi
      demo_python "context parallelism (ring attention)" examples/llama_cp.py -n 4 "$@" || return
      demo_python "dp x cp x tp (FSDP, ring attention, tensor parallel)" examples/llama_cp.py \
        -n 8 --mesh 2,2,2 "$@"
      return ;;
    pp)
      shift
      if [ "${1:-}" = -n ]; then  # one run: pp=2 x tp=N/2
        local n=$2
        shift 2
        demo_python "2 pipeline stages x tensor parallel" examples/llama_pp.py -n "$n" \
          --mesh "2,$((n / 2))" "$@"
        return
      fi
      demo_python "2 pipeline stages x tensor parallel" examples/llama_pp.py -n 4 \
        --mesh 2,2 "$@" || return
      demo_python "2 pipeline stages x FSDP x tensor parallel" examples/llama_pp.py -n 8 \
        --mesh 2,2,2 "$@"
      return ;;
    cpp)
      shift
      local n=4
      if [ "${1:-}" = -n ]; then n=$2; shift 2; fi
      bz build //examples:tp_train >&2
      echo "./x demo cpp: tensor-parallel training of a transformer block in C++ on $n processes (shm)" >&2
      /usr/bin/python3 tools/launch.py -n "$n" -- "$(bin_path examples/tp_train)" --mesh "$n" "$@"
      return ;;
  esac
  local n=4
  if [ "${1:-}" = -n ]; then n=$2; shift 2; fi
  echo "./x demo: building the dtensor package..." >&2
  local dir
  dir=$(stage_python -c opt)
  echo "./x demo: a Llama-style model parallelized with parallelize_module, trained on $n processes (shm)" >&2
  PYTHONPATH="$dir" PYTHONSAFEPATH=1 "$PY" tools/launch.py -n "$n" -- \
    "$PY" examples/llama_train.py "$@"
}

# ensure_demo_checkpoint WHO: runs ./x demo (which trains and saves) when out/checkpoints/llama
# holds no checkpoint yet.
ensure_demo_checkpoint() {
  [ -f out/checkpoints/llama/model.safetensors.index.json ] && return 0
  echo "./x $1: no checkpoint at out/checkpoints/llama: running ./x demo to train and save one" >&2
  cmd_demo >&2
}

# ./x serve [-n N] [--checkpoint DIR] [--port P] [serve flags]: the inference server (tools/serve.cc)
# on N ranks (processes, shm) through the launcher; rank 0 serves HTTP. Without --checkpoint it
# serves the model ./x demo saved (out/checkpoints/llama), running the demo first when there is
# none. SIGTERM or Ctrl-C drains: in-flight requests finish, then every rank exits 0.
cmd_serve() {
  local n=1 ckpt="" model="" port=8000 rest=() source=()
  while [ $# -gt 0 ]; do
    case "$1" in
      -n) n=$2; shift 2 ;;
      --checkpoint) ckpt=$2; shift 2 ;;
      --model) model=$2; shift 2 ;;
      --port) port=$2; shift 2 ;;
      *) rest+=("$1"); shift ;;
    esac
  done
  if [ -n "$model" ]; then
    # A Hugging Face model directory: relative to where ./x was called.
    case "$model" in /*) ;; *) model="$CALLER_PWD/$model" ;; esac
    source=(--model "$model")
  else
    if [ -z "$ckpt" ]; then
      ckpt=out/checkpoints/llama
      ensure_demo_checkpoint serve
    fi
    source=(--checkpoint "$ckpt")
  fi
  ensure_packages
  mkdir -p "$DISK_CACHE"
  bz build -c opt //tools:serve >&2
  DTENSOR_LAUNCH_STOP_GRACE_S=${DTENSOR_LAUNCH_STOP_GRACE_S:-120} /usr/bin/python3 tools/launch.py \
    -n "$n" -- "$(bin_path tools/serve -c opt)" "${source[@]}" --port "$port" "${rest[@]}"
}

cmd_launch() {
  /usr/bin/python3 tools/launch.py "$@"
}

cmd_clean() {
  /usr/bin/python3 tools/shm_clean.py "$@"
}
