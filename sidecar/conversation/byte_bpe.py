"""The exact fast path of byte-level BPE tokenizers (Qwen2/3, Llama 3 and their kin): ASCII text
encoded by tiktoken from the backend's own vocabulary, about a seventh of the backend's CPU.

Why: a continuing turn tokenizes its new messages (a tool result of thousands of characters), and
the ``tokenizers`` backend spends most of that in its Oniguruma pre-tokenizer regex; tiktoken runs
the same split and the same byte-pair merges several times faster. Used only where it provably
gives the backend's ids, else the backend is called as before:

* the pipeline: no normalizer that changes ASCII (none, or Unicode NF[K]C/D), one ``Split`` by a
  regex (isolated) then ``ByteLevel`` without its own regex or prefix space, a plain BPE model
  (no dropout, affixes or byte fallback in play) over the 256-byte alphabet;
* added tokens: all matched verbatim (not normalized, no strip, not single-word), so the backend
  splits them out before anything else; they are split out here the same way (leftmost, longest);
* the text between them: ASCII only (where the two regex engines' classes and case folding agree,
  and every normalizer is the identity), with a pattern of the portable syntax both engines read
  alike (``portable_pattern``); a piece with any other character goes to the backend alone, which
  gives the ids it gives inside the whole text (the backend encodes between added tokens
  independently);
* the merges: BPE by merge order (the backend) and by rank of the merged token (tiktoken) agree
  on every word when each multi-byte token has one merge, merges come in the order of the ids
  they make, and the backend turns every token's own text into that token alone. Then by
  induction on length the last merge tiktoken makes inside any token's span is that token's one
  merge, so both take the same leftmost-lowest merge at every step. Checked at start-up.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from typing import Any, Callable

_NF_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD"}  # the identity on ASCII
# Split patterns that match at every position of any ASCII text, never empty (Qwen2/3 and Llama 3;
# cl100k's with \p{N}{1,3}): each ASCII character starts an alternative that needs only it (a
# letter, a digit, another non-space, a space), no alternative matches empty, and tiktoken drops
# nothing, so its ids need no check that they cover the text.
TOTAL_PATTERNS = frozenset({
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""",
})
_CLASS_ESCAPES = set("sSdDwWrnt")  # escapes whose ASCII meaning both regex engines share
_GROUPS = ("(?:", "(?i:", "(?!", "(?=")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: byte -> the character the vocabulary spells it with."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1), *range(ord("\xae"), ord("\xff") + 1)]
    cs = list(bs)
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def portable_pattern(pattern: str) -> bool:
    """Whether Oniguruma (the backend's regex, Ruby syntax) and fancy-regex (tiktoken's) match
    ``pattern`` alike on ASCII text: literals, classes without nesting or set operations,
    ``\\p{..}`` and the class escapes above, greedy or lazy quantifiers, ``|``, plain,
    non-capturing, case-insensitive and lookahead groups. No anchors (``^ $`` mean lines in Ruby
    syntax), no ``.``, no possessive quantifier, no other escape or flag."""
    i, n, in_class = 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if c == "\\":
            if i + 1 >= n:
                return False
            e = pattern[i + 1]
            if e in "pP":
                m = re.match(r"\{\^?[A-Za-z_]+\}", pattern[i + 2 :])
                if m is None:
                    return False
                i += 2 + m.end()
                continue
            if not (e in _CLASS_ESCAPES or (not e.isalnum() and e.isascii() and e != "\n")):
                return False
            i += 2
            continue
        if in_class:
            if c == "[" or pattern.startswith(("&&", "--", "~~"), i):
                return False
            in_class = c != "]"
            i += 1
            continue
        if c == "[":
            i += 2 if pattern.startswith("[^", i) else 1
            if i >= n or pattern[i] == "]":
                return False
            in_class = True
            continue
        if c in "^$.#":
            return False
        if c == "(" and pattern.startswith("(?", i):
            group = next((g for g in _GROUPS if pattern.startswith(g, i)), None)
            if group is None:
                return False
            i += len(group)
            continue
        if c == "{" and not re.match(r"\{\d+(,\d*)?\}", pattern[i:]):
            return False
        if c in "*+?}" and pattern.startswith("+", i + 1):
            return False  # possessive
        i += 1
    return not in_class


def _identity_on_ascii(normalizer: dict | None) -> bool:
    if normalizer is None:
        return True
    if normalizer.get("type") == "Sequence":
        return all(_identity_on_ascii(step) for step in normalizer.get("normalizers") or ())
    return normalizer.get("type") in _NF_NORMALIZERS


def _split_pattern(pre_tokenizer: dict | None) -> str | None:
    """The regex of a ``Split`` (isolated) + ``ByteLevel`` (no regex, no prefix space) pipeline."""
    if not pre_tokenizer or pre_tokenizer.get("type") != "Sequence":
        return None
    steps = pre_tokenizer.get("pretokenizers") or []
    if len(steps) != 2:
        return None
    split, byte_level = steps
    pattern = (split.get("pattern") or {}).get("Regex")
    if (
        split.get("type") != "Split" or not isinstance(pattern, str) or split.get("behavior") != "Isolated"
        or split.get("invert") or byte_level.get("type") != "ByteLevel" or byte_level.get("use_regex")
        or byte_level.get("add_prefix_space")
    ):
        return None
    return pattern


def _plain_bpe(model: dict) -> bool:
    return (
        model.get("type") == "BPE" and not model.get("dropout") and not model.get("continuing_subword_prefix")
        and not model.get("end_of_word_suffix")
    )


class ByteLevelBPE:
    """``encode(text)``: the backend's ids, ASCII pieces by tiktoken (see the module docstring)."""

    def __init__(self, encoding, added: dict[str, int], backend_encode: Callable[[str], list[int]], total: bool = False):
        self._encoding = encoding
        self._total = total  # the pattern covers every ASCII text (TOTAL_PATTERNS)
        self._encode_ordinary = encoding.encode_ordinary
        self._decode_bytes = encoding.decode_bytes
        self._added = added
        self._backend_encode = backend_encode
        ordered = sorted(added, key=len, reverse=True)  # at one position the longest wins, as in the backend
        self._split = re.compile("(" + "|".join(map(re.escape, ordered)) + ")").split if ordered else None

    @classmethod
    def build(cls, backend, config: dict[str, Any] | None = None) -> ByteLevelBPE | None:
        """The fast path of ``backend`` (a ``tokenizers.Tokenizer``), or None when it cannot be
        proven to give the same ids (or tiktoken is not installed). The proof costs about a second
        for a 150K vocabulary; it is kept for the process per vocabulary (a digest of its JSON)."""
        text = backend.to_str()
        key = hashlib.blake2b(text.encode(), digest_size=16).digest()
        with _PROVEN_LOCK:
            if key not in _PROVEN:
                _PROVEN[key] = _prove(json.loads(text) if config is None else config)
                while len(_PROVEN) > _PROVEN_MAX:
                    _PROVEN.pop(next(iter(_PROVEN)))
            proven = _PROVEN[key]
        if proven is None:
            return None
        encoding, added, pattern = proven

        def backend_encode(piece: str) -> list[int]:
            return backend.encode_batch_fast([piece], add_special_tokens=False)[0].ids

        return cls(encoding, added, backend_encode, pattern in TOTAL_PATTERNS)

    def encode(self, text: str) -> list[int]:
        if self._split is None:
            return self._piece(text)
        pieces = self._split(text)
        if len(pieces) == 1:
            return self._piece(text)
        ids: list[int] = []
        added = self._added
        for i, piece in enumerate(pieces):
            if i % 2:
                ids.append(added[piece])
            elif piece:
                ids += self._piece(piece)
        return ids

    def _piece(self, text: str) -> list[int]:
        """Text without added tokens: tiktoken if it is ASCII and every character was matched by
        the pattern (tiktoken drops what no match covers; the backend keeps it), else the backend."""
        if text.isascii():
            try:
                ids = self._encode_ordinary(text)
            except BaseException as exc:  # fancy-regex past its backtracking limit: pyo3's PanicException
                if type(exc).__name__ != "PanicException":
                    raise
            else:
                if self._total or len(self._decode_bytes(ids)) == len(text):
                    return ids
        return self._backend_encode(text)


_PROVEN: dict[bytes, tuple[Any, dict[str, int], str] | None] = {}  # vocabulary digest -> (tiktoken encoding, added ids, pattern)
_PROVEN_MAX = 4
_PROVEN_LOCK = threading.Lock()


def _prove(config: dict[str, Any]) -> tuple[Any, dict[str, int], str] | None:
    """The tiktoken encoding, the added tokens' ids and the split pattern, if every premise of the
    module docstring holds."""
    try:
        import tiktoken
    except ImportError:  # pragma: no cover - tiktoken comes with the sidecar's dependencies
        return None
    model = config.get("model") or {}
    pattern = _split_pattern(config.get("pre_tokenizer"))
    if pattern is None or not portable_pattern(pattern) or not _plain_bpe(model):
        return None
    if not _identity_on_ascii(config.get("normalizer")):
        return None
    added_tokens = config.get("added_tokens") or []
    if any(t.get("normalized") or t.get("lstrip") or t.get("rstrip") or t.get("single_word") for t in added_tokens):
        return None
    added = {t["content"]: t["id"] for t in added_tokens if t.get("content")}
    vocab = _model_vocab(model, added)
    ranks = _ranks(vocab, model.get("merges") or [])
    if ranks is None:
        return None
    try:
        encoding = tiktoken.Encoding("sidecar-byte-bpe", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    except ValueError:  # a pattern fancy-regex does not compile
        return None
    if not _every_token_is_its_own_word(vocab, model["merges"]):
        return None
    return encoding, added, pattern


def _model_vocab(model: dict, added: dict[str, int]) -> dict[str, int] | None:
    """The model's vocabulary less the added tokens no merge makes (a trainer puts special tokens
    there too): they are split out before the model sees any text, so it never makes them."""
    vocab = model.get("vocab")
    if not isinstance(vocab, dict):
        return None
    made = {"".join(m) if isinstance(m, list) else m.replace(" ", "", 1) for m in model.get("merges") or ()}
    return {t: i for t, i in vocab.items() if t not in added or t in made}


def _ranks(vocab: dict[str, int] | None, merges: list) -> dict[bytes, int] | None:
    """The vocabulary as tiktoken's ranks (bytes -> id), if it is byte-level over all 256 bytes
    and its merges are one per multi-byte token, in the order of the ids they make."""
    if vocab is None:
        return None
    to_byte = {c: b for b, c in _bytes_to_unicode().items()}
    ranks: dict[bytes, int] = {}
    for token, i in vocab.items():
        try:
            ranks[bytes([to_byte[ch] for ch in token])] = i
        except KeyError:  # a character outside the byte-level alphabet
            return None
    if len(ranks) != len(vocab) or len(set(ranks.values())) != len(ranks):
        return None
    if any(bytes([b]) not in ranks for b in range(256)):
        return None
    if len(merges) != len(ranks) - 256:
        return None
    last = -1
    for merge in merges:
        a, b = merge if isinstance(merge, list) else merge.split(" ", 1)
        made = vocab.get(a + b)
        if made is None or made <= last or a not in vocab or b not in vocab:
            return None
        last = made
    return ranks


def _every_token_is_its_own_word(vocab: dict[str, int], merges: list) -> bool:
    """The backend's BPE turns each token's own text into that token alone (the last premise of
    the module docstring's induction), checked on a copy of the model with merges never skipped:
    the tokens joined by spaces (no character of the byte-level alphabet is whitespace) and split
    there again, in a few batches (the backend spreads them over its threads)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    pairs = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in merges]
    check = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=False))
    check.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokens = sorted(vocab, key=vocab.__getitem__)
    step = max(1, -(-len(tokens) // 8))
    chunks = [tokens[i : i + step] for i in range(0, len(tokens), step)]
    encodings = check.encode_batch_fast([" ".join(chunk) for chunk in chunks], add_special_tokens=False)
    return all(e.ids == [vocab[t] for t in chunk] for chunk, e in zip(chunks, encodings))
