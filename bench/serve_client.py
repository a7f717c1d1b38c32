"""The HTTP side of the serving benchmarks: a server of tools/serve.cc started on N ranks, a load
of streamed completions from client threads, and the small measures both benchmarks read
(bench/serve_bench.py against the engine's own models, bench/serve_hf.py against transformers).
Both import this module; neither imports the other's internals."""

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def percentile(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    k = min(len(values) - 1, max(0, int(round(q * (len(values) - 1)))))
    return values[k]


def rank_pids(launcher_pid):
    pids = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) != launcher_pid:
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            pids[int(env[b"RANK"])] = int(pid)
        except (OSError, ValueError, KeyError, IndexError):
            continue
    return pids


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


class Server:
    def __init__(self, n, serve_bin, checkpoint, max_batch, profile=False, model=None, extra=()):
        """`checkpoint`: the demo model's; None serves what `extra` names (--model DIR ...)."""
        self.port_file = f"/tmp/dtensor_serve_bench_port_{os.getpid()}_{n}"
        if os.path.exists(self.port_file):
            os.remove(self.port_file)
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(REPO, "tools", "launch.py"), "-n", str(n), "--",
             serve_bin] + (["--checkpoint", checkpoint] if checkpoint else list(extra)) +
            ["--port", "0", "--port-file", self.port_file,
             "--max-batch", str(max_batch)] + (["--profile"] if profile else []) +
            [f"--{k}={v}" for k, v in (model or {}).items()],
            env=dict(os.environ, DTENSOR_LAUNCH_STOP_GRACE_S="60"),
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while not os.path.exists(self.port_file):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server on {n} ranks did not start")
            time.sleep(0.05)
        self.port = int(open(self.port_file).read())

    def stream(self, prompt, max_tokens):
        """(time to first token, gaps between tokens, tokens) of one streamed completion."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        t0 = time.perf_counter()
        conn.request("POST", "/v1/completions", body=json.dumps(
            {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}))
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]}")
        times, tokens = [], 0
        for line in resp:
            if not line.startswith(b"data: "):
                continue
            if line.strip() == b"data: [DONE]":
                break
            now = time.perf_counter()
            n = len(json.loads(line[6:])["choices"][0]["token_ids"])
            tokens += n
            times.extend([now] * max(n, 1))
        conn.close()
        gaps = [b - a for a, b in zip(times, times[1:])]
        return times[0] - t0, gaps, tokens

    def complete(self, prompt, max_tokens):
        """The token ids of one greedy, unstreamed completion."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        conn.request("POST", "/v1/completions", body=json.dumps(
            {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}))
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {body[:200]}")
        return json.loads(body)["choices"][0]["token_ids"]

    def metrics(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#") and "{" not in line:
                name, value = line.split()
                out[name] = float(value)
        return out

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        if os.path.exists(self.port_file):
            os.remove(self.port_file)


def run_load(server, concurrency, requests, max_tokens, prompts=None):
    """`prompts`: request i sends prompts[i % len]; else texts of 8..40 bytes."""
    lock = threading.Lock()
    next_i, ttfts, gaps, total = [0], [], [], [0]

    def client():
        while True:
            with lock:
                i = next_i[0]
                if i >= requests:
                    return
                next_i[0] += 1
            prompt = (prompts[i % len(prompts)] if prompts else
                      ("the quick brown fox jumps over " * 2)[: 8 + (i * 7) % 33])
            ttft, g, n = server.stream(prompt, max_tokens)
            with lock:
                ttfts.append(ttft)
                gaps.extend(g)
                total[0] += n

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return total[0] / wall, gaps, ttfts
