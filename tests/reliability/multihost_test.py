"""Two hosts inside one machine: two Linux network namespaces joined by a veth pair,
two ranks in each on the c10d (Gloo) backend, MASTER_ADDR the first host's veth address, and no
address outside those namespaces. Checks: a tensor-parallel training step across the hosts equals
the same step in one process; when one host's ranks are killed (SIGKILL), the other host's ranks
fail with an error naming the collective, the group and the rank, within the collective timeout
plus a few seconds, and exit non-zero.

Needs root (network namespaces); skips with the reason otherwise, or when the kernel refuses.
Namespaces, the veth pair and every rank process are removed whatever happens.
"""

import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
import torch

TIMEOUT_MS = 5000  # DTENSOR_COLLECTIVE_TIMEOUT_MS of the ranks
GRACE_S = 4.0  # what the survivors may take beyond the timeout to report and exit
PORT = 29500  # free by construction: nothing else lives in the fresh namespaces


class Hosts:
    """Two network namespaces ("hosts") a and b, joined by veth[0] <-> veth[1]."""

    def __init__(self, ip):
        tag = f"{os.getpid() % 100000}{uuid.uuid4().hex[:3]}"
        self.ip = ip
        self.ns = [f"dtmh{tag}a", f"dtmh{tag}b"]
        self.veth = [f"dtv{tag}a", f"dtv{tag}b"]  # interface names: at most 15 characters
        subnet = os.getpid() % 250 + 1
        self.addr = [f"10.231.{subnet}.1", f"10.231.{subnet}.2"]
        self.made = []

    def run(self, *args):
        return subprocess.run([self.ip, *args], capture_output=True, text=True, timeout=20)

    def create(self):
        """None, or why the machine cannot host the namespaces (the skip reason)."""
        for ns in self.ns:
            r = self.run("netns", "add", ns)
            if r.returncode != 0:
                return f"`ip netns add {ns}` failed: {r.stderr.strip()}"
            self.made.append(ns)
        r = self.run("link", "add", self.veth[0], "netns", self.ns[0], "type", "veth", "peer",
                     "name", self.veth[1], "netns", self.ns[1])
        if r.returncode != 0:
            return f"cannot create a veth pair: {r.stderr.strip()}"
        for ns, dev, addr in zip(self.ns, self.veth, self.addr):
            for cmd in (["addr", "add", f"{addr}/24", "dev", dev], ["link", "set", dev, "up"],
                        ["link", "set", "lo", "up"]):
                r = self.run("-n", ns, *cmd)
                if r.returncode != 0:
                    return f"`ip -n {ns} {' '.join(cmd)}` failed: {r.stderr.strip()}"
        # The hosts see each other through the pair.
        ping = shutil.which("ping")
        if ping:
            r = subprocess.run([self.ip, "netns", "exec", self.ns[1], ping, "-c", "1", "-W", "2",
                                self.addr[0]], capture_output=True, text=True, timeout=20)
            if r.returncode != 0:
                return f"host b cannot reach host a over the veth pair: {r.stdout}{r.stderr}"
        return None

    def remove(self):
        for ns in self.made:  # deleting a namespace deletes the veth end inside it
            self.run("netns", "del", ns)
        self.run("link", "del", self.veth[0])  # only if it never left the root namespace
        left = self.run("netns", "list").stdout
        assert not any(ns in left for ns in self.made), f"namespaces left: {left}"


@pytest.fixture
def hosts():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add)")
    ip = shutil.which("ip") or next((p for p in ("/usr/sbin/ip", "/sbin/ip") if os.path.exists(p)),
                                    None)
    if ip is None:
        pytest.skip("no `ip` command (iproute2) to make network namespaces")
    h = Hosts(ip)
    try:
        why = h.create()
        if why is not None:
            pytest.skip(f"the kernel refuses the two-host setup: {why}")
        yield h
    finally:
        h.remove()


class Job:
    """Four rank processes: global ranks 0, 1 on host a, 2, 3 on host b."""

    def __init__(self, hosts, tmp_path, body):
        script = tmp_path / "rank.py"
        script.write_text(PRELUDE + textwrap.dedent(body))
        token = uuid.uuid4().hex
        self.procs = []
        for rank in range(4):
            host = rank // 2
            env = dict(os.environ, PYTHONSAFEPATH="1",
                       PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
                       RANK=str(rank), WORLD_SIZE="4", LOCAL_RANK=str(rank % 2),
                       LOCAL_WORLD_SIZE="2", GROUP_RANK=str(host), MASTER_ADDR=hosts.addr[0],
                       MASTER_PORT=str(PORT), GLOO_SOCKET_IFNAME=hosts.veth[host],
                       DTENSOR_BACKEND="c10d", DTENSOR_COLLECTIVE_TIMEOUT_MS=str(TIMEOUT_MS),
                       DTENSOR_JOB_TOKEN=token, OMP_NUM_THREADS="1")
            # `ip netns exec` execs the command: the process is the rank itself. Unbuffered bytes:
            # read_until selects on the pipes and splits lines itself.
            self.procs.append(subprocess.Popen(
                [hosts.ip, "netns", "exec", hosts.ns[host], sys.executable, str(script)],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0,
                start_new_session=True))
        self.lines = [[] for _ in self.procs]
        self.partial = [b"" for _ in self.procs]
        self.exited = [None] * 4  # monotonic time each rank's output closed

    def _take(self, r, data):
        """Appends the complete lines of `data` to rank r's lines; keeps the rest."""
        *done, self.partial[r] = (self.partial[r] + data).split(b"\n")
        new = [l.decode(errors="replace") for l in done]
        self.lines[r] += new
        return new

    def read_until(self, ranks, pattern, limit_s):
        """Reads the ranks' output until each printed a line matching `pattern` (or exited)."""
        sel = selectors.DefaultSelector()
        for r in ranks:
            sel.register(self.procs[r].stdout, selectors.EVENT_READ, r)
        waiting = set(ranks)
        deadline = time.monotonic() + limit_s
        while waiting and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.2):
                r = key.data
                data = os.read(key.fileobj.fileno(), 65536)
                if not data:
                    self.exited[r] = time.monotonic()
                    self._take(r, b"\n" if self.partial[r] else b"")
                    sel.unregister(key.fileobj)
                    waiting.discard(r)
                    continue
                if any(re.search(pattern, l) for l in self._take(r, data)):
                    waiting.discard(r)
                    sel.unregister(key.fileobj)
        sel.close()
        return not waiting

    def output(self):
        return "\n".join(f"[rank {r}] {l}" for r, ls in enumerate(self.lines) for l in ls)

    def finish(self, ranks, limit_s):
        """Reads the ranks' remaining output until they exit; their return codes (None: running)."""
        deadline = time.monotonic() + limit_s
        for r in ranks:
            p = self.procs[r]
            try:
                rest, _ = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                continue
            if self.exited[r] is None:
                self.exited[r] = time.monotonic()
            self._take(r, rest or b"")
            if self.partial[r]:
                self._take(r, b"\n")  # a last line without its newline
        return [self.procs[r].poll() for r in ranks]

    def kill(self, ranks):
        """SIGKILL to every rank of `ranks` at once (a host dying), then reaps them."""
        for r in ranks:
            if self.procs[r].poll() is None:
                os.killpg(self.procs[r].pid, signal.SIGKILL)  # its own session: only the rank
        for r in ranks:
            self.procs[r].wait()

    def close(self):
        self.kill(range(4))
        for p in self.procs:
            p.stdout.close()


# The model and the step, run by the ranks and by the one-process reference alike.
MODEL = """
import torch
import torch.nn as nn
import torch.nn.functional as F

class MLP(nn.Module):
    def __init__(self, dim=8, hidden=16):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden)
        self.w2 = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.w2(F.relu(self.w1(x)))

def train_step(model, x):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt.zero_grad()
    loss = model(x).pow(2).sum()
    loss.backward()
    opt.step()
    return loss
"""

PRELUDE = MODEL + """
import json, os, sys, time
import dtensor
import dtensor._functional_collectives as funcol
RANK = int(os.environ["RANK"])
NETNS = os.stat("/proc/self/ns/net").st_ino
"""

TRAIN = """
    torch.set_default_dtype(torch.float64)
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(4, 8)
    mesh = dtensor.init_device_mesh("cpu", (4,))
    from dtensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    model = parallelize_module(model, mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})
    loss = train_step(model, x)
    params = {n: p.full_tensor().tolist() for n, p in model.named_parameters()}
    placements = {n: [repr(q) for q in p.placements] for n, p in model.named_parameters()}
    print("RESULT " + json.dumps({"netns": NETNS, "loss": loss.item(), "params": params,
                                  "placements": placements}), flush=True)
"""


def test_tensor_parallel_step_across_two_hosts_equals_one_process(hosts, tmp_path):
    import dtensor

    job = Job(hosts, tmp_path, TRAIN)
    try:
        done = job.read_until(range(4), r"^RESULT ", 45)
        codes = job.finish(range(4), 10)
    finally:
        job.close()
    out = job.output()
    assert done and codes == [0, 0, 0, 0], out
    results = [json.loads(next(l for l in ls if l.startswith("RESULT "))[len("RESULT "):])
               for ls in job.lines]
    # Two hosts: ranks 0 and 1 share one network namespace, 2 and 3 another.
    ns = [r["netns"] for r in results]
    assert ns[0] == ns[1] != ns[2] == ns[3], ns
    # One process: the same seed, model, input and step.
    scope = {}
    exec(MODEL, scope)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        torch.manual_seed(0)
        model, x = scope["MLP"](), torch.randn(4, 8)
        loss = scope["train_step"](model, x).item()
    finally:
        torch.set_default_dtype(default)
    colwise, rowwise = [repr(dtensor.Shard(0))], [repr(dtensor.Shard(1))]
    for r, got in enumerate(results):
        assert got["placements"] == {"w1.weight": colwise, "w1.bias": colwise,
                                     "w2.weight": rowwise, "w2.bias": [repr(dtensor.Replicate())]}
        assert got["loss"] == pytest.approx(loss, rel=1e-12, abs=1e-12), (r, got["loss"], loss)
        for name, p in model.named_parameters():
            torch.testing.assert_close(torch.tensor(got["params"][name], dtype=torch.float64),
                                       p.detach(), rtol=1e-12, atol=1e-12,
                                       msg=lambda m: f"rank {r} {name}: {m}")


LOOP = """
    funcol.init_from_env()
    funcol.all_reduce(torch.ones(4))
    print("ready", flush=True)
    t0 = time.monotonic()
    i = 0
    try:
        while time.monotonic() - t0 < 60:
            funcol.all_reduce(torch.full((1024,), float(i)))
            i += 1
            time.sleep(0.01)
        print("no error", flush=True)
    except RuntimeError as e:
        print(f"ERROR at {time.monotonic():.3f} after {i} all_reduces: {e}", flush=True)
        sys.exit(3)
"""


@pytest.mark.parametrize("killed", ["b", "a"])
def test_killing_one_host_fails_the_other_within_the_timeout(hosts, tmp_path, killed):
    """Host b holds ranks 2 and 3; host a holds ranks 0 (the rendezvous store) and 1."""
    dead, alive = ([2, 3], [0, 1]) if killed == "b" else ([0, 1], [2, 3])
    job = Job(hosts, tmp_path, LOOP)
    try:
        assert job.read_until(range(4), r"^ready$", 30), job.output()
        time.sleep(0.3)  # a few all_reduces in flight
        t_kill = time.monotonic()
        job.kill(dead)
        codes = job.finish(alive, TIMEOUT_MS / 1000 + GRACE_S + 5)
    finally:
        job.close()
    out = job.output()
    print(out)  # the errors, for the record
    bound = TIMEOUT_MS / 1000 + GRACE_S
    for r, code in zip(alive, codes):
        assert code is not None, f"rank {r} still ran {bound + 5:.0f} s after the kill:\n{out}"
        assert code != 0, f"rank {r} exited 0 after its peers were killed:\n{out}"
        errors = [l for l in job.lines[r] if l.startswith("ERROR ")]
        assert errors, f"rank {r} printed no error:\n{out}"
        msg = errors[-1]
        raised = float(re.match(r"ERROR at ([\d.]+)", msg).group(1)) - t_kill  # one clock
        exited = job.exited[r] - t_kill  # an upper bound: read after the earlier ranks'
        print(f"rank {r}: error {raised:.2f} s, exit <= {exited:.2f} s after the kill")
        assert raised <= bound and exited <= bound, \
            f"rank {r}: error after {raised:.1f} s, exit after {exited:.1f} s (bound {bound:.1f} s):\n{out}"
        # The engine's error: the collective, the group, and the rank(s) at fault.
        assert "all_reduce" in msg, msg
        assert re.search(r"group '[^']+'", msg), msg
        assert re.search(r"rank", msg), msg
