"""Tests for sidecar.generation.detokenize: incremental detokenization and stop matching."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from sidecar.generation.detokenize import IncrementalDetokenizer, StopMatcher

CORPUS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "你好，世界！今天天气很好。我们去公园散步吧。",
    "日本語のテキストも少し入れておきます。",
    "Emoji time 😀🎉👍🏽 and family 👨‍👩‍👧 and flags 🇫🇷🇯🇵",
    "Ünïcödé àccents: café naïve résumé — “quotes” …",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "<think>\nLet me think.\n</think>\n\nThe answer is 42.",
] * 3

TEXTS = [
    "Hello 你好 😀 world",
    "👨‍👩‍👧🇫🇷 café — 今天天气很好 🎉🎉🎉",
    "plain ascii only, nothing fancy here",
    "混合 mixed テキスト with émojis 👍🏽 and “quotes” …",
    "<think>\n想一想\n</think>\n\n答案是 42 😀",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 outside the BMP 𝄞 and 🀄 tiles",
]


@pytest.fixture(scope="module")
def bytelevel_tok() -> PreTrainedTokenizerFast:
    """A small Qwen-like byte-level BPE: multi-byte chars span several tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        clean_up_tokenization_spaces=False,
    )


@pytest.fixture(scope="module")
def metaspace_tok() -> PreTrainedTokenizerFast:
    """SentencePiece-style tokenizer: decoding a window alone drops its leading space."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<unk>", "</s>"], show_progress=False
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", eos_token="</s>",
        clean_up_tokenization_spaces=False,
    )


def stream(tokenizer, ids, cuts, **kw) -> tuple[list[str], str]:
    """Feed cumulative prefixes ids[:c] for each cut; return (deltas, flushed)."""
    detok = IncrementalDetokenizer(tokenizer, **kw)
    deltas = [detok.update(ids[:c]) for c in sorted(cuts)]
    deltas.append(detok.update(ids))
    return deltas, detok.flush()


def random_cuts(rng: random.Random, n: int) -> list[int]:
    return sorted(rng.sample(range(n + 1), k=rng.randint(0, n + 1)))


def test_multibyte_chars_span_tokens(bytelevel_tok):
    # Sanity check of the fixture: an emoji really is split over several tokens,
    # and decoding a prefix ends in U+FFFD.
    ids = bytelevel_tok.encode("😀", add_special_tokens=False)
    assert len(ids) > 1
    assert bytelevel_tok.decode(ids[:1]).endswith("\ufffd")


@pytest.mark.parametrize("text", TEXTS)
def test_one_token_at_a_time(bytelevel_tok, text):
    ids = bytelevel_tok.encode(text, add_special_tokens=False)
    deltas, flushed = stream(bytelevel_tok, ids, range(len(ids) + 1))
    assert "".join(deltas) + flushed == bytelevel_tok.decode(ids) == text
    assert flushed == ""  # text ends on a complete character
    assert not any("\ufffd" in d for d in deltas)


@pytest.mark.parametrize("seed", range(30))
def test_random_splits_bytelevel(bytelevel_tok, seed):
    rng = random.Random(seed)
    text = " ".join(rng.sample(TEXTS, k=3))
    ids = bytelevel_tok.encode(text, add_special_tokens=False)
    deltas, flushed = stream(bytelevel_tok, ids, random_cuts(rng, len(ids)))
    assert "".join(deltas) + flushed == bytelevel_tok.decode(ids)
    assert not any("\ufffd" in d for d in deltas)


@settings(max_examples=150, deadline=None)
@given(text=st.text(min_size=0, max_size=60), data=st.data())
def test_hypothesis_any_text(bytelevel_tok, text, data):
    ids = bytelevel_tok.encode(text, add_special_tokens=False)
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=len(ids) + 1))
    deltas, flushed = stream(bytelevel_tok, ids, cuts)
    assert "".join(deltas) + flushed == bytelevel_tok.decode(ids)
    if "\ufffd" not in text:
        assert not any("\ufffd" in d for d in deltas)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_hypothesis_arbitrary_ids(bytelevel_tok, data):
    # Arbitrary id sequences (invalid UTF-8 included) still concatenate exactly.
    ids = data.draw(st.lists(st.integers(0, len(bytelevel_tok) - 1), max_size=40))
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=len(ids) + 1))
    deltas, flushed = stream(bytelevel_tok, ids, cuts)
    assert "".join(deltas) + flushed == bytelevel_tok.decode(ids, skip_special_tokens=True)


def test_incomplete_tail_held_until_flush(bytelevel_tok):
    ids = bytelevel_tok.encode("ok 😀", add_special_tokens=False)
    detok = IncrementalDetokenizer(bytelevel_tok)
    out = detok.update(ids[:-1])  # emoji missing its last byte
    assert "\ufffd" not in out
    assert detok.update(ids[:-1]) == ""
    tail = detok.flush()
    assert tail.endswith("\ufffd")  # released as-is at the end
    assert out + tail == bytelevel_tok.decode(ids[:-1])


def test_skip_special_tokens(bytelevel_tok):
    ids = bytelevel_tok.encode("Hello 你好", add_special_tokens=False)
    ids = ids + [bytelevel_tok.convert_tokens_to_ids("<|im_end|>")]
    deltas, flushed = stream(bytelevel_tok, ids, range(len(ids)))
    assert "".join(deltas) + flushed == "Hello 你好"
    deltas, flushed = stream(bytelevel_tok, ids, range(len(ids)), skip_special_tokens=False)
    assert "".join(deltas) + flushed == "Hello 你好<|im_end|>"


def test_window_decode_differs_at_boundary(metaspace_tok):
    # Metaspace decode strips the leading space of a lone window ("▁world" ->
    # "world"); the prefix window must restore it.
    ids = metaspace_tok.encode("Hello world fox dog", add_special_tokens=False)
    assert metaspace_tok.convert_ids_to_tokens(ids[2]).startswith("\u2581")
    assert metaspace_tok.decode(ids[2:]) != metaspace_tok.decode(ids)[
        len(metaspace_tok.decode(ids[:2])):
    ]
    rng = random.Random(0)
    for _ in range(50):
        deltas, flushed = stream(metaspace_tok, ids, random_cuts(rng, len(ids)))
        assert "".join(deltas) + flushed == metaspace_tok.decode(ids)


def test_decode_window_stays_small(bytelevel_tok):
    """Per-update work is bounded by the window, not the whole output."""
    sizes: list[int] = []

    class Counting:
        def decode(self, ids, **kw):
            sizes.append(len(ids))
            return bytelevel_tok.decode(ids, **kw)

    ids = bytelevel_tok.encode(" ".join(TEXTS) * 20, add_special_tokens=False)
    assert len(ids) > 1000
    detok = IncrementalDetokenizer(Counting())
    out = "".join(detok.update(ids[: i + 1]) for i in range(len(ids))) + detok.flush()
    assert out == bytelevel_tok.decode(ids)
    assert max(sizes) <= 16


def test_no_growth_and_shrink(bytelevel_tok):
    ids = bytelevel_tok.encode("abc def", add_special_tokens=False)
    detok = IncrementalDetokenizer(bytelevel_tok)
    assert detok.update(ids) == "abc def"
    assert detok.update(ids) == ""
    with pytest.raises(ValueError):
        detok.update(ids[:-1])
    assert detok.flush() == ""


def test_qwen3_tokenizer_if_available(request):
    try:
        path = request.getfixturevalue("qwen3_tokenizer_dir")
    except pytest.FixtureLookupError:
        pytest.skip("qwen3_tokenizer_dir fixture not available")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    rng = random.Random(1)
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
        for _ in range(10):
            deltas, flushed = stream(tok, ids, random_cuts(rng, len(ids)))
            assert "".join(deltas) + flushed == tok.decode(ids, skip_special_tokens=True)
            assert not any("\ufffd" in d for d in deltas)


# ---------------------------------------------------------------- StopMatcher


def run_stop(stops, deltas) -> tuple[str, bool]:
    m = StopMatcher(stops)
    out = []
    for d in deltas:
        text, hit = m.feed(d)
        out.append(text)
        if hit:
            return "".join(out), True
    out.append(m.flush())
    return "".join(out), False


def reference_stop(stops, text) -> tuple[str, bool]:
    """Cut before the stop occurrence that completes first (ties: starts first)."""
    hits = [(text.find(s) + len(s), text.find(s)) for s in stops if s and s in text]
    if not hits:
        return text, False
    return text[: min(hits)[1]], True


def test_stop_spanning_deltas():
    assert run_stop(["STOP"], ["hello S", "TO", "P world"]) == ("hello ", True)
    assert run_stop(["\n\n"], ["a\n", "\nb"]) == ("a", True)


def test_stop_holds_back_possible_prefix():
    m = StopMatcher(["</end>"])
    assert m.feed("abc</e") == ("abc", False)
    assert m.feed("x") == ("</ex", False)  # false alarm released
    assert m.feed("</") == ("", False)
    assert m.flush() == "</"  # generation ended without a stop


def test_stop_after_hit_and_no_stops():
    m = StopMatcher(["x"])
    assert m.feed("abxcd") == ("ab", True)
    assert m.feed("more") == ("", True)
    assert m.flush() == ""
    m = StopMatcher(None)
    assert m.feed("anything") == ("anything", False)
    assert StopMatcher(["", "b"]).feed("abc") == ("a", True)  # empty stop ignored


def test_stop_at_very_start():
    assert run_stop(["Hi"], ["H", "i there"]) == ("", True)


@settings(max_examples=300, deadline=None)
@given(
    stops=st.lists(st.text(alphabet="ab\n", min_size=1, max_size=4), max_size=3),
    text=st.text(alphabet="abc\n", max_size=30),
    data=st.data(),
)
def test_stop_split_invariant(stops, text, data):
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    bounds = [0, *cuts, len(text)]
    deltas = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    assert run_stop(stops, deltas) == reference_stop(stops, text)
