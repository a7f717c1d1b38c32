"""./x launch -n N [--backend NAME] -- CMD ARGS...

Starts N local ranks of CMD with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), forwards their output line by line with a
"[rank i] " prefix, and exits non-zero if any rank fails. When a rank fails, the others get
DTENSOR_LAUNCH_GRACE_S seconds (default: the collective timeout, DTENSOR_COLLECTIVE_TIMEOUT_MS,
capped at 30 s) to finish or fail on their own (their collectives time out and say why), then
they are killed. On SIGINT/SIGTERM the launcher sends SIGTERM to every rank and SIGKILL
DTENSOR_LAUNCH_STOP_GRACE_S seconds later (default 1); it exits 0 when every rank exited 0.

Each launch gets a token (DTENSOR_JOB_TOKEN, NOTE [job identity] in collectives/launch_env.cc):
every rank proves with it that it belongs to this launch, and the job's shared-memory segments are
named after it, so the launcher removes them when it ends, whatever happened to the ranks (NOTE
[stale segments] in tools/shm_clean.py).
"""

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # also under PYTHONSAFEPATH=1
import shm_clean  # noqa: E402


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_grace_s():
    """How long the other ranks get after one failed (see the module doc)."""
    if "DTENSOR_LAUNCH_GRACE_S" in os.environ:
        return float(os.environ["DTENSOR_LAUNCH_GRACE_S"])
    try:
        timeout_s = int(os.environ.get("DTENSOR_COLLECTIVE_TIMEOUT_MS", "300000")) / 1000.0
    except ValueError:
        timeout_s = 30.0  # the ranks report the malformed value themselves
    return min(max(timeout_s, 1.0), 30.0) + 1.0


def forward(rank, stream, lock):
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        with lock:
            sys.stdout.write(f"[rank {rank}] {line}\n")
            sys.stdout.flush()
    stream.close()


def main(argv):
    parser = argparse.ArgumentParser(prog="./x launch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--nproc", type=int, required=True, help="number of ranks")
    parser.add_argument("--backend", default=None, help="collectives backend (DTENSOR_BACKEND)")
    parser.add_argument("--port", type=int, default=0, help="MASTER_PORT (default: a free port)")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("no command given (./x launch -n N -- CMD ARGS...)")
    if args.nproc < 1:
        parser.error("-n must be at least 1")
    port = args.port or free_port()
    token = os.environ.get("DTENSOR_JOB_TOKEN") or uuid.uuid4().hex
    grace = launch_grace_s()
    shm_clean.remove_stale()
    lock = threading.Lock()
    procs, threads = [], []
    for rank in range(args.nproc):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(args.nproc), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(args.nproc), GROUP_RANK="0",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), DTENSOR_JOB_TOKEN=token)
        if args.backend:
            env["DTENSOR_BACKEND"] = args.backend
        # One compute thread per rank unless the caller says otherwise, as torchrun does for
        # OpenMP; also OpenBLAS's own pool (NOTE [BLAS] in x).
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            env.setdefault(var, "1")
        try:
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        except OSError as e:
            print(f"./x launch: cannot start {cmd[0]}: {e}", file=sys.stderr)
            for q in procs:
                os.killpg(q.pid, signal.SIGKILL)
            return 127
        procs.append(p)
        t = threading.Thread(target=forward, args=(rank, p.stdout, lock), daemon=True)
        t.start()
        threads.append(t)

    def kill_all(sig):
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    pass

    def stop(code):
        # Interrupted: the ranks get SIGTERM, then SIGKILL after DTENSOR_LAUNCH_STOP_GRACE_S
        # (default 1 s; ./x serve gives its ranks time to drain); the job's segments go. When
        # every rank exits 0 by itself within the grace (a server that drained), so does the
        # launcher.
        kill_all(signal.SIGTERM)
        deadline = time.monotonic() + float(os.environ.get("DTENSOR_LAUNCH_STOP_GRACE_S", "1"))
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.02)
        kill_all(signal.SIGKILL)
        for p in procs:
            p.wait()
        for t in threads:
            t.join(timeout=1.0)
        shm_clean.remove_job(f"job-{token}-0")
        sys.stdout.flush()
        os._exit(0 if all(p.returncode == 0 for p in procs) else code)

    # NOTE [launcher signals]: the handlers only record the signal; the loop below stops the
    # ranks. A handler runs between two bytecodes of the main thread, which may be inside
    # Popen.poll() holding that Popen's lock: stop()'s p.wait() in the handler then waited on
    # a lock its own thread held, forever (a server's SIGTERM hung the launcher in CI).
    interrupted = []
    signal.signal(signal.SIGINT, lambda *_: interrupted.append(130))
    signal.signal(signal.SIGTERM, lambda *_: interrupted.append(143))
    first_failure, failed_at = None, None
    while any(p.poll() is None for p in procs):
        if interrupted:
            stop(interrupted[0])
        for rank, p in enumerate(procs):
            if p.poll() not in (None, 0) and first_failure is None:
                first_failure, failed_at = (rank, p.returncode), time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > grace:
            with lock:
                print(f"./x launch: rank {first_failure[0]} failed; killing the ranks still "
                      f"running after {grace:.0f} s", file=sys.stderr)
            kill_all(signal.SIGKILL)
        time.sleep(0.02)
    for t in threads:
        t.join()
    shm_clean.remove_job(f"job-{token}-0")
    codes = [p.returncode for p in procs]
    bad = [(r, c) for r, c in enumerate(codes) if c != 0]
    if bad:
        desc = ", ".join(f"rank {r} exited with {c}" for r, c in bad)
        print(f"./x launch: {len(bad)} of {len(procs)} ranks failed: {desc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
