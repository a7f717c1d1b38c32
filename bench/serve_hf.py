"""./x bench serve --model DIR | random:NAME: the server on a Hugging Face model against transformers.

    ./x bench serve --model random:qwen2.5-0.5b [--dtype float32|bfloat16] [--ranks 1,2]
                    [--concurrency 1,8] [--requests 8] [--c1-requests 4] [--max-tokens 32]
                    [--prompt-tokens 32] [--kv-cache-memory 512M] [--hf-threads N]

DIR is a Hugging Face model directory with tokenizer.json; random:NAME (RANDOM_MODELS: the configs
of Qwen2.5 0.5B and Llama 3.2 1B) writes a model of that real shape with random weights through
transformers, with a byte-level BPE tokenizer trained by `tokenizers` on a small corpus, and
caches it under ~/.cache/dtensor-bench/ (or $DTENSOR_BENCH_CACHE).

Every request is a greedy completion of --max-tokens tokens from a prompt of --prompt-tokens ids
(windows of an encoded text, one per request). In the same run:
  engine       the server on each --ranks count, --requests streamed requests from C client
               threads for each --concurrency C (--c1-requests of them at C = 1), as
               serve_bench.py: tokens/s, TTFT p50, time between tokens, rank 0's mean decode
               step, and the overhead share of a decode step from a second server started with
               --profile (NOTE [step profile]);
  transformers model.generate(do_sample=False) in this process with torch threads = the
               machine's cores (--hf-threads to change; each server rank runs one thread): the same requests one at a time (batch 1; TTFT as the time to the
               first new token through a streamer) and --requests of them in left-padded
               batches of the highest concurrency (batch 8 with the defaults; for information).
On each rank count, before its timed load, the first request's tokens from the server must equal
transformers' at batch 1 (exit status 1 otherwise; in bfloat16 a mismatch is reported, since two correct bf16 forwards
round differently). One JSON line per row with "bench": "serve", the engine's rows with their
ratios to transformers at batch 1 ("tps_over_hf_b1", "ttft_over_hf_b1").
"""

import json
import os
import random
import statistics
import sys
import time

from serve_client import Server, percentile, rank_pids, rss_mb, run_load

# Real configurations (the published config.json's math fields) with random weights.
RANDOM_MODELS = {
    "qwen2.5-0.5b": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
        rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "llama3.2-1b": ("LlamaConfig", "LlamaForCausalLM", dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64,
        max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=True,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192})),
}

WORDS = ("the of and to in is that for it as with was on be by at this from or an are which "
         "server model tensor parallel rank shard cache block token prefill decode request "
         "batch step kernel engine memory layer attention head weight norm vocabulary").split()


def corpus_text(n_words, seed):
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def write_random_model(path, name, dtype):
    """A model directory of RANDOM_MODELS[name] (transformers' own initialization, seed 0) in
    `dtype`, with a trained byte-level BPE tokenizer."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    config_cls, model_cls, fields = RANDOM_MODELS[name]
    tmp = path + ".writing"
    os.makedirs(tmp, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([corpus_text(12, i) for i in range(2000)], trainers.BpeTrainer(
        vocab_size=1000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False, special_tokens=["<|endoftext|>"]))
    transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(tmp)
    config = getattr(transformers, config_cls)(
        **fields, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).eval().to(getattr(torch, dtype))
    model.save_pretrained(tmp)
    os.rename(tmp, path)


def model_dir(spec, dtype):
    if not spec.startswith("random:"):
        return spec
    name = spec[len("random:"):]
    if name not in RANDOM_MODELS:
        sys.exit(f"--model {spec}: random models are {', '.join(RANDOM_MODELS)}")
    root = os.environ.get("DTENSOR_BENCH_CACHE",
                          os.path.join(os.path.expanduser("~"), ".cache", "dtensor-bench"))
    path = os.path.join(root, f"{name}-{dtype}")
    if not os.path.exists(os.path.join(path, "config.json")):
        print(f"writing a random {name} ({dtype}) to {path}", file=sys.stderr, flush=True)
        write_random_model(path, name, dtype)
    return path


def make_prompts(tokenizer, n, length):
    """n prompts of `length` ids each: consecutive windows of one encoded text."""
    ids = tokenizer(corpus_text(40 * (n + length), 7), add_special_tokens=False)["input_ids"]
    assert len(ids) >= length * (n + 1), "the prompt text is too short"
    return [ids[i * length:(i + 1) * length] for i in range(n)]


class FirstTokenTimer:
    """A generate() streamer: the time of the first new token (the prompt comes first)."""

    def __init__(self):
        self.calls, self.first = 0, None

    def put(self, value):
        self.calls += 1
        if self.calls == 2 and self.first is None:
            self.first = time.perf_counter()

    def end(self):
        pass


def hf_generate(model, prompts, max_tokens, streamer=None):
    """Greedy generate of a left-padded batch; the new tokens of each prompt."""
    import torch
    longest = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), longest, dtype=torch.long)
    mask = torch.zeros(len(prompts), longest, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, longest - len(p):] = torch.tensor(p)
        mask[i, longest - len(p):] = 1
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_tokens,
                             do_sample=False, streamer=streamer,
                             eos_token_id=None, pad_token_id=0)
    return out[:, longest:].tolist()


def run_transformers(model, prompts, max_tokens, batch):
    """(tokens/s, TTFT p50 s, s per decode step, the tokens) for prompts in batches of `batch`."""
    total, ttfts, steps, tokens = 0, [], [], []
    t_all = time.perf_counter()
    for i in range(0, len(prompts), batch):
        chunk = prompts[i:i + batch]
        timer = FirstTokenTimer()
        t0 = time.perf_counter()
        out = hf_generate(model, chunk, max_tokens, timer)
        t1 = time.perf_counter()
        ttfts.append(timer.first - t0)
        steps.append((t1 - timer.first) / max(1, max_tokens - 1))
        total += sum(len(o) for o in out)
        tokens += out
    wall = time.perf_counter() - t_all
    return total / wall, statistics.median(ttfts), statistics.median(steps), tokens


def requests_at(args, concurrency):
    """Requests sent at a concurrency (or batch): --requests, at 1 at most --c1-requests (one
    request at a time is the slow run; its tokens/s settles within a few requests)."""
    return args.requests if concurrency > 1 else min(args.requests, args.c1_requests)


def server_step(before, after):
    steps = after["dtensor_serve_decode_steps_total"] - before["dtensor_serve_decode_steps_total"]
    return (after["dtensor_serve_decode_seconds_total"]
            - before["dtensor_serve_decode_seconds_total"]) / steps


PROFILED = ("dtensor_serve_profiled_decode_steps_total",
            "dtensor_serve_profiled_decode_seconds_total",
            "dtensor_serve_profiled_local_kernel_seconds_total",
            "dtensor_serve_profiled_collective_seconds_total")


def emit(row, line):
    print(line, flush=True)
    print(json.dumps(row), flush=True)


def run(args, serve_bin):
    import torch
    import transformers

    threads = args.hf_threads or os.cpu_count()
    torch.set_num_threads(threads)
    path = model_dir(args.model, args.dtype or "float32")
    label = os.path.basename(path.rstrip("/"))
    ranks = [int(r) for r in args.ranks.split(",")]
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    prompts = make_prompts(tokenizer, args.requests, args.prompt_tokens)
    dtype = getattr(torch, args.dtype) if args.dtype else "auto"
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    model.generation_config.eos_token_id = None
    weights_dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    serve_args = ["--model", path, "--kv-cache-memory", args.kv_cache_memory] + (
        ["--dtype", args.dtype] if args.dtype else [])
    common = {"bench": "serve", "model": label, "dtype": weights_dtype,
              "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
              "requests": args.requests}

    # The reference first, alone on the machine.
    hf_generate(model, prompts[:1], 2)  # warm-up
    hf = {}
    for batch in sorted({1, max(concurrencies)}):
        tps, ttft, step, tokens = run_transformers(model, prompts[:requests_at(args, batch)],
                                                   args.max_tokens, batch)
        hf[batch] = (tps, ttft, step, tokens)
    want = hf[1][3][0]

    print(f"{'model':>20} {'runner':>12} {'ranks':>5} {'conc':>4} {'tokens/s':>9} "
          f"{'ttft p50 ms':>11} {'step ms':>8} {'x hf b1':>7} {'overhead':>9}", flush=True)
    for batch, (tps, ttft, step, _) in sorted(hf.items()):
        row = {**common, "runner": "transformers", "threads": threads, "batch": batch,
               "tokens_per_s": round(tps, 2), "ttft_p50_ms": round(ttft * 1e3, 1),
               "step_ms": round(step * 1e3, 2)}
        emit(row, f"{label:>20} {'transformers':>12} {'-':>5} {batch:>4} {tps:>9.2f} "
                  f"{ttft * 1e3:>11.1f} {step * 1e3:>8.2f} {tps / hf[1][0]:>7.2f} {'-':>9}")

    status = 0
    for n in ranks:
        profiled = {}
        server = Server(n, serve_bin, None, max(concurrencies), profile=True, extra=serve_args)
        try:
            run_load(server, 1, 1, 2, prompts=prompts)  # warm-up
            for c in concurrencies:
                before = server.metrics()
                run_load(server, c, c, args.max_tokens, prompts=prompts)
                after = server.metrics()
                steps, step, kern, coll = (after[k] - before[k] for k in PROFILED)
                profiled[c] = (step / steps, kern / steps, coll / steps)
        finally:
            server.stop()
        server = Server(n, serve_bin, None, max(concurrencies), extra=serve_args)
        try:
            got = server.complete(prompts[0], args.max_tokens)
            same = got == want
            check = {"tokens_equal_transformers": same,
                     "equal_prefix": next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                                          len(want))}
            if not same:
                print(f"ranks {n}: the first request's greedy tokens differ from transformers' "
                      f"at token {check['equal_prefix']}:\n  engine       {got}\n"
                      f"  transformers {want}", file=sys.stderr, flush=True)
                if weights_dtype == "float32":
                    status = 1
            for c in concurrencies:
                before = server.metrics()
                tps, gaps, ttfts = run_load(server, c, requests_at(args, c), args.max_tokens,
                                            prompts=prompts)
                after = server.metrics()
                step = server_step(before, after)
                step_p, kern, coll = profiled[c]
                pids = rank_pids(server.proc.pid)
                rss = [round(rss_mb(pids[r]), 1) for r in sorted(pids)]
                ttft = statistics.median(ttfts)
                row = {**common, "runner": "engine", "ranks": n, "concurrency": c,
                       "tokens_per_s": round(tps, 2), "ttft_p50_ms": round(ttft * 1e3, 1),
                       "step_ms": round(step * 1e3, 2),
                       "p50_ms": round(percentile(gaps, 0.5) * 1e3, 2),
                       "p99_ms": round(percentile(gaps, 0.99) * 1e3, 2),
                       "overhead": round((step_p - kern - coll) / step_p, 4) if n > 1 else None,
                       "collective_share": round(coll / step_p, 4),
                       "profiled_step_ms": round(step_p * 1e3, 2),
                       "tps_over_hf_b1": round(tps / hf[1][0], 2),
                       "ttft_over_hf_b1": round(ttft / hf[1][1], 2),
                       "rss_mb": max(rss), **check}
                over = "-" if row["overhead"] is None else format(row["overhead"], ".3f")
                emit(row, f"{label:>20} {'engine':>12} {n:>5} {c:>4} {tps:>9.2f} "
                          f"{ttft * 1e3:>11.1f} {step * 1e3:>8.2f} {tps / hf[1][0]:>7.2f} "
                          f"{over:>9}")
        finally:
            server.stop()
    return status
