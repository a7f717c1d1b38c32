"""What the Python benchmarks share: per-call timing, a free port, and ranks of a script started
as processes (the launcher role torchrun plays). No benchmark imports another."""

import gc
import os
import socket
import subprocess
import sys
import tempfile
import time


def per_call_us(fn, n):
    gc_was = gc.isenabled()
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        fn(n)
        return (time.perf_counter_ns() - t0) / n / 1e3
    finally:
        if gc_was:
            gc.enable()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank, world, port, extra_env=None):
    """The variables torchrun gives rank `rank` of a `world`-rank job on this host."""
    return dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0", MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port), OMP_NUM_THREADS="1", **(extra_env or {}))


def run_job(cmd, world, timeout=900):
    """Runs `cmd` as each rank of a `world`-rank job (torchrun's variables); returns the exit
    codes and each rank's output (stdout and stderr together)."""
    port = free_port()
    outs = [tempfile.TemporaryFile() for _ in range(world)]
    try:
        procs = [subprocess.Popen(cmd, env=rank_env(rank, world, port), stdout=outs[rank],
                                  stderr=subprocess.STDOUT) for rank in range(world)]
        codes = [p.wait(timeout=timeout) for p in procs]
        texts = []
        for out in outs:
            out.seek(0)
            texts.append(out.read().decode(errors="replace"))
        return codes, texts
    finally:
        for out in outs:
            out.close()


def launch_self(argv, args, script, n=2, extra_env=None):
    """Starts `script` as rank 0 (output here) and ranks 1.. (output kept, shown if something
    fails); `args.backend`, when set, is the engine's collectives backend."""
    port = free_port()
    procs = []
    with tempfile.TemporaryFile() as log1:
        for rank in range(n):
            env = rank_env(rank, n, port, extra_env)
            if args.backend:
                env["DTENSOR_BACKEND"] = args.backend
            out = None if rank == 0 else log1
            procs.append(subprocess.Popen([sys.executable, os.path.abspath(script)] + argv,
                                          env=env, stdout=out,
                                          stderr=None if rank == 0 else subprocess.STDOUT))
        codes = [p.wait() for p in procs]
        if any(codes):
            log1.seek(0)
            sys.stderr.write("python bench: ranks 1.. output:\n" +
                             log1.read().decode(errors="replace"))
            sys.stderr.write(f"python bench: exit codes {codes}\n")
            return 1
    return 0
