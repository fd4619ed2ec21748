"""HiCache's L3 storage tier shared by several stand-in workers: what ``--hicache-storage-backend
file`` on a path every worker mounts (or mooncake) gives SGLang 0.5.23.

SGLang writes KV through to storage under keys chained from the token ids (and the request's
``cache_salt``), the same on every worker of one model, so a worker that never saw a session
finds its history there and reads it back instead of recomputing it. The stand-in keeps that
contract at the level the sidecar sees: a request's prefix found in the store counts as cached
(``cached_tokens``, ``cached_tokens_details.storage``); the time such a read takes is the
simulator's business (``simulate --shared-l3``), not the stand-in's, whose steps are paced.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence


class SharedStorage:
    """One store for several ``SGLangStandIn(l3=...)``: the chained key of every page written."""

    def __init__(self, page_size: int = 1):
        self.page_size = page_size
        self._keys: set[bytes] = set()
        self.reads = 0  # requests that found a prefix here
        self.tokens_read = 0

    def write(self, ids: Sequence[int], salt: str | None) -> None:
        """A finished request's KV (prompt + output but the last token) is written through."""
        for key in self._chain(ids, salt):
            self._keys.add(key)

    def match(self, ids: Sequence[int], salt: str | None) -> int:
        """Tokens of ``ids``' prefix the store holds (whole pages)."""
        found = 0
        for key in self._chain(ids, salt):
            if key not in self._keys:
                break
            found += self.page_size
        return found

    def read(self, ids: Sequence[int], salt: str | None) -> int:
        """``match``, counted as a read-back."""
        found = self.match(ids, salt)
        if found:
            self.reads += 1
            self.tokens_read += found
        return found

    def _chain(self, ids: Sequence[int], salt: str | None):
        digest = hashlib.sha256((salt or "").encode()).digest()
        page = self.page_size
        for start in range(0, len(ids) - len(ids) % page, page):
            digest = hashlib.sha256(digest + b",".join(str(t).encode() for t in ids[start : start + page])).digest()
            yield digest
