"""./x bench serve: the inference server (tools/serve.cc) under load, from a real HTTP client.

    ./x bench serve [--models demo,large] [--ranks 1,2,4] [--concurrency 1,8] [--requests 16]
                    [--max-tokens 64] [--checkpoint DIR]
    ./x bench serve --model HF_DIR|random:NAME ...   (a Hugging Face model against transformers:
                                                     bench/serve_hf.py)

For each model (MODELS: the demo's, from the checkpoint ./x demo saved, and a larger one with
random weights) and rank count the server starts on that many processes (shm), as ./x serve
starts it. For each concurrency C, C client
threads send streamed greedy completions back to back until --requests are done (prompts of 8..40
bytes, max_tokens each); then:
  tokens_per_s  generated tokens / wall time of the whole batch of requests;
  p50_ms/p99_ms the time between consecutive tokens of a request as the client sees them (each
                server-sent event carries the tokens of one step);
  ttft_p50_ms   time to the first token;
  rss_mb        each rank's resident memory after the run (the largest in rss_mb, all in
                rss_mb_per_rank).
One JSON line per (ranks, concurrency) with "bench": "serve", plus the ratio of concurrency 8's
tokens/s to concurrency 1's on the same ranks. "overhead": the share of a decode step outside
local ATen kernels and collectives, with "kernel_share" and "collective_share", from a second
server started with --profile under the same load (NOTE [step profile] in serving/metrics.h:
an upper bound; "profiled_step_ms" against the unprofiled server's "step_ms", rank 0's mean
decode step, shows what profiling costs); "weight_mb_rank0" against "model_mb" / ranks.
"""

import argparse
import json
import os
import statistics
import sys

from serve_client import REPO, Server, percentile, rank_pids, rss_mb, run_load


# The models: the demo's (the checkpoint ./x demo saved) and a larger one of the same shape
# with random weights, where a decode step is milliseconds of kernels, not tenths (the engine's
# per-op cost is fixed; its share depends on the model's size).
MODELS = {
    "demo": dict(vocab=512, dim=128, heads=8, hidden=384),
    "large": dict(vocab=8192, dim=1024, heads=16, hidden=4096),
}


def write_random_model(path, vocab, dim, heads, hidden):
    """A one-file safetensors model (what a one-process checkpoint is) with random weights."""
    import struct
    import torch
    shapes = {"tok_embeddings.weight": [vocab, dim], "attention_norm.weight": [dim],
              "attention.wq.weight": [dim, dim], "attention.wk.weight": [dim, dim],
              "attention.wv.weight": [dim, dim], "attention.wo.weight": [dim, dim],
              "ffn_norm.weight": [dim], "feed_forward.w1.weight": [hidden, dim],
              "feed_forward.w2.weight": [dim, hidden], "feed_forward.w3.weight": [hidden, dim],
              "norm.weight": [dim], "output.weight": [vocab, dim]}
    gen = torch.Generator().manual_seed(0)
    header, blobs, offset = {}, [], 0
    for name, shape in shapes.items():
        t = (torch.ones(shape) if len(shape) == 1 else
             torch.randn(shape, generator=gen) / shape[-1] ** 0.5).to(torch.float32)
        b = t.numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", help="default 1,2,4 (--model: 1,2)")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--requests", type=int, help="default 16 (--model: 8)")
    parser.add_argument("--max-tokens", type=int, help="default 64 (--model: 32)")
    parser.add_argument("--checkpoint", default=os.path.join(REPO, "out", "checkpoints", "llama"),
                        help="the demo model's checkpoint")
    parser.add_argument("--models", default="demo,large", help="demo and/or large (MODELS)")
    parser.add_argument("--model", help="a Hugging Face model directory, or random:NAME "
                        "(bench/serve_hf.py: against transformers' generate)")
    parser.add_argument("--dtype", help="--model: float32 or bfloat16 (random: default float32; "
                        "a directory: its config's)")
    parser.add_argument("--prompt-tokens", type=int, default=32, help="--model: prompt length")
    parser.add_argument("--c1-requests", type=int, default=4,
                        help="--model: requests at concurrency 1 (and transformers' batch 1)")
    parser.add_argument("--hf-threads", type=int,
                        help="--model: transformers' torch threads (default: the machine's cores)")
    parser.add_argument("--kv-cache-memory", default="512M", help="--model: per rank")
    args = parser.parse_args()
    serve_bin = os.environ["SERVE_BIN"]
    if args.model:
        import serve_hf
        args.ranks = args.ranks or "1,2"
        args.requests = args.requests or 8
        args.max_tokens = args.max_tokens or 32
        sys.exit(serve_hf.run(args, serve_bin))
    args.ranks = args.ranks or "1,2,4"
    args.requests = args.requests or 16
    args.max_tokens = args.max_tokens or 64
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    print(f"{'model':>5} {'ranks':>5} {'conc':>4} {'tokens/s':>9} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'ttft p50':>8} {'rss MB/rank':>12} {'overhead':>9}", flush=True)
    runs = []
    for name in args.models.split(","):
        ckpt = args.checkpoint
        if name != "demo":
            ckpt = f"/tmp/dtensor_serve_bench_{name}"
            if not os.path.exists(os.path.join(ckpt, "model.safetensors")):
                write_random_model(ckpt, **MODELS[name])
        runs += [(name, ckpt, int(r)) for r in args.ranks.split(",")]
    for name, checkpoint, n in runs:
        model = MODELS[name]
        # NOTE [step profile]: the overhead comes from a profiled server; the throughput rows
        # and "step_ms" from an unprofiled one under the same load ("profiled_step_ms" against
        # it shows what the profiler's callbacks cost). Kernel and collective times are not
        # taken across the two runs: on the large model their run-to-run noise is larger than
        # the engine's share.
        profiled = {}
        server = Server(n, serve_bin, checkpoint, max(concurrencies), profile=True, model=model)
        try:
            run_load(server, 2, 4, 8)
            for c in concurrencies:
                before = server.metrics()
                run_load(server, c, args.requests, args.max_tokens)
                after = server.metrics()
                d = {k: after[k] - before[k] for k in (
                    "dtensor_serve_profiled_decode_steps_total",
                    "dtensor_serve_profiled_decode_seconds_total",
                    "dtensor_serve_profiled_local_kernel_seconds_total",
                    "dtensor_serve_profiled_collective_seconds_total")}
                steps, step, kern, coll = d.values()
                profiled[c] = (step / steps, kern / steps, coll / steps)
            memory = {k: server.metrics()[k] for k in (
                "dtensor_serve_weight_bytes", "dtensor_serve_model_bytes",
                "dtensor_serve_kv_cache_bytes")}
        finally:
            server.stop()
        server = Server(n, serve_bin, checkpoint, max(concurrencies), model=model)
        try:
            run_load(server, 2, 4, 8)  # warm-up
            by_c = {}
            for c in concurrencies:
                before = server.metrics()
                tps, gaps, ttfts = run_load(server, c, args.requests, args.max_tokens)
                after = server.metrics()
                step = ((after["dtensor_serve_decode_seconds_total"]
                         - before["dtensor_serve_decode_seconds_total"])
                        / (after["dtensor_serve_decode_steps_total"]
                           - before["dtensor_serve_decode_steps_total"]))
                step_p, kern, coll = profiled[c]
                # One process runs plain tensors: no engine, nothing for it to time (null).
                overhead = {"overhead": round((step_p - kern - coll) / step_p, 4) if n > 1 else None,
                            "kernel_share": round(kern / step_p, 4) if n > 1 else None,
                            "collective_share": round(coll / step_p, 4),
                            "step_ms": round(step * 1e3, 3),
                            "profiled_step_ms": round(step_p * 1e3, 3)}
                pids = rank_pids(server.proc.pid)
                rss = [round(rss_mb(pids[r]), 1) for r in sorted(pids)]
                by_c[c] = tps
                row = {"bench": "serve", "model": name, "ranks": n, "concurrency": c,
                       "tokens_per_s": round(tps, 1),
                       "p50_ms": round(percentile(gaps, 0.5) * 1e3, 3),
                       "p99_ms": round(percentile(gaps, 0.99) * 1e3, 3),
                       "ttft_p50_ms": round(statistics.median(ttfts) * 1e3, 2),
                       "rss_mb": max(rss), "rss_mb_per_rank": rss, **overhead,
                       "weight_mb_rank0": round(memory["dtensor_serve_weight_bytes"] / 2**20, 3),
                       "model_mb": round(memory["dtensor_serve_model_bytes"] / 2**20, 3),
                       "kv_cache_mb_rank0": round(memory["dtensor_serve_kv_cache_bytes"] / 2**20,
                                                  3)}
                print(f"{name:>5} {n:>5} {c:>4} {tps:>9.1f} {row['p50_ms']:>7.2f} {row['p99_ms']:>7.2f} "
                      f"{row['ttft_p50_ms']:>8.2f} {max(rss):>12.1f} "
                      f"{'-' if row['overhead'] is None else format(row['overhead'], '.3f'):>9}",
                      flush=True)
                print(json.dumps(row), flush=True)
            if 1 in by_c and 8 in by_c:
                print(json.dumps({"bench": "serve", "model": name, "ranks": n, "op": "batching_gain",
                                  "c8_over_c1": round(by_c[8] / by_c[1], 2)}), flush=True)
        finally:
            server.stop()


if __name__ == "__main__":
    main()
