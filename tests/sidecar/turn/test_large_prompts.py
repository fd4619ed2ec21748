"""Large prompts: refused from their length alone when they cannot fit, prepared off the event
loop when they might, within a deadline."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from hypothesis import given, settings, strategies as st

from sidecar.conversation.tokens import TokenCodec
from sidecar.errors import APIError
from sidecar.turn.offload import Offload


@pytest.fixture(scope="module")
def codec(qwen3_tokenizer):
    return TokenCodec(qwen3_tokenizer)


_pieces = st.sampled_from([" ", "    ", "\n", "=", "-", "a", "hello", "你好", "\u1100\u1161\u11a8", "é", "e\u0301", "<|im_start|>", "𝐀", "\t"])


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(st.tuples(_pieces, st.integers(1, 300)), min_size=1, max_size=6))
def test_fewest_tokens_is_a_true_lower_bound(codec, parts):
    """Runs of spaces, long repeats, CJK, Hangul jamo (NFC composes them), combining marks,
    special tokens: the bound from the length never exceeds the real count."""
    text = "".join(piece * n for piece, n in parts)
    assert codec.fewest_tokens(len(text)) <= len(codec.encode(text))


def test_the_qwen3_bound_is_known(codec):
    # 128 bytes in Qwen3's longest token (a run of spaces), x3 for NFC
    assert codec.fewest_tokens(384 * 1000) == 1000


@pytest.fixture
async def sidecar(make_sidecar, make_sglang_double):
    double = await make_sglang_double(context_length=40960, max_total_num_tokens=200_000)
    client = await make_sidecar(double=double, max_body_bytes=64 << 20)
    return client, double, client.server.app


def _spy_encode(monkeypatch):
    calls: list[tuple[int, str]] = []
    original = TokenCodec.encode

    def encode(self, text, limit=0):
        calls.append((len(text), threading.current_thread().name))
        return original(self, text, limit)

    monkeypatch.setattr(TokenCodec, "encode", encode)
    return calls


async def test_a_prompt_that_cannot_fit_is_refused_without_tokenizing(sidecar, monkeypatch):
    client, double, _ = sidecar
    calls = _spy_encode(monkeypatch)
    big = "word " * 4_000_000  # 20 MB: at least 52K tokens > 40,959
    resp = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": big}]})
    err = await resp.json()
    assert resp.status == 400 and err["error"]["code"] == "context_length_exceeded", err
    assert "at least" in err["error"]["message"]
    assert calls == [] and double.requests == []


async def test_a_large_prompt_is_prepared_off_the_event_loop(sidecar, monkeypatch):
    client, double, _ = sidecar
    calls = _spy_encode(monkeypatch)
    text = "a b c d " * 40_000  # 320 KB, 320K tokens: may fit by its length, does not
    resp = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": text}]})
    err = await resp.json()
    assert resp.status == 400 and err["error"]["code"] == "context_length_exceeded", err
    big_calls = [thread for n, thread in calls if n > 100_000]
    assert big_calls and all(name.startswith("sidecar-tokenize") for name in big_calls)
    # a small one stays on the loop, and works
    resp = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert resp.status == 200
    assert calls[-1][1] == threading.current_thread().name


async def test_a_large_prompt_that_fits_gets_its_exact_ids(sidecar, qwen3_tokenizer):
    client, double, _ = sidecar
    text = "Lorem ipsum dolor sit amet. " * 3000  # 84 KB, well under the limit
    messages = [{"role": "user", "content": text}]
    resp = await client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 2})
    assert resp.status == 200, await resp.text()
    expected = qwen3_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert double.requests[0]["input_ids"] == qwen3_tokenizer.encode(expected, add_special_tokens=False)


async def test_a_job_that_cannot_start_in_time_gets_503_and_never_runs():
    offload = Offload(timeout_s=0.2)
    ran = []
    blocker = asyncio.ensure_future(offload.run(time.sleep, 0.6))
    await asyncio.sleep(0.05)
    with pytest.raises(APIError) as info:
        await offload.run(ran.append, "late")
    assert info.value.status == 503 and info.value.code == "tokenizer_busy"
    assert "Retry-After" in info.value.headers
    with pytest.raises(APIError):
        await blocker  # the running one timed out too; it finishes on its own
    await asyncio.sleep(0.7)
    assert ran == []
    assert await offload.run(ran.append, "next") is None and ran == ["next"]
    offload.close()


@settings(max_examples=60, deadline=None)
@given(parts=st.lists(st.tuples(_pieces, st.integers(1, 2000)), min_size=1, max_size=8), limit=st.integers(100, 20_000))
def test_counting_ahead_never_refuses_a_text_that_fits(codec, parts, limit):
    """Counted piece by piece (small pieces here, so there are many cuts), a text is refused only
    when its real count is past the limit."""
    from sidecar.conversation import tokens

    text = "".join(piece * n for piece, n in parts) + "\nend"
    real = len(codec.encode(text))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(tokens, "COUNT_AHEAD_CHARS_PER_TOKEN", 0)
        m.setattr(tokens, "COUNT_PIECE_CHARS", 50)
        try:
            ids = codec.encode(text, limit)
        except tokens.TooManyTokens as exc:
            assert real > limit and exc.at_least <= real
        else:
            assert real <= limit and len(ids) == real


def test_a_huge_text_costs_what_its_first_limit_of_tokens_costs(codec, monkeypatch):
    pieces = []
    original = TokenCodec._ids
    monkeypatch.setattr(TokenCodec, "_ids", lambda self, backend, text: pieces.append(len(text)) or original(self, backend, text))
    text = "the quick brown fox jumps over the lazy dog\n" * 200_000  # 9 MB, ~2M tokens
    with pytest.raises(Exception) as info:
        codec.encode(text, 100_000)
    assert type(info.value).__name__ == "TooManyTokens"
    assert sum(pieces) < 1_000_000  # a few pieces, not the whole text
