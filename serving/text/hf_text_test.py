"""The C++ tokenizers and chat templates (serving/text/) against Hugging Face's own packages.

Each family's tokenizer.json is built here the way the family's published file is built (the hub
is out of reach): a byte-level BPE trained with the Llama 3 / Qwen2 Split pattern or GPT-2's
ByteLevel pre-tokenizer, and a SentencePiece-style BPE with byte fallback (Llama 2, Mistral),
with their normalizers, post-processors, decoders and special tokens. tokenizer_tool (C++) then
encodes, decodes and streams a corpus of Unicode, emoji, CJK, whitespace runs, digits and special
tokens, and renders chat templates written in each family's format; every result must equal
`tokenizers` / `transformers`.
"""

import json
import os
import random
import subprocess
import sys
import tempfile

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers

TOOL = os.environ.get("TOKENIZER_TOOL", "")
HERE = os.path.dirname(os.path.abspath(__file__))

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

# What the tokenizers are trained on: enough text for merges across scripts.
WORDS = ("the quick brown fox jumps over lazy dog tokenizer server model hello world "
         "distributed tensor shard replicate partial mesh rank gradient optimizer don't it's "
         "we're they've I'm you'll he'd café naïve résumé Ünïcödé straße "
         "日本語 中文 汉字 한국어 русский язык ελληνικά العربية हिन्दी ไทย "
         "😀 🚀 👍🏽 🇫🇷 ❤️ 123 4567 3.14159 2026 x=1; if (a) { return b; } // comment").split()
CORPUS_TRAIN = []
_rng = random.Random(0)
for _ in range(3000):
    n = _rng.randint(3, 14)
    line = " ".join(_rng.choice(WORDS) for _ in range(n))
    CORPUS_TRAIN.append(line + _rng.choice(["", ".", "!", "?", "\n", "  ", "\t"]))

# What is compared: Unicode, emoji, CJK, whitespace runs, newlines, digits, special tokens.
TEXTS = [
    "",
    " ",
    "Hello world",
    " Hello world ",
    "Hello  world   again    and\tagain\t\tand\n\nnew\r\nlines\n",
    "   leading and trailing   ",
    "\n\n\nonly newlines\n \n\t\n",
    "I'm sure it's fine, DON'T you think? They'LL say we'Re ſ'S right'd",
    "'s 't ' s '",
    "Numbers: 1 12 123 1234 12345 123456 3.14159 -42 1,000,000 ١٢٣٤ ⅷ ²³",
    "日本語のテキストと中文汉字和한국어",
    "Emoji: 😀😃 🚀 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇩🇪 ❤️ ✨🎉",
    "русский язык, ελληνικά, العربية, हिन्दी, ไทย",
    "Combining: e\u0301 a\u0308 n\u0303 Å \u212b \u2126 \u1100\u1161\u11a8 \u0915\u093c",
    "code: def f(x):\n    return x ** 2  # square\n\n\tif x != 0: pass",
    "special <|eot_id|> in <|start_header_id|>user<|end_header_id|> text<|im_end|>",
    "<s>[INST] hi [/INST] there</s><s>",
    "a<|endoftext|>b <|im_start|>system\nYou are<|im_end|>\n",
    "<tool_call>{\"a\": 1}</tool_call> magic words magicmagic",
    "\u00a0non\u2009breaking\u3000spaces\u200b zero",
    "mixed🙂text中文123abc   \n  end",
    "x" * 50 + " " + "ab" * 40,
    "emoji at end 🤖",
    "tabs\tand\u000bvertical\u000cfeed\u0085next\u2028line",
    "Ω ohm and ℃ and ﬁ ligature",
    "a  b   c    d     e",
    "!!!??? ... --- ;;; ((( )))",
]

# Random strings over the characters the patterns treat differently (letters, digits, marks,
# apostrophes, whitespace kinds, newlines, punctuation, CJK, emoji, special-token pieces).
_POOL = (list("aZé'sStT dD0123456789 \t\n\r.,!?-_()<>|") + ["  ", "\u00a0", "\u3000", "\u0301",
         "\u0308", "\u1161", "\u1100", "日", "本", "ſ", "😀", "👍🏽", "‍", "١", "²", "<|eot_id|>",
         "<|im_end|>", "<s>", "</s>", "magic", "<mask>", "words", "'LL", "'re"])
_rng = random.Random(1)
TEXTS += ["".join(_rng.choice(_POOL) for _ in range(_rng.randint(1, 30))) for _ in range(300)]


def byte_level_bpe(pattern, ignore_merges, nfc, specials, template, extra_added=()):
    """A byte-level BPE like Llama 3's (pattern LLAMA3_PATTERN), Qwen2's (QWEN2_PATTERN, NFC) or
    GPT-2's (pattern None: ByteLevel's own regex)."""
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if nfc:
        tok.normalizer = normalizers.NFC()
    if pattern:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS_TRAIN, trainer)
    tok.add_special_tokens(specials)
    tok.add_tokens(list(extra_added))
    post = [processors.ByteLevel(trim_offsets=False)]
    if template:
        first = specials[0]
        post.append(processors.TemplateProcessing(
            single=f"{first} $A", pair=f"{first} $A {first} $B",
            special_tokens=[(first, tok.token_to_id(first))]))
    tok.post_processor = processors.Sequence(post) if len(post) > 1 else post[0]
    return tok


def sentencepiece_bpe(metaspace):
    """Llama 2's layout: <unk> <s> </s>, the 256 byte tokens, then the merges' tokens; byte
    fallback; Prepend+Replace normalizers (metaspace: the Metaspace pre-tokenizer instead)."""
    trainer_tok = Tokenizer(models.BPE())
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    trainer = trainers.BpeTrainer(vocab_size=900, limit_alphabet=120, show_progress=False)
    trainer_tok.train_from_iterator(CORPUS_TRAIN, trainer)
    trained = json.loads(trainer_tok.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for token, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True,
                               fuse_unk=True))
    if metaspace:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first",
                                                     split=False)
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    else:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                               normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                         decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t in ("<unk>", "<s>", "</s>")])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)])
    return tok


LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>"]
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_all():
    return {
        "llama3": byte_level_bpe(LLAMA3_PATTERN, True, False, LLAMA3_SPECIALS, True),
        "qwen2": byte_level_bpe(QWEN2_PATTERN, False, True, QWEN_SPECIALS, False,
                                [AddedToken("<tool_call>", normalized=False, special=False),
                                 AddedToken("</tool_call>", normalized=False, special=False),
                                 AddedToken("magic", special=False)]),
        "gpt2": byte_level_bpe(None, False, False, ["<|endoftext|>"], False),
        "llama2": sentencepiece_bpe(metaspace=False),
        "llama2_metaspace": sentencepiece_bpe(metaspace=True),
    }


@pytest.fixture(scope="module")
def built():
    d = tempfile.mkdtemp(prefix="hf_text_test_")
    toks = build_all()
    # GPT-2 with add_prefix_space and single_word/lstrip/rstrip added tokens.
    gpt2p = byte_level_bpe(None, False, False, ["<|endoftext|>"], False)
    gpt2p.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    gpt2p.add_tokens([AddedToken("magic", single_word=True), AddedToken("<mask>", lstrip=True),
                      AddedToken("words", rstrip=True, normalized=False)])
    toks["gpt2_prefix"] = gpt2p
    # Pre-tokenizer variants over GPT-2's byte-level model: Digits, literal Splits with each
    # behaviour (and inverted), GPT-2's pattern as a Split; and Metaspace splitting on its own.
    def variant(base, pre):
        t = Tokenizer.from_str(toks[base].to_str())
        t.pre_tokenizer = pre
        return t

    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    toks["digits"] = variant("gpt2", pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]))
    toks["digits_contiguous"] = variant("gpt2", pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=False), bl]))
    toks["split_behaviors"] = variant("gpt2", pre_tokenizers.Sequence(
        [pre_tokenizers.Split(c, b) for c, b in (
            ("e", "merged_with_previous"), ("o", "merged_with_next"), ("  ", "contiguous"),
            ("t", "removed"), ("a", "isolated"))]
        + [pre_tokenizers.Split("s", "isolated", invert=True), bl]))
    toks["gpt2_split"] = variant("gpt2", pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GPT2_PATTERN), "isolated"), bl]))
    toks["metaspace_split"] = variant("llama2_metaspace", pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="always", split=True))
    paths = {}
    for name, tok in toks.items():
        paths[name] = os.path.join(d, name + ".json")
        tok.save(paths[name])
    return toks, paths


def run_tool(path, request):
    out = subprocess.run([TOOL, path], input=json.dumps(request), capture_output=True, text=True,
                         timeout=300)
    result = json.loads(out.stdout)
    assert "load_error" not in result, result["load_error"]
    return result


NAMES = ["llama3", "qwen2", "gpt2", "gpt2_prefix", "llama2", "llama2_metaspace", "digits",
         "digits_contiguous", "split_behaviors", "gpt2_split", "metaspace_split"]


@pytest.mark.parametrize("name", NAMES)
def test_encode_decode_stream_match_tokenizers(built, name):
    toks, paths = built
    tok = Tokenizer.from_file(paths[name])  # what the C++ reads, read back by the reference
    requests = [{"text": t, "add_special_tokens": s} for t in TEXTS for s in (False, True)]
    expected_ids = [tok.encode(r["text"], add_special_tokens=r["add_special_tokens"]).ids
                    for r in requests]
    # Decoding: every encoding, and random id sequences (partial byte sequences, special tokens
    # between model tokens).
    rng = random.Random(name)
    size = tok.get_vocab_size(with_added_tokens=True)
    randoms = [[rng.randrange(size) for _ in range(rng.randint(1, 12))] for _ in range(200)]
    decode = expected_ids + randoms
    result = run_tool(paths[name], {"encode": requests, "decode": decode, "stream": expected_ids})
    assert result["vocab_size"] == size
    for r, want, got in zip(requests, expected_ids, result["encode"]):
        assert got == want, (name, r, [tok.id_to_token(i) for i in want],
                             [tok.id_to_token(i) for i in got])
    for ids, got in zip(decode, result["decode"]):
        assert got == tok.decode(ids, skip_special_tokens=False), (name, ids)
    for ids, pieces in zip(expected_ids, result["stream"]):
        assert "".join(pieces) == tok.decode(ids, skip_special_tokens=False), (name, ids, pieces)
        # Nothing but the last piece carries a partial character.
        assert all("\ufffd" not in p for p in pieces[:-1]), (name, ids, pieces)
    # The corpus must exercise what it claims: byte fallback and multi-token characters.
    if name.startswith(("llama2", "metaspace")):
        assert any(tok.id_to_token(i).startswith("<0x") for ids in expected_ids for i in ids)


# Chat templates written in each family's format (this project's own text).
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
    "message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}")
LLAMA31_TEMPLATE = r"""{{- bos_token }}
{%- if not tools_in_user_message is defined %}{%- set tools_in_user_message = true %}{%- endif %}
{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}{{- "Environment: ipython\n" }}{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}"""
# Llama 3.2's form: today's date from strftime_now.
LLAMA32_TEMPLATE = LLAMA31_TEMPLATE.replace(
    '{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}',
    '{%- if not date_string is defined %}{%- if strftime_now is defined %}'
    '{%- set date_string = strftime_now("%d %b %Y") %}{%- else %}'
    '{%- set date_string = "26 Jul 2024" %}{%- endif %}{%- endif %}')
QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
QWEN25_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a "
    "helpful assistant.<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant') %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
QWEN3_TEMPLATE = """{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}"""
LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}"
    "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}")
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
    "{% endif %}{% endfor %}")

SYSTEM = {"role": "system", "content": "  You are terse.\nAnswer in one line.  "}
CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [SYSTEM, {"role": "user", "content": "What is 2+2? 🤔"}],
    [SYSTEM, {"role": "user", "content": " 日本語で答えて \n"},
     {"role": "assistant", "content": "\nはい。\n\n"}, {"role": "user", "content": "Thanks"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
     {"role": "user", "content": "c"}, {"role": "assistant", "content": "d  "}],
    [{"role": "user", "content": "think"},
     {"role": "assistant", "content": "<think>\nstep 1\n</think>\n\nanswer 1"},
     {"role": "user", "content": "again"},
     {"role": "assistant", "content": "<think>\n\nstep 2\n\n</think>\n\nanswer 2"}],
    [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}],  # not alternating
    [SYSTEM, {"role": "assistant", "content": "first"}],
]

CHAT_CASES = [
    # name, tokenizer, template, bos, eos, family
    ("llama3", "llama3", LLAMA3_TEMPLATE, "<|begin_of_text|>", "<|eot_id|>", "llama3"),
    ("llama31", "llama3", LLAMA31_TEMPLATE, "<|begin_of_text|>", "<|eot_id|>", "llama3.1"),
    ("llama32", "llama3", LLAMA32_TEMPLATE, "<|begin_of_text|>", "<|eot_id|>", "llama3.1"),
    ("qwen2", "qwen2", QWEN2_TEMPLATE, None, "<|im_end|>", "chatml"),
    ("qwen25", "qwen2", QWEN25_TEMPLATE, None, "<|im_end|>", "chatml"),
    ("qwen3", "qwen2", QWEN3_TEMPLATE, None, "<|im_end|>", "qwen3"),
    ("llama2", "llama2", LLAMA2_TEMPLATE, "<s>", "</s>", "llama2"),
    ("mistral", "llama2_metaspace", MISTRAL_TEMPLATE, "<s>", "</s>", "mistral"),
]


@pytest.mark.parametrize("case", CHAT_CASES, ids=[c[0] for c in CHAT_CASES])
def test_chat_template_matches_transformers(built, case):
    from transformers import PreTrainedTokenizerFast

    name, tok_name, template, bos, eos, family = case
    toks, _ = built
    hf = PreTrainedTokenizerFast(tokenizer_object=toks[tok_name], bos_token=bos, eos_token=eos,
                                 chat_template=template)
    d = tempfile.mkdtemp(prefix="hf_chat_" + name + "_")
    hf.save_pretrained(d)
    requests, expected = [], []
    for messages in CONVERSATIONS:
        for gen in (False, True):
            requests.append({"messages": messages, "add_generation_prompt": gen})
            try:
                expected.append(hf.apply_chat_template(messages, tokenize=False,
                                                       add_generation_prompt=gen))
            except Exception as e:  # the template refuses the conversation
                expected.append(e)
    result = run_tool(d, {"chat": requests,
                          "encode": [{"text": t, "add_special_tokens": False}
                                     for t in expected if isinstance(t, str)]})
    assert result["chat_family"] == family
    assert result["bos_id"] == (hf.convert_tokens_to_ids(bos) if bos else None)
    assert result["eos_id"] == hf.convert_tokens_to_ids(eos)
    assert eos in result["chat_stops"]
    rendered = []
    for req, want, got in zip(requests, expected, result["chat"]):
        if isinstance(want, Exception):
            assert isinstance(got, dict) and "error" in got, (name, req, got)
        else:
            assert got == want, (name, req)
            rendered.append(want)
    assert len(rendered) >= 4, name
    # The prompt's ids, as the server feeds them (the template holds the bos).
    for text, ids in zip(rendered, result["encode"]):
        assert ids == hf.encode(text, add_special_tokens=False), (name, text)


def test_unknown_chat_template_is_refused(built):
    from transformers import PreTrainedTokenizerFast

    toks, _ = built
    hf = PreTrainedTokenizerFast(tokenizer_object=toks["gpt2"], eos_token="<|endoftext|>",
                                 chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")
    d = tempfile.mkdtemp(prefix="hf_chat_unknown_")
    hf.save_pretrained(d)
    result = run_tool(d, {"chat": [{"messages": [{"role": "user", "content": "hi"}]}]})
    assert result["chat_family"] == "unsupported"
    assert "not one this server renders" in result["chat"][0]["error"]


@pytest.mark.parametrize("field,value,message", [
    ("normalizer", {"type": "Lowercase"}, "normalizer type 'Lowercase'"),
    ("pre_tokenizer", {"type": "Split", "pattern": {"Regex": r"\w+"}, "behavior": "Isolated",
                       "invert": False}, r"Split with Regex '\w+'"),
    ("pre_tokenizer", {"type": "Whitespace"}, "pre_tokenizer type 'Whitespace'"),
    ("decoder", {"type": "WordPiece", "prefix": "##", "cleanup": True}, "decoder type 'WordPiece'"),
    ("post_processor", {"type": "BertProcessing", "sep": ["[SEP]", 1], "cls": ["[CLS]", 0]},
     "post_processor type 'BertProcessing'"),
])
def test_unsupported_fields_are_refused_at_load(built, field, value, message):
    _, paths = built
    j = json.load(open(paths["gpt2"]))
    j[field] = value
    path = os.path.join(os.path.dirname(paths["gpt2"]), "refused.json")
    json.dump(j, open(path, "w"))
    out = subprocess.run([TOOL, path], input="{}", capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert message in json.loads(out.stdout)["load_error"]


def test_unicode_tables_are_the_generator_output():
    out = subprocess.run([sys.executable, os.path.join(HERE, "gen_unicode_tables.py")],
                         capture_output=True, text=True, check=True).stdout
    assert out == open(os.path.join(HERE, "unicode_tables.cc")).read()


if __name__ == "__main__":
    os.environ["TOKENIZER_TOOL"] = os.path.abspath(sys.argv[1])
    TOOL = os.environ["TOKENIZER_TOOL"]
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"] + sys.argv[2:]))
