"""Streaming detokenization and stop-string matching.

SGLang runs with ``skip_tokenizer_init`` so it streams cumulative ``output_ids``
and no text; the sidecar turns those ids into OpenAI text deltas here.
"""

from __future__ import annotations

from typing import Sequence

_REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Turn a growing list of token ids into text deltas.

    Uses the prefix/read offset window of vLLM's ``detokenize_incrementally``:
    each update decodes only ``ids[prefix_offset:]`` and subtracts the decode of
    ``ids[prefix_offset:read_offset]``. Decoding with a little left context
    (rather than the new ids alone) is what keeps this correct for tokenizers
    whose decode of a window differs from the whole at its left edge
    (SentencePiece's leading-space stripping, byte-level BPE where one
    character spans several tokens). Cost per update is proportional to the
    window, not to the whole output.

    Text whose decode ends in U+FFFD is an incomplete UTF-8 sequence (a
    multi-byte character split across tokens); it is held back until more ids
    complete it, or released by :meth:`flush` at the end of generation.
    """

    def __init__(self, tokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []
        # ids[:read_offset] have been emitted as text; ids[prefix_offset:read_offset]
        # is the left context decoded with the pending ids.
        self._prefix_offset = 0
        self._read_offset = 0

    def _decode(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        return self._tokenizer.decode(
            ids if isinstance(ids, list) else list(ids), skip_special_tokens=self._skip_special_tokens
        )

    def _pending(self) -> tuple[str, str]:
        """(decode of the context window, decode of the window plus new ids)."""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset :])
        return prefix_text, full_text

    def update(self, all_output_ids: Sequence[int]) -> str:
        """Return the text that ``all_output_ids`` adds since the previous call."""
        n_old = len(self._ids)
        if len(all_output_ids) < n_old:
            raise ValueError(
                f"output ids shrank from {n_old} to {len(all_output_ids)}; "
                "cumulative ids must only grow"
            )
        if len(all_output_ids) == n_old:
            return ""
        self._ids.extend(all_output_ids[n_old:])

        prefix_text, full_text = self._pending()
        if len(full_text) > len(prefix_text) and not full_text.endswith(_REPLACEMENT_CHAR):
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
            return full_text[len(prefix_text) :]
        return ""

    def flush(self) -> str:
        """Release held-back text (e.g. a trailing incomplete character) at the end."""
        if self._read_offset == len(self._ids):
            return ""
        prefix_text, full_text = self._pending()
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return full_text[len(prefix_text) :]

    @property
    def output_ids(self) -> list[int]:
        """All ids seen so far (a copy)."""
        return list(self._ids)


def _longest_prefix_suffix(text: str, patterns: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of a pattern.

    That suffix may still grow into a pattern, so a streamer must hold it back.
    """
    best = 0
    for pat in patterns:
        for k in range(min(len(pat) - 1, len(text)), best, -1):
            if text.endswith(pat[:k]):
                best = k
                break
    return best


class StopMatcher:
    """Streaming stop-string detection with OpenAI semantics.

    Output is cut just before the stop string, which is not emitted. A suffix
    that might be the start of a stop string is held back, so text that later
    turns out to be part of a stop is never sent. When several stops could
    match, the one that *completes* first wins (ties: the one starting
    earliest); that is the only rule that gives the same answer however the
    text is split into deltas.
    """

    def __init__(self, stop: Sequence[str] | None) -> None:
        self._stops = [s for s in (stop or []) if s]
        self._held = ""
        self._stopped = False
        self.matched: str | None = None  # the stop string that ended the text

    @property
    def stopped(self) -> bool:
        return self._stopped

    def feed(self, text_delta: str) -> tuple[str, bool]:
        """Return (text safe to emit now, whether a stop string was hit)."""
        if self._stopped:
            return "", True
        if not self._stops:
            return text_delta, False
        buf = self._held + text_delta
        hit: tuple[int, int, str] | None = None  # (end, start, stop) of the earliest-ending stop
        for s in self._stops:
            i = buf.find(s)
            if i >= 0:
                cand = (i + len(s), i, s)
                if hit is None or cand[:2] < hit[:2]:
                    hit = cand
        if hit is not None:
            self._stopped = True
            self.matched = hit[2]
            self._held = ""
            return buf[: hit[1]], True
        keep = _longest_prefix_suffix(buf, self._stops)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """Release held text when generation ends without hitting a stop."""
        held, self._held = self._held, ""
        return "" if self._stopped else held
