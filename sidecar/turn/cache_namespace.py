"""Whose cached prefix a request may hit: SGLang's cache namespace (``cache_salt``) of a turn.

With auth on and cache isolation, each key's requests carry its scope as the salt, so no key hits
another's cached text. A request that starts with the declared shared system prompt
(``shared_prefix_file``) goes to the one shared namespace instead; there ``cached_tokens`` are
shown only as far as the key's own history or the whole shared block explain them.
"""

from __future__ import annotations

from typing import Any

SHARED_CACHE_SALT = "shared"  # never a scope (those are 16 hex digits)


class CacheNamespace:
    """The salt of a turn's /generate, and what of its cached tokens the key may see."""

    def __init__(self, isolation: bool, shared_prefix_file: str | None):
        self.isolation = isolation
        self.shared_prefix = read_shared_prefix(shared_prefix_file)

    def salt(self, scope: str, messages: list[dict[str, Any]], own_tokens: int,
             system_block: Any) -> tuple[str | None, tuple[int, int] | None]:
        """The request's salt, and in the shared namespace the view (own history's tokens, the
        shared block's) :func:`visible_cached` shows the cached tokens through (else None).
        ``system_block()``: the shared system block's ids (asked only for a session's first turn)."""
        if not scope or not self.isolation:
            return None, None
        first = messages[0] if messages else {}
        if self.shared_prefix is None or first.get("role") != "system" or first.get("content") != self.shared_prefix:
            return scope, None
        block = system_block() if not own_tokens else None
        return SHARED_CACHE_SALT, (own_tokens, len(block) if block else 0)


def visible_cached(cached: int, own: int, block: int) -> int:
    """cached_tokens as a key may see them in the shared namespace: its own history, and the
    shared system block only when all of it was cached. A partial match of the block (or of
    anything past it) could be another key's text, read out a token at a time."""
    if block and cached >= block:
        return min(cached, max(own, block))
    return min(cached, own)


def read_shared_prefix(path: str | None) -> str | None:
    """The declared shared system prompt (its file's text, less one trailing newline)."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read shared_prefix_file {path}: {exc}") from None
    return text[:-1] if text.endswith("\n") else text
