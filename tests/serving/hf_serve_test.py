"""./x serve --model DIR as users meet it: a tiny random Qwen2 model with a byte-level BPE
tokenizer, both written by Hugging Face's own packages (save_pretrained), served by tools/serve on
1 and 2 ranks (real processes through ./x launch's launcher) and driven over HTTP:

- greedy completions (prompt as token ids and as text) equal transformers' generate(do_sample=
  False) token for token, and their text equals the tokenizer's decode; concurrent requests
  (continuous batching over the paged cache) each get what they get alone;
- a KV cache too small for a request answers 400 naming the cache, and the server keeps serving;
- a config.json the forward does not implement stops the server at start naming the field;
- a chat completion (system + user, greedy) equals transformers' generate from the ids of
  apply_chat_template(messages, add_generation_prompt=True) and stops at the ChatML template's
  <|im_end|> (finish_reason "stop"; the text ends before it).
"""

import http.client
import json
import os
import subprocess
import sys
import threading
import time

import pytest
import torch

transformers = pytest.importorskip("transformers")
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

LAUNCH, SERVE = os.environ["LAUNCH_PY"], os.environ["SERVE_BIN"]
WORDS = ("the quick brown fox jumps over the lazy dog tensor parallel server model hello world "
         "shard replicate rank cache block prefill decode").split()


def _tiny_qwen2(vocab, max_positions, seed):
    """A 2-layer Qwen2 (grouped kv heads) with random weights large enough that greedy choices
    are clear: norms near 1, the rest N(0, 0.15)."""
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
        eos_token_id=None, bos_token_id=None)
    model = transformers.Qwen2ForCausalLM(config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.2 * noise if "norm" in name else 0.15 * noise)
    return model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    import random
    rng = random.Random(0)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(500)]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
        special_tokens=["<|endoftext|>"]))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    fast.save_pretrained(str(path))
    model = _tiny_qwen2(tok.get_vocab_size(), 128, seed=0)
    model.save_pretrained(str(path))
    return str(path), model, fast


class Server:
    def __init__(self, n, tmp_path, *args):
        self.port_file = str(tmp_path / f"port-{n}-{time.monotonic_ns()}")
        self.proc = subprocess.Popen(
            [sys.executable, LAUNCH, "-n", str(n), "--", SERVE, "--port", "0", "--port-file",
             self.port_file, *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = []
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + 120
        while not os.path.exists(self.port_file):
            if self.proc.poll() is not None:
                time.sleep(0.2)  # the reader thread takes the last lines
                raise RuntimeError("server exited:\n" + "\n".join(self.lines))
            assert time.monotonic() < deadline, "server did not start:\n" + "\n".join(self.lines)
            time.sleep(0.05)
        self.port = int(open(self.port_file).read())

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def complete(self, body):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        conn.request("POST", "/v1/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        text = resp.read().decode()
        conn.close()
        return resp.status, json.loads(text)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)


def _generate(model, ids, n):
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                                                                            dtype=torch.long),
                             max_new_tokens=n, do_sample=False)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("ranks", [1, 2])
def test_greedy_completions_equal_transformers(model_dir, ranks, tmp_path):
    path, model, fast = model_dir
    prompts = [[5, 77, 300, 12, 9, 140, 2, 66, 81, 45, 101], "the quick brown fox jumps over"]
    expected = []
    for p in prompts:
        ids = p if isinstance(p, list) else fast(p)["input_ids"]
        expected.append(_generate(model, ids, 10))
    server = Server(ranks, tmp_path, "--model", path, "--block-size", "4", "--prefill-chunk", "4",
                    "--kv-cache-memory", "256K")
    try:
        def ask(p):
            status, body = server.complete({"prompt": p, "max_tokens": 10, "temperature": 0})
            assert status == 200, body
            return body["choices"][0]
        for p, want in zip(prompts, expected):
            choice = ask(p)
            assert choice["token_ids"] == want, (ranks, p)
            assert choice["text"] == fast.decode(want)
        results = [None] * 6

        def one(i):
            results[i] = ask(prompts[i % 2])["token_ids"]
        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [expected[i % 2] for i in range(6)]
    finally:
        server.stop()


def test_request_larger_than_the_cache_is_refused(model_dir, tmp_path):
    path, model, _ = model_dir
    # 2 layers x 2 kv heads x 16 dims x 4 bytes x 2 (k, v) = 512 bytes a position: 8 KiB hold 16.
    server = Server(1, tmp_path, "--model", path, "--block-size", "4", "--kv-cache-memory", "8K")
    try:
        status, body = server.complete({"prompt": [1, 2, 3], "max_tokens": 20, "temperature": 0})
        assert status == 400 and "KV cache" in body["error"]["message"], body
        status, body = server.complete({"prompt": [1, 2, 3], "max_tokens": 10, "temperature": 0})
        assert status == 200, body
        assert body["choices"][0]["token_ids"] == _generate(model, [1, 2, 3], 10)
    finally:
        server.stop()


def test_unsupported_config_stops_at_start_naming_the_field(model_dir, tmp_path):
    path, _, _ = model_dir
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in os.listdir(path):
        os.symlink(os.path.join(path, f), bad / f)
    config = json.load(open(os.path.join(path, "config.json")))
    config["hidden_act"] = "gelu"
    os.unlink(bad / "config.json")
    json.dump(config, open(bad / "config.json", "w"))
    with pytest.raises(RuntimeError, match="'hidden_act'"):
        Server(1, tmp_path, "--model", str(bad))


# ChatML in Qwen2.5's form (this project's own text): the server renders it as the "chatml" family
# and stops at <|im_end|>.
CHATML_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant') %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
CHAT = [{"role": "system", "content": "You answer in words."},
        {"role": "user", "content": "the quick brown fox jumps over the lazy dog"}]


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory):
    """A tiny random Qwen2 with a ChatML template whose greedy answer to CHAT ends with
    <|im_end|> after a few tokens: <|im_end|>'s output row points along the final hidden state of
    one answer step (found with transformers), so the stop is the model's own greedy choice."""
    import random
    path = tmp_path_factory.mktemp("qwen2_chat")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    rng = random.Random(1)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(500)]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"]))
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        chat_template=CHATML_TEMPLATE)
    end = fast.convert_tokens_to_ids("<|im_end|>")
    prompt = fast.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True,
                                      return_dict=False)
    if isinstance(prompt, dict) or hasattr(prompt, "keys"):
        prompt = prompt["input_ids"]
    model = _tiny_qwen2(tok.get_vocab_size(), 256, seed=1)
    with torch.no_grad():
        free = _generate(model, prompt, 12)
        # The answer's step k (k >= 3 tokens in) gets <|im_end|> as its greedy token: the row is
        # the step's final hidden state, scaled past the step's largest logit; an earlier step
        # that would then pick <|im_end|> too moves the choice on to the next k.
        for k in range(3, 12):
            hidden = model.model(torch.tensor([prompt + free[:k]])).last_hidden_state[0]
            h = hidden[-1]
            logits = model.lm_head(h)
            row = h / h.norm() * ((logits.max() + 4.0) / h.norm())
            model.lm_head.weight[end] = row
            got = _generate(model, prompt, 12)
            if end in got and got.index(end) == k and got[:k] == free[:k]:
                break
        else:
            raise AssertionError("no answer step takes <|im_end|>")
    fast.save_pretrained(str(path))
    model.save_pretrained(str(path))
    return str(path), model, fast, prompt, k


def test_chat_completion_equals_transformers_and_stops_at_end_of_turn(chat_model_dir, tmp_path):
    path, model, fast, prompt, k = chat_model_dir
    end = fast.convert_tokens_to_ids("<|im_end|>")
    # The reference: transformers' greedy generate from apply_chat_template's ids, ending at the
    # template's end-of-turn token.
    want = _generate(model, prompt, 24)
    assert want.index(end) == k
    want = want[:k]
    server = Server(1, tmp_path, "--model", path, "--block-size", "4",
                    "--kv-cache-memory", "256K")
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        conn.request("POST", "/v1/chat/completions", body=json.dumps(
            {"messages": CHAT, "max_tokens": 24, "temperature": 0}),
            headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        body = json.loads(resp.read().decode())
        conn.close()
        assert resp.status == 200, body
        choice = body["choices"][0]
        assert choice["message"]["role"] == "assistant"
        assert choice["message"]["content"] == fast.decode(want), (choice, want)
        assert choice["finish_reason"] == "stop", choice
        assert choice["token_ids"][:k] == want, choice
        assert body["usage"]["prompt_tokens"] == len(prompt), body
    finally:
        server.stop()
