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
import runpy
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

_PATH = list(sys.path)  # what a rank forked from here starts from (NOTE [preloaded ranks])
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


# NOTE [preloaded ranks]: with --preload (or DTENSOR_LAUNCH_PRELOAD=1), a command that is this
# Python running a script (`python3 script.py ARGS`) is not exec'd per rank: the launcher imports
# torch (and dtensor, when its sys.path has it) once, then forks each rank, which sets its own
# environment, arguments and sys.path as `python3 script.py` would and runs the script as __main__
# (runpy). A rank is still its own process (own session, pid, pipes, exit code, signals), but it
# skips the ~2 s of CPU that importing torch costs: 4 ranks start in ~2 s instead of ~8 on 2
# cores, and the test suite, whose CPU went ~70% to those imports, launches its ranks this way
# (pytest.bzl). The thread-count variables each rank gets are set before the import (libgomp and
# OpenBLAS size their pools when loaded). What differs from exec: /proc/PID/cmdline shows the
# launcher, and the ranks share Python's string hash seed (an exec'd rank draws its own); numpy's
# global generator, if loaded, is reseeded in each rank as a fresh import would. The default stays
# exec, as torchrun's.
def _preload_script(cmd):
    """The script of ``cmd`` when it is ``<this python> script.py ...``, else None."""
    if len(cmd) < 2 or cmd[1].startswith("-") or not cmd[1].endswith(".py"):
        return None
    import shutil

    exe = shutil.which(cmd[0]) or cmd[0]
    same = os.path.realpath(exe) == os.path.realpath(sys.executable)
    return cmd[1] if same and os.path.isfile(cmd[1]) else None


class _Forked:
    """The part of Popen the launcher uses, for a rank forked by _fork_rank."""

    def __init__(self, pid, stdout):
        self.pid, self.stdout, self.returncode = pid, stdout, None

    def _reap(self, flags):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, flags)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def poll(self):
        return self._reap(os.WNOHANG)

    def wait(self):
        return self._reap(0)


class _BecomeRank(BaseException):
    """Raised in a forked child: unwinds the launcher's frames, then __main__ runs the script."""

    def __init__(self, script, args, env):
        super().__init__()
        self.script, self.argv, self.env = script, list(args), env

    def run(self):
        os.environ.clear()
        os.environ.update(self.env)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sys.modules.pop("shm_clean", None)  # the launcher's, not the rank's
        sys.argv = [self.script] + self.argv
        sys.path[:] = _PATH if sys.flags.safe_path else \
            [os.path.dirname(os.path.abspath(self.script))] + _PATH[1:]
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        code, signum = 0, None
        try:
            runpy.run_path(self.script, run_name="__main__")
        except SystemExit as e:
            code = e.code
        except KeyboardInterrupt as e:
            self._print(e)
            signum = signal.SIGINT  # dies by SIGINT, as the interpreter does
        except BaseException as e:  # noqa: B036  (the interpreter's: print, exit 1)
            self._print(e)
            code = 1
        _exit(code, signum)

    def _print(self, e):
        """What `python3 script.py` does with an uncaught exception: sys.excepthook (dtensor's
        tells the peers why this rank left), with the traceback from the script's frame on."""
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != self.script:
            tb = tb.tb_next
        tb = tb or e.__traceback__
        sys.excepthook(type(e), e.with_traceback(tb), tb)  # the hook prints e.__traceback__


def _exit(code, signum=None):
    """Ends a forked rank as the interpreter's exit does (non-daemon threads joined, atexit
    handlers, stdio flushed, then C's exit: C atexit and C++ static destructors), without
    tearing down every module and object: that teardown of torch took ~0.6 s of CPU per rank,
    and a forked child skips it as multiprocessing's do."""
    import atexit
    import ctypes

    threading._shutdown()
    atexit._run_exitfuncs()
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError):
            pass
    if signum is not None:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    ctypes.PyDLL(None).exit((code or 0) & 0xFF)  # PyDLL: the GIL stays held (destructors)


def _fork_rank(script, args, env):
    read, write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        os.close(read)
        os.dup2(write, 1)
        os.dup2(write, 2)
        os.close(write)
        raise _BecomeRank(script, args, env)
    os.close(write)
    return _Forked(pid, os.fdopen(read, "rb"))


def main(argv):
    parser = argparse.ArgumentParser(prog="./x launch", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", "--nproc", type=int, required=True, help="number of ranks")
    parser.add_argument("--backend", default=None, help="collectives backend (DTENSOR_BACKEND)")
    parser.add_argument("--port", type=int, default=0, help="MASTER_PORT (default: a free port)")
    parser.add_argument("--preload", action="store_true",
                        help="fork `python3 script.py` ranks from a launcher that imported torch "
                             "once (NOTE [preloaded ranks]; also DTENSOR_LAUNCH_PRELOAD=1)")
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
    script = None
    if args.preload or os.environ.get("DTENSOR_LAUNCH_PRELOAD") == "1":
        script = _preload_script(cmd)
        if script is not None:
            # Libraries size their thread pools when loaded (libgomp, OpenBLAS): load them under
            # the thread counts each rank gets below.
            for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
                os.environ.setdefault(var, "1")
            import torch  # noqa: F401  (what each rank would import)
            try:
                import dtensor  # noqa: F401  (reads its environment lazily, in the rank)
            except ImportError:
                pass
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
        if script is not None:
            procs.append(_fork_rank(script, cmd[2:], env))
            continue
        try:
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        except OSError as e:
            print(f"./x launch: cannot start {cmd[0]}: {e}", file=sys.stderr)
            for q in procs:
                os.killpg(q.pid, signal.SIGKILL)
            return 127
        procs.append(p)
    # Forwarding threads start once every rank is started: no thread may run across a fork.
    for rank, p in enumerate(procs):
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
    forked = None
    try:
        code = main(sys.argv[1:])
    except _BecomeRank as rank:  # a forked rank (NOTE [preloaded ranks])
        forked, code = rank, 0
    if forked is not None:
        forked.__traceback__ = None  # drops the launcher's frames (its pipes, other ranks)
        forked.run()
    sys.exit(code)
