"""Fast tokenizer paths give exactly transformers' ids and text; the system-block cache never changes ids."""

import random

import pytest
from transformers import AutoTokenizer

from sidecar.conversation.chat_template import ChatRenderer, HeadCache
from sidecar.conversation.tokens import TokenCodec

TEXTS = [
    "",
    "Hello, world!",
    "  leading and trailing spaces  ",
    "línea con acentos y emoji 🤖🚀 and CJK 你好世界",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls -la"}}\n</tool_call>',
    "<think>\nreasoning\n</think>\n\nanswer",
    "tabs\tand\r\nnewlines\n\n\n",
    "<|im_end|><|endoftext|><|im_start|>",
    "code: def f(x):\n    return x ** 2  # square\n",
]

SYSTEM = {"role": "system", "content": "You are a coding agent. Follow the repository's conventions. " * 20}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
    }
]


@pytest.fixture
def codec(qwen3_tokenizer):
    return TokenCodec(qwen3_tokenizer)


def test_codec_encodes_and_decodes_like_transformers(codec, qwen3_tokenizer):
    assert codec._backend is not None  # the fast path is the one under test
    for text in TEXTS:
        ids = codec.encode(text)
        assert ids == list(qwen3_tokenizer.encode(text, add_special_tokens=False))
        for skip in (True, False):
            assert codec.decode(ids, skip_special_tokens=skip) == qwen3_tokenizer.decode(ids, skip_special_tokens=skip)
            assert codec.decode(tuple(ids[:3]), skip_special_tokens=skip) == qwen3_tokenizer.decode(ids[:3], skip_special_tokens=skip)


def test_codec_ignores_a_truncation_configured_on_the_backend(qwen3_tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir))  # a private copy: its backend is changed
    codec = TokenCodec(tok)
    text = "word " * 50
    full = codec.encode(text)
    tok.backend_tokenizer.enable_truncation(max_length=5)
    assert codec.encode(text) == full  # transformers' own call, which encodes untruncated


def test_codec_without_a_fast_backend_uses_the_tokenizer():
    class Plain:
        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

        def decode(self, ids, skip_special_tokens=False):
            return "".join(chr(i) for i in ids)

    codec = TokenCodec(Plain())
    assert codec.encode("ab") == [97, 98]
    assert codec.decode([97, 98]) == "ab"
    assert not codec.splits_at("a<|im_end|>b", 1)


def test_clean_cuts_really_are_clean(codec):
    rng = random.Random(7)
    pieces = TEXTS[1:] + ["<|im_start|>", "<|im_end|>", "\n", " ", "x", "<tool_call>", "</think>"]
    checked = 0
    for _ in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(2, 8)))
        whole = codec.encode(text)
        for pos in range(1, len(text)):
            if codec.splits_at(text, pos):
                checked += 1
                assert codec.encode(text[:pos]) + codec.encode(text[pos:]) == whole, (text, pos)
    assert checked > 100


def test_no_cut_inside_words_or_away_from_added_tokens(codec):
    text = "<|im_start|>system\nhello world<|im_end|>\n"
    assert not codec.splits_at(text, text.index("world"))
    assert not codec.splits_at(text, text.index("im_start"))  # inside the token itself
    assert codec.splits_at(text, text.index("<|im_end|>"))
    assert not codec.splits_at(text, 0) and not codec.splits_at(text, len(text))


def _plain_ids(tok, messages, tools=None, **kw):
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True, **kw)
    return list(tok.encode(text, add_special_tokens=False))


@pytest.mark.parametrize(
    "messages, tools, kwargs",
    [
        ([SYSTEM, {"role": "user", "content": "Fix the failing test."}], TOOLS, {}),
        ([SYSTEM, {"role": "user", "content": "Another task, same prompt."}], TOOLS, {}),
        ([SYSTEM, {"role": "user", "content": "No tools this time."}], None, {}),
        ([SYSTEM, {"role": "user", "content": "Think less."}], TOOLS, {"enable_thinking": False}),
        ([SYSTEM, {"role": "system", "content": "Second system message."}, {"role": "user", "content": "hi"}], TOOLS, {}),
        ([{"role": "user", "content": "no system prompt"}], TOOLS, {}),
        ([SYSTEM], TOOLS, {}),
        (
            [
                SYSTEM,
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nok", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": {"cmd": "ls"}}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
            ],
            TOOLS,
            {},
        ),
    ],
)
def test_render_full_with_the_head_cache_gives_the_same_ids(qwen3_tokenizer, messages, tools, kwargs):
    renderer = ChatRenderer(qwen3_tokenizer)
    expected = _plain_ids(qwen3_tokenizer, messages, tools, **kwargs)
    assert renderer.render_full(messages, tools, kwargs) == expected  # fills the cache
    assert renderer.render_full(messages, tools, kwargs) == expected  # served from it


def test_sessions_with_the_same_system_block_share_one_cache_entry(qwen3_tokenizer):
    renderer = ChatRenderer(qwen3_tokenizer)
    for i in range(5):
        messages = [SYSTEM, {"role": "user", "content": f"task {i}"}]
        assert renderer.render_full(messages, TOOLS) == _plain_ids(qwen3_tokenizer, messages, TOOLS)
    assert len(renderer.heads) == 1
    other = [{"role": "system", "content": "A different agent."}, {"role": "user", "content": "task"}]
    assert renderer.render_full(other, TOOLS) == _plain_ids(qwen3_tokenizer, other, TOOLS)
    assert len(renderer.heads) == 2


def test_head_cache_is_bounded_and_remembers_refusals():
    cache = HeadCache(max_entries=2, max_chars=10)
    cache.put("aaaa", [1])
    cache.put("bbbb", None)
    assert cache.get("bbbb") == (True, None)  # known not to cut cleanly
    cache.put("cccc", [3])  # evicts the least recently used ("aaaa")
    assert cache.get("aaaa") == (False, None) and len(cache) == 2
    cache.put("d" * 11, [4])  # larger than the whole budget: not kept
    assert cache.get("d" * 11) == (False, None)
    cache.put("eeeeee", [5])  # over max_chars: the oldest go
    assert cache.get("eeeeee") == (True, [5]) and cache._chars <= 10
