"""Long JSON strings are decoded a slice at a time (issue 27.3: no parse of a large body holds the
GIL, and so the event loop, for long), and what comes out is the parser's on the whole text: the
same value, or the same error."""

from __future__ import annotations

import json
import random

import jiter
import pytest
from pydantic_core import from_json

from sidecar.frontdoor import json_slices
from sidecar.frontdoor.canonical_messages import json_or_str
from sidecar.server.request_body import parse_strict_json


def strict(raw: bytes):
    return jiter.from_json(raw, catch_duplicate_keys=True, allow_inf_nan=False)


PIECES = ["a", "b ", "é", "漢", "😀", "\\n", "\\\\", '\\"', "\\u00e9", "\\ud83d\\ude00", "\\u0041", "\\/", "\\t", "\\\\\\\\"]


def literal(rng: random.Random, n: int, dense: bool) -> str:
    """JSON string content of about ``n`` bytes: text, multi-byte characters, escapes, surrogate pairs."""
    out, size = [], 0
    while size < n:
        piece = rng.choice(PIECES[5:] if dense else PIECES)
        out.append(piece)
        size += len(piece.encode())
    return "".join(out)


def outcome(parse, raw: bytes, parser):
    try:
        return "value", repr(parse(raw, parser))  # repr: NaN equals itself
    except ValueError as exc:
        return "error", str(exc)


@pytest.fixture
def small_slices(monkeypatch):
    """Thresholds of a few hundred bytes, so that short texts take every path (slices, the cut by
    escapes, the cut by whole tokens, the scan across its own slices)."""
    monkeypatch.setattr(json_slices, "LONG_STRING_BYTES", 2000)
    monkeypatch.setattr(json_slices, "SLICE_BYTES", 500)
    monkeypatch.setattr(json_slices, "CUT_WINDOW_BYTES", 64)
    monkeypatch.setattr(json_slices, "_TOKENS_BYTES", 100)
    monkeypatch.setattr(json_slices, "SCAN_BYTES", 777)


def test_the_result_is_the_parsers_on_the_whole_text(small_slices):
    """Valid and invalid texts, both parsers (the strict body parser, pydantic-core's lenient one):
    the same value or the same error as one call on the whole text."""
    rng = random.Random(27)
    seen = set()
    for _ in range(1500):
        a, b = literal(rng, rng.randint(1000, 6000), rng.random() < 0.3), literal(rng, rng.randint(10, 3000), False)
        doc = rng.choice([
            f'{{"x": "{a}", "y": ["{b}", 1, 2.5e3, null], "z": {{"k": "{a}"}}}}',
            f'"{a}"',
            f'{{"{a}": 1, "{b}": "{a}"}}',
            f'{{"{a}": 1, "{a}": 2}}',  # long keys equal once decoded
            f'{{"x": "{a}", "x": "{b}"}}',
            '["' + "\\\\" * rng.randint(600, 3000) + "x\\ud83d\\ude00" * 300 + '"]',
            f'{{"x": "{a}\\ud800", "y": 1}}',  # an unpaired surrogate
            f'{{"x": "{a}\x01"}}',  # a raw control character
            f'{{"x": "{a}", "y": NaN}}',
            f'{{"x": "{a}" "y": 1}}',
            f'{{"x": "{a}\\q"}}',
        ])
        raw = doc.encode()
        if rng.random() < 0.1:  # any byte may be anything
            i = rng.randrange(len(raw))
            raw = raw[:i] + bytes([rng.randrange(256)]) + raw[i + 1 :]
        for parser in (strict, from_json):
            want = outcome(lambda r, p: p(r), raw, parser)
            assert outcome(json_slices.parse_json, raw, parser) == want, raw[:200]
            seen.add(want[0])
    assert seen == {"value", "error"}


def test_no_call_parses_a_long_string_whole(small_slices):
    """A valid text's long strings reach the parser in slices of about SLICE_BYTES, never the
    whole text at once, whatever they hold (dense escapes, runs of escaped backslashes)."""
    rng = random.Random(3)
    for doc in (
        f'{{"a": "{literal(rng, 20000, False)}", "b": ["{literal(rng, 9000, True)}"]}}',
        '"' + "\\\\" * 6000 + '"',
        '{"' + literal(rng, 8000, True) + '": {"k": "' + "x\\ud83d\\ude00" * 2000 + '"}}',
    ):
        raw = doc.encode()
        sizes: list[int] = []
        value = json_slices.parse_json(raw, lambda r: sizes.append(len(r)) or strict(r))
        assert repr(value) == repr(strict(raw))
        assert len(sizes) > 3 and max(sizes) < 700, sizes


def test_a_large_body_and_its_tool_arguments_are_parsed_in_slices(monkeypatch):
    """The hostile shape at its real thresholds: a 6 MB tool-call argument in a chat body. The body
    parser and json_or_str (the arguments as the template renders them) each call their parser on
    slices of at most SLICE_BYTES (+ the cut window), and give what one call would."""
    text = "the agent reads file\n" * 300_000
    args = json.dumps({"path": "a.txt", "text": text})
    body = json.dumps({"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": args}}]}]}).encode()
    calls: list[int] = []

    def recording(parse):
        return lambda raw: calls.append(len(raw)) or parse(raw)

    monkeypatch.setattr("sidecar.server.request_body._strict", recording(strict))
    parsed = parse_strict_json(body)
    assert parsed == json.loads(body)
    assert max(calls) <= json_slices.SLICE_BYTES + json_slices.CUT_WINDOW_BYTES + 16 and len(calls) > 5
    calls.clear()
    monkeypatch.setattr("sidecar.frontdoor.canonical_messages.from_json", recording(from_json))
    assert json_or_str(args) == {"path": "a.txt", "text": text}
    assert max(calls) <= json_slices.SLICE_BYTES + json_slices.CUT_WINDOW_BYTES + 16 and len(calls) > 5


def test_json_or_str_keeps_what_it_gave_for_long_arguments():
    """Arguments past the slicing threshold: JSON parsed (NaN allowed, the last duplicate wins, as
    pydantic-core's parser has it), anything else kept as sent; an unpaired surrogate in the text
    itself goes to json.loads as before."""
    pad = "x" * json_slices.LONG_STRING_BYTES
    assert json_or_str(f'{{"a": "{pad}", "n": NaN, "d": 1, "d": 2}}')["d"] == 2
    assert json_or_str(f'{{"a": "{pad}"') == f'{{"a": "{pad}"'
    lone = f'{{"a": "{pad}\ud800"}}'
    assert json_or_str(lone) == json.loads(lone)


def test_long_literals_finds_exactly_the_long_strings():
    """Escaped quotes (an odd run of backslashes) do not end a literal; an even run does."""
    n = json_slices.LONG_STRING_BYTES
    inner = "y" * n + '\\"' + "\\\\" * 100 + '\\"' + "z"
    raw = f'{{"short": "ab", "long": "{inner}", "k": "{"w" * (n - 1)}"}}'.encode()
    start = raw.index(b"y")
    assert json_slices.long_literals(raw) == [(start, start + len(inner.encode()))]
