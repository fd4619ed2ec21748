"""Exact, cheap tokenizer calls: encode and decode straight on the Rust backend, and where a text
may be cut so that its two halves tokenize independently.

transformers' ``encode``/``decode`` wrap the ``tokenizers`` backend in ~10-20 us of Python per call
(argument handling, a batch of one, BatchEncoding); the relay decodes twice per streamed chunk. The
backend is called directly only when that provably gives the same ids and text (a plain fast
tokenizer, no cleanup of spaces, no truncation or padding configured); otherwise every call goes
through transformers unchanged.
"""

from __future__ import annotations

import json
import weakref
from typing import Sequence

try:  # transformers 5 (TokenizersBackend) and 4 (PreTrainedTokenizerFast)
    from transformers.tokenization_utils_tokenizers import TokenizersBackend as _FastBase
except ImportError:  # pragma: no cover - older transformers
    from transformers import PreTrainedTokenizerFast as _FastBase
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from sidecar.conversation.byte_bpe import ByteLevelBPE


def _not_overridden(cls: type, name: str, base: type) -> bool:
    return getattr(cls, name, None) is getattr(base, name, None)


class TooManyTokens(Exception):
    """A text has more tokens than allowed; ``at_least`` is a true lower bound of its count."""

    def __init__(self, at_least: int, limit: int):
        super().__init__(f"at least {at_least} tokens, more than {limit}")
        self.at_least = at_least
        self.limit = limit


COUNT_AHEAD_CHARS_PER_TOKEN = 4  # a text longer than this x its limit is counted piece by piece first
COUNT_PIECE_CHARS = 1 << 16
CUT_SLACK = 16  # tokens a cut between pieces may add (merges across it lost, text around it split anew)


def _cut_after(text: str, at: int) -> int:
    """Where to end a piece near ``at``: after a line break that a non-space follows (the
    pre-tokenizers of BPE models split there), else after a space, else at ``at``."""
    if at >= len(text):
        return len(text)
    for mark in ("\n", " "):
        i = text.find(mark, at, at + 65536)
        while 0 <= i < len(text) - 1 and text[i + 1].isspace():
            i = text.find(mark, i + 1, at + 65536)
        if i >= 0:
            return i + 1
    return at


# How far each normalizer may shrink a text's UTF-8 bytes, at most (NFC composes three Hangul
# jamo into one syllable; NFKC maps a 4-byte mathematical letter to ASCII). Others: unknown.
_NORMALIZER_SHRINK = {"NFC": 3, "NFD": 3, "NFKC": 4, "NFKD": 4}
_KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Digits", "Metaspace", "Punctuation", "Split"}  # none drops text


def max_chars_per_token(backend, config: dict | None = None) -> int | None:
    """The most characters of input text one token can stand for, if the pipeline lets that be
    known: a BPE model that cannot fall back to an unknown token (byte-level, or byte fallback),
    normalizers that shrink text by a bounded factor, pre-tokenizers that drop nothing. A text of
    ``n`` characters then has at least ``n // max_chars_per_token`` tokens (a character is at least
    a byte). None when any step could make one token of arbitrarily much text."""
    config = json.loads(backend.to_str()) if config is None else config
    model = config.get("model") or {}
    shrink = _shrink(config.get("normalizer"))
    steps = list(_flatten(config.get("pre_tokenizer"), "pretokenizers"))
    byte_level = any(step.get("type") == "ByteLevel" for step in steps)
    if (
        model.get("type") != "BPE"
        or shrink is None
        or not all(s.get("type") in _KEEPING_PRE_TOKENIZERS and s.get("behavior") != "Removed" for s in steps)
        or not (byte_level or (model.get("byte_fallback") and not model.get("fuse_unk")))
    ):
        return None
    # byte-level: each character of a vocabulary entry is one byte; otherwise its UTF-8 length bounds it
    size = len if byte_level else (lambda token: len(token.encode()))
    longest = max(size(token) for token in backend.get_vocab(with_added_tokens=False))
    added = [len(t.content.encode()) for t in backend.get_added_tokens_decoder().values()]
    return max([longest, *added]) * shrink


def _flatten(step, key):
    if not step:
        return
    if step.get("type") == "Sequence":
        for inner in step.get(key) or ():
            yield from _flatten(inner, key)
    else:
        yield step


def _shrink(normalizer) -> int | None:
    factor = 1
    for step in _flatten(normalizer, "normalizers"):
        f = _NORMALIZER_SHRINK.get(step.get("type"))
        if f is None:
            return None
        factor *= f
    return factor


_PLAIN_BACKENDS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # tokenizer -> its plain backend
_FAST_PATHS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # tokenizer -> (ByteLevelBPE | None, vocab size)


def _is_control(special: bool | None, normalized: bool | None) -> bool:
    return bool(special) or not normalized


class TokenCodec:
    """``encode(text)`` / ``decode(ids, skip_special_tokens)`` with transformers' exact results."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None) if isinstance(tokenizer, _FastBase) else None
        cls = type(tokenizer)
        plain = backend is not None and all(
            _not_overridden(cls, name, base)
            for name, base in (("encode", PreTrainedTokenizerBase), ("decode", PreTrainedTokenizerBase),
                               ("_encode_plus", _FastBase), ("_decode", _FastBase))
        )
        self._backend = backend if plain else None
        self._fast_batch = hasattr(backend, "encode_batch_fast")  # tokenizers >= 0.21
        self._decode_exact = plain and not getattr(tokenizer, "clean_up_tokenization_spaces", False)
        config = json.loads(backend.to_str()) if backend is not None else None  # read once, it is megabytes
        self._max_chars_per_token = max_chars_per_token(backend, config) if backend is not None else None
        # tiktoken on the backend's vocabulary where that provably gives its ids (byte_bpe.py); built
        # once per tokenizer, and dropped if tokens are added to the backend later
        self._fast: ByteLevelBPE | None = None
        self._fast_vocab = 0
        if self._backend is not None:
            if tokenizer not in _FAST_PATHS:
                _FAST_PATHS[tokenizer] = (ByteLevelBPE.build(self._backend, config), self._backend.get_vocab_size(True))
            self._fast, self._fast_vocab = _FAST_PATHS[tokenizer]
        # the backend that spells control tokens as text: made now (seconds for a large vocabulary,
        # which the first request whose text spells a control token would otherwise spend on the loop)
        self._plain = _PLAIN_BACKENDS.get(tokenizer) if self._backend is not None else None
        if self._backend is not None and self._plain is None:
            self._plain = _PLAIN_BACKENDS[tokenizer] = self._backend_matching_no_control_token(config)
        # Tokens the backend splits out before anything else; a cut next to one is a clean cut.
        self._added: list[str] = []
        self._boundary: tuple[str, ...] = ()
        if self._backend is not None and not getattr(tokenizer, "split_special_tokens", False):
            added = list(self._backend.get_added_tokens_decoder().values())
            self._added = [t.content for t in added if t.content]
            self._boundary = tuple(
                t.content for t in added if t.content and not (t.normalized or t.lstrip or t.rstrip or t.single_word)
            )
            if self._boundary and not self._cuts_cleanly(self._boundary[0]):
                self._boundary = ()  # e.g. a normalizer or pre-tokenizer that treats the start specially

    def _backend_ready(self) -> bool:
        """The backend encodes as transformers' untruncated, unpadded call would."""
        b = self._backend
        return b is not None and b.truncation is None and b.padding is None and not b.encode_special_tokens

    def encode(self, text: str, limit: int = 0) -> list[int]:
        """The ids of ``text``; with ``limit`` > 0, TooManyTokens instead of more ids than that
        (checked on the character count before any work, then while counting a long text ahead,
        then on the encoding before its ids become a Python list)."""
        if self._backend_ready():
            return self._encode_on(self._backend, text, limit)
        if limit:
            self.check_fits(len(text), limit)
        return self._within(list(self.tokenizer.encode(text, add_special_tokens=False)), limit)

    def encode_as_text(self, text: str, limit: int = 0) -> list[int]:
        """``encode``, with control tokens in ``text`` encoded as the plain text they spell (a
        second backend with ``encode_special_tokens``: the shared one is never toggled)."""
        if self._backend is None:
            if limit:
                self.check_fits(len(text), limit)
            ids = self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
            return self._within(list(ids), limit)
        return self._encode_on(self._plain, text, limit)

    def _backend_matching_no_control_token(self, config: dict):
        """A copy of the backend on which every control token (``control_tokens``) is flagged
        special and ``encode_special_tokens`` is set: it encodes their spellings as the text they
        are (``encode_special_tokens`` alone spares the unflagged ones, Qwen3's ``<tool_call>``)."""
        from tokenizers import Tokenizer

        config = {**config, "added_tokens": [dict(t) for t in config.get("added_tokens") or ()]}  # the shared one unchanged
        for token in config.get("added_tokens") or ():
            if _is_control(token.get("special"), token.get("normalized")):
                token["special"] = True
        plain = Tokenizer.from_str(json.dumps(config))
        plain.encode_special_tokens = True
        return plain

    def _encode_on(self, backend, text: str, limit: int) -> list[int]:
        if limit:
            self.check_fits(len(text), limit)
            if len(text) > COUNT_AHEAD_CHARS_PER_TOKEN * limit:
                self._count_ahead(backend, text, limit)
        ids = self._ids(backend, text)
        if limit and len(ids) > limit:
            raise TooManyTokens(len(ids), limit)
        return ids

    @staticmethod
    def _within(ids: list[int], limit: int) -> list[int]:
        if limit and len(ids) > limit:
            raise TooManyTokens(len(ids), limit)
        return ids

    def _ids(self, backend, text: str) -> list[int]:
        fast = self._fast
        if fast is not None and backend is self._backend and backend.get_vocab_size(True) == self._fast_vocab:
            return fast.encode(text)
        if self._fast_batch:  # skips character offsets (unused here): same ids, ~20 % less time
            return backend.encode_batch_fast([text], add_special_tokens=False)[0].ids
        return backend.encode(text, add_special_tokens=False).ids

    def _count_ahead(self, backend, text: str, limit: int) -> None:
        """A long text counted piece by piece, cut after line breaks: TooManyTokens as soon as the
        pieces so far are past ``limit`` (less CUT_SLACK a cut, for the merges a cut prevents), so
        the work is bounded by the limit, not by the text: a 50 MB prompt costs what its first
        limit's worth of tokens cost."""
        total = cuts = start = 0
        while start < len(text):
            end = _cut_after(text, start + COUNT_PIECE_CHARS)
            total += len(self._ids(backend, text[start:end]))
            start = end
            cuts += start < len(text)
            if total - CUT_SLACK * cuts > limit:
                raise TooManyTokens(total - CUT_SLACK * cuts, limit)

    def special_tokens(self) -> list[str]:
        """The control tokens (added tokens marked special: <|im_start|>, <|im_end|>, ...)."""
        if self._backend is None:
            return [t for t in self.tokenizer.all_special_tokens if t]
        return [t.content for t in self._backend.get_added_tokens_decoder().values() if t.special and t.content]

    def control_tokens(self) -> dict[str, int]:
        """Every added token the template or the model reads as structure, flagged special or not
        (Qwen3's ``<tool_call>``, ``<tool_response>``, ``<think>``, FIM markers are not): text -> id.
        An added token that is normalized like text and not special is a word, not a control."""
        if self._backend is None:
            return {t: self.tokenizer.convert_tokens_to_ids(t) for t in self.special_tokens()}
        return {
            t.content: i
            for i, t in self._backend.get_added_tokens_decoder().items()
            if t.content and _is_control(t.special, t.normalized)
        }

    def fewest_tokens(self, n_chars: int) -> int:
        """A lower bound of the tokens of any text of ``n_chars`` characters (0 if unknown)."""
        return n_chars // self._max_chars_per_token if self._max_chars_per_token else 0

    def check_fits(self, n_chars: int, limit: int) -> None:
        """TooManyTokens if a text of ``n_chars`` characters cannot have ``limit`` tokens or fewer."""
        fewest = self.fewest_tokens(n_chars)
        if limit and fewest > limit:
            raise TooManyTokens(fewest, limit)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        if self._decode_exact:
            return self._backend.decode(ids if isinstance(ids, list) else list(ids), skip_special_tokens=skip_special_tokens)
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def _cuts_cleanly(self, token: str) -> bool:
        """Probe: pieces on either side of ``token`` encode the same alone as together."""
        left, right = "Hello world.\n", "\n  Second line, with spaces"
        whole = self.encode(left + token + right)
        return whole == self.encode(left) + self.encode(token + right) == self.encode(left + token) + self.encode(right)

    def splits_at(self, text: str, pos: int) -> bool:
        """True if ``encode(text) == encode(text[:pos]) + encode(text[pos:])`` is guaranteed.

        The backend first splits the text at added tokens (``<|im_start|>``, ...), then normalizes
        and pre-tokenizes each piece on its own. So a cut right before or after an added token that
        matches verbatim (not normalized, strips no neighbouring spaces) separates independent
        pieces, provided no added token occurs across the cut (it could win the match instead).
        """
        if not self._boundary or not 0 < pos < len(text):
            return False
        if not (text.startswith(self._boundary, pos) or text.endswith(self._boundary, 0, pos)):
            return False
        for content in self._added:
            n = len(content)
            if n > 1 and content in text[max(0, pos - n + 1) : pos + n - 1]:
                return False
        return True
