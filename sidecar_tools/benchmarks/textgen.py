"""Synthetic prompt content of a wanted size: token ids for /generate, text for the OpenAI API.

Content is seeded by a string key (trace name, session id, round), so the shared system prompt is
identical across sessions and runs, and every session's own content differs from every other's
(no accidental prefix sharing).
"""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np

# Plain ids well below Qwen's special tokens (151643+) and past byte-level singletons.
TOKEN_ID_LOW, TOKEN_ID_HIGH = 1000, 150000

WORDS = """the and file return value error test def class import from self data path line with for not
none true false list dict string int print run code function module name type args result check update
build config output input server client request response cache token model session user time size count
index key item node tree table row column query load save read write open close start stop step case state
event message log debug info warning call method object field option default source target branch commit
patch fix bug issue change block page view text word number float bool array map set get put post head body
main core base api app web http json shell command script package version release example sample number
first last next previous new old all any each other more most some such only same than then there these
they this that what when where which while who will would about after again against because before being
between both could did does doing down during few further have having here how into just like make many
may might must need over own should since still through under until very want well were""".split()


def _rng(key: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(key.encode()))


def token_ids(key: str, n: int) -> list[int]:
    """``n`` deterministic token ids for ``key``."""
    return _rng(key).integers(TOKEN_ID_LOW, TOKEN_ID_HIGH, size=n).tolist() if n > 0 else []


class TextSource:
    """Text that tokenizes to about (with a tokenizer: exactly) the wanted number of tokens.

    Each word is written with a leading space; BPE pre-tokenizers split on that space, so a text of
    ``n`` single-token words is ``n`` tokens. Without a tokenizer we trust the word list (common
    words are one token in GPT-style and Qwen vocabularies); with one we keep only words that are.
    """

    def __init__(self, tokenizer_dir: str | Path | None = None):
        self.words = list(dict.fromkeys(WORDS))
        self.exact = False
        if tokenizer_dir:
            self.words = self._single_token_words(Path(tokenizer_dir))
            self.exact = True

    def _single_token_words(self, tokenizer_dir: Path) -> list[str]:
        from tokenizers import Tokenizer  # optional: only when calibrating

        path = tokenizer_dir / "tokenizer.json" if tokenizer_dir.is_dir() else tokenizer_dir
        tok = Tokenizer.from_file(str(path))
        words = [w for w in self.words if len(tok.encode(" " + w, add_special_tokens=False).ids) == 1]
        if len(words) < 20:
            raise ValueError(f"{path}: fewer than 20 single-token words; cannot calibrate text")
        return words

    def text(self, key: str, n_tokens: int) -> str:
        if n_tokens <= 0:
            return ""
        idx = _rng(key).integers(0, len(self.words), size=n_tokens)
        return "".join(" " + self.words[i] for i in idx)
