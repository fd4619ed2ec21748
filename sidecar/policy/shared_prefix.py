"""Which leading tokens the open sessions share: SGLang's radix tree (and its host tier) holds a
prefix once however many sessions start with it, so the admission gate counts it once too.

Sessions of one agent deployment start alike (the system prompt and the tool definitions: 3,254 of
the first 3,759 tokens of the reference agents through the OpenAI path), then each goes its own
way. At a session's first request its prompt is cut into blocks of ``BLOCK_TOKENS``, each named by
a hash chained over the blocks before it (so a name stands for the whole prefix up to that block,
as a radix-tree path does), and matched against the blocks of the open sessions' first prompts:
the leading blocks found are the prefix it shares (``Share``: the last shared block's name and the
tokens up to it). An open session that had no share yet (the first of its kind) joins the new one's,
so the whole group counts the prefix once (``projection.Projection.peak``).

Only whole blocks count, and a session that already shares a prefix keeps its own: both err toward
counting a token twice, never toward counting a token that is not held. Only the first
``MAX_INDEXED_TOKENS`` of a prompt are indexed: a shared prefix is a system block, not a history.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

BLOCK_TOKENS = 64
MAX_INDEXED_TOKENS = 16_384  # 256 blocks a session at most


@dataclass(frozen=True)
class Share:
    """A prefix a session shares with other open sessions: ``key`` names it, ``tokens`` long."""

    key: int
    tokens: int


def block_chain(ids: Iterable[int]) -> list[int]:
    """The names of ``ids``'s whole leading blocks, each a hash of all the tokens up to its end
    (any iterable of ids: a list, or the turn core's ``IdText``)."""
    head = list(itertools.islice(ids, MAX_INDEXED_TOKENS))
    out: list[int] = []
    h = 0
    for i in range(0, len(head) // BLOCK_TOKENS * BLOCK_TOKENS, BLOCK_TOKENS):
        h = hash((h, tuple(head[i : i + BLOCK_TOKENS])))
        out.append(h)
    return out


class SharedPrefixes:
    """The first prompts' blocks of the open sessions, and who holds each."""

    def __init__(self) -> None:
        self._holders: dict[int, set[str]] = {}  # block name -> open sessions whose first prompt has it
        self._chains: dict[str, list[int]] = {}  # session -> its first prompt's block names

    def __len__(self) -> int:
        return len(self._chains)

    def open(self, session_id: str, ids: Iterable[int], adopt: Callable[[str, Share], None]) -> Share | None:
        """A session's first prompt: what it shares with the open sessions (None: nothing), after
        ``adopt(other, share)`` for each open session that holds that prefix and shares none yet
        (``adopt`` decides; the policy sets it on records without one)."""
        self.close(session_id)
        chain = block_chain(ids)
        shared = 0
        while shared < len(chain) and self._holders.get(chain[shared]):
            shared += 1
        share = Share(chain[shared - 1], shared * BLOCK_TOKENS) if shared else None
        if share is not None:
            for other in self._holders[share.key]:
                adopt(other, share)
        self._chains[session_id] = chain
        for name in chain:
            self._holders.setdefault(name, set()).add(session_id)
        return share

    def close(self, session_id: str) -> None:
        """The session is closed: its blocks no longer count as held by it."""
        for name in self._chains.pop(session_id, ()):
            holders = self._holders.get(name)
            if holders is not None:
                holders.discard(session_id)
                if not holders:
                    del self._holders[name]
