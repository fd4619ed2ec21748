"""JSON parsed without one long hold of the GIL.

jiter and pydantic-core hold the GIL for a whole parse, 1-2 ms per MB of string: a pool thread
parsing a 12 MB body holds it 15-30 ms at once, and the event loop (every stream's next chunk, every
other request) waits that long. So a text with string literals of LONG_STRING_BYTES or more is parsed
as its skeleton, each long literal's content replaced by a placeholder, and each long literal is
decoded a slice at a time (one short call of the same parser per slice, cut only between whole
characters and escapes, so the slices decode to what the literal decodes to), then put in its place.
The result is the parser's on the whole text: a text the skeleton or a slice refuses, or whose long
keys collide once decoded, is parsed whole, for the parser's own error (or result).
"""

from __future__ import annotations

import re
import secrets
from typing import Any, Callable

LONG_STRING_BYTES = 1 << 15  # a literal's content from this size is decoded apart (in slices when long)
# each slice about this long: 1-2 ms of parsing, and at glibc's mmap threshold (offload.py sets
# it), so that a slice's bytes and its decoded text are given back to the OS once freed
SLICE_BYTES = 1 << 20
SCAN_BYTES = 1 << 20  # the text is searched for long literals this much at a time
CUT_WINDOW_BYTES = 1 << 12  # how far past a slice's target end a cut is looked for

# Where a literal's content may be cut (cut at the match's end): after six bytes without a
# backslash (no escape is open, no surrogate pair is split) before a byte that starts a character;
# or before a backslash that a non-backslash precedes (an escape starts there), unless it escapes
# a low surrogate (the second half of a pair).
_CUT = re.compile(rb"[^\\]{6}(?![\x80-\xbf])|[^\\](?=\\(?!u[dD][c-fC-F]))")
# Whole characters and escapes from a known boundary (only where _CUT finds nothing: escapes of
# backslashes back to back); a surrogate pair as one.
_TOKENS = re.compile(
    rb"(?:[^\"\\\x80-\xff]|[\xc2-\xdf][\x80-\xbf]|[\xe0-\xef][\x80-\xbf]{2}|[\xf0-\xf4][\x80-\xbf]{3}"
    rb"|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|\\u[0-9a-fA-F]{4}|\\[^u])*"
)
_LOW_SURROGATE = re.compile(rb"\\u[dD][c-fC-F]")
_TOKENS_BYTES = 1 << 15  # a slice found by _TOKENS (slower per byte than the parser): this long at most


class _Collision(ValueError):
    """Two keys of one object are equal once their long literals are decoded."""


def parse_json(raw: bytes, parser: Callable[[bytes], Any]) -> Any:
    """``parser(raw)``, its long string literals decoded a slice at a time (see the module)."""
    spans = long_literals(raw) if len(raw) >= LONG_STRING_BYTES else []
    if not spans:
        return parser(raw)
    try:
        return _parse_in_slices(raw, spans, parser)
    except ValueError:
        return parser(raw)  # the parser's own error, worded as it words it


def _parse_in_slices(raw: bytes, spans: list[tuple[int, int]], parser: Callable[[bytes], Any]) -> Any:
    nonce = secrets.token_hex(12)  # no client can write a placeholder
    names = [f"{nonce}:{i}" for i in range(len(spans))]
    skeleton, at = [], 0
    for (start, end), name in zip(spans, names):
        skeleton += [raw[at:start], name.encode()]
        at = end
    skeleton.append(raw[at:])
    tree = parser(b"".join(skeleton))
    del skeleton
    texts = {name: "".join(parser(b'"' + raw[a:b] + b'"') for a, b in slices(raw, start, end))
             for (start, end), name in zip(spans, names)}
    return _put_back(tree, texts)


def _put_back(tree: Any, texts: dict[str, str]) -> Any:
    """``tree`` with each placeholder (a value or a key) replaced by its text; _Collision if a key
    so replaced equals another key of its object."""
    if isinstance(tree, str):
        return texts.get(tree, tree)
    if not isinstance(tree, (dict, list)):
        return tree
    left = len(texts)
    stack = [tree]
    while stack and left:
        node = stack.pop()
        if isinstance(node, dict):
            if any(k in texts for k in node):
                renamed: dict[str, Any] = {}
                for k, v in node.items():
                    if k in texts:
                        k, left = texts[k], left - 1
                    if k in renamed:
                        raise _Collision(k[:40])
                    renamed[k] = v
                node.clear()
                node.update(renamed)  # the same object: its parent holds it
        # values in place, a dict's or a list's alike (no entry is added or removed while iterating)
        for k, v in node.items() if isinstance(node, dict) else enumerate(node):
            if isinstance(v, str):
                if v in texts:
                    node[k] = texts[v]
                    left -= 1
            elif isinstance(v, (dict, list)):
                stack.append(v)
    return tree


def slices(raw: bytes, start: int, end: int) -> list[tuple[int, int]]:
    """``raw[start:end]`` (a literal's content) cut into slices of about SLICE_BYTES, each ending
    between whole characters and escapes (a surrogate pair kept together)."""
    out, at = [], start
    while end - at > SLICE_BYTES:
        target = at + SLICE_BYTES
        m = _CUT.search(raw, target - 6, min(end, target + CUT_WINDOW_BYTES + 8))
        cut = m.end() if m is not None and m.end() <= target + CUT_WINDOW_BYTES else _token_cut(raw, at, end)
        if cut <= at:  # nothing decodable here: the rest in one slice (the parser says why)
            break
        out.append((at, cut))
        at = cut
    out.append((at, end))
    return out


def _token_cut(raw: bytes, at: int, end: int) -> int:
    """The last boundary of whole characters and escapes within _TOKENS_BYTES of ``at`` (a boundary)."""
    stop = min(end, at + _TOKENS_BYTES)
    cut = _TOKENS.match(raw, at, stop).end()
    if cut < end and _LOW_SURROGATE.match(raw, cut):  # a pair's first half only fitted: before it
        cut = _TOKENS.match(raw, at, cut - 1).end()
    return cut


def long_literals(raw: bytes, min_bytes: int | None = None) -> list[tuple[int, int]]:
    """The content spans (start, end) of the string literals of ``raw`` of at least ``min_bytes``,
    found a SCAN_BYTES slice at a time with numpy (which lets go of the GIL): unescaped quotes (an
    even run of backslashes before them) open and close literals in turn. For invalid JSON the
    spans may be anything: the skeleton or a slice then fails and the text is parsed whole."""
    import numpy as np

    min_bytes = LONG_STRING_BYTES if min_bytes is None else min_bytes
    full = np.frombuffer(raw, np.uint8)
    spans: list[tuple[int, int]] = []
    open_at = -1  # a literal's opening quote in an earlier slice, while it is open
    for lo in range(0, len(raw), SCAN_BYTES):
        quotes = _unescaped_quotes(np, full, lo, min(len(raw), lo + SCAN_BYTES))
        if open_at >= 0 and len(quotes):
            if quotes[0] - open_at - 1 >= min_bytes:
                spans.append((open_at + 1, int(quotes[0])))
            quotes, open_at = quotes[1:], -1
        opens, closes = quotes[0::2], quotes[1::2]
        for i in np.flatnonzero(closes - opens[: len(closes)] - 1 >= min_bytes):
            spans.append((int(opens[i]) + 1, int(closes[i])))
        if len(quotes) % 2:
            open_at = int(quotes[-1])
    return spans


def _unescaped_quotes(np, full, lo: int, hi: int):
    """Positions in [lo, hi) of the quotes that an odd run of backslashes does not precede."""
    quotes = np.flatnonzero(full[lo:hi] == 34) + lo
    after = np.flatnonzero(full[np.maximum(quotes - 1, 0)] == 92) if len(quotes) else quotes
    after = after[quotes[after] > 0]
    if not len(after):
        return quotes
    at = quotes[after]
    runs = np.ones(len(at), dtype=np.int64)  # backslashes just before each
    going = np.ones(len(at), dtype=bool)
    for back in range(2, 66):  # runs are short: counted a byte further back at a time
        pos = at - back
        going &= pos >= 0
        going[going] = full[pos[going]] == 92
        runs += going
        if not going.any():
            break
    for i in np.flatnonzero(going):  # a run of more than 64: measured on the bytes
        p, n = int(at[i]), 256
        while True:
            seg = full[max(0, p - n) : p]
            other = np.flatnonzero(seg != 92)
            if len(other) or n >= p:
                runs[i] = len(seg) - 1 - int(other[-1]) if len(other) else p
                break
            n *= 4
    keep = np.ones(len(quotes), dtype=bool)
    keep[after[(runs & 1) == 1]] = False
    return quotes[keep]
