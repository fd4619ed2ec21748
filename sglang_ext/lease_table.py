"""Lease bookkeeping: which session holds which tree node until when.

Pure data and arithmetic, no sglang import, so it can be unit-tested alone. The
tree is seen only through ``PathFn`` (node id -> the (node id, tokens) pairs from
that node up to the root), which the caller supplies.

Time is the *lease clock*: the last rank-0 timestamp the scheduler received
(see ``hooks.LeaseClockTick``), so every TP rank expires the same leases at the
same point of its request stream. A lease granted between two ticks has no
expiry yet (``expires_at is None``); the next tick stamps it with
``tick + ttl_s``. An expected return (``expect_s``) is stamped the same way
(``expected_at``). Every TTL a lease takes (grant or after-turn update) is bounded
here, by ``max_ttl_s``.
"""

from __future__ import annotations

import math

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

NodeId = int
Path = Sequence[tuple[NodeId, int]]
PathFn = Callable[[NodeId], Path]

HARD = "hard"
SOFT = "soft"


@dataclass
class Lease:
    """One session's claim on the KV ending at ``node_id``.

    ``tier`` is HARD (the node is locked in the tree: not evictable, not free for
    admission) or SOFT (unlocked; the eviction strategy ranks it after unleased KV).
    ``handle`` is the tree lock of a hard lease, opaque here. ``expect_s`` / ``spread_s``:
    when the session is expected back (seconds after the stamp) and how much earlier it
    may come; ``prefetch`` is "issued" while KV loaded ahead of the return awaits it;
    ``returned``: a request of the session was admitted since the grant.
    """

    session_id: str
    node_id: NodeId
    ttl_s: float
    seq: int
    tier: str
    expires_at: float | None = None
    handle: Any = field(default=None, repr=False)
    expect_s: float | None = None
    spread_s: float = 0.0
    expected_at: float | None = None
    prefetch: str | None = None
    returned: bool = False

    @property
    def hard(self) -> bool:
        return self.tier == HARD

    def remaining_s(self, now: float | None) -> float:
        """Expected absence still to come; the full TTL while not yet stamped."""
        if self.expires_at is None or now is None:
            return self.ttl_s
        return max(self.expires_at - now, 0.0)

    def expected_back(self, now: float | None) -> float | None:
        """Lease-clock time the session is expected back, None without an expectation."""
        if self.expect_s is None:
            return None
        if self.expected_at is not None:
            return self.expected_at
        return (now or 0.0) + self.expect_s

    def due_back(self, now: float | None) -> float:
        """The expected return, or (without one) the end of the lease: what orders eviction."""
        expected = self.expected_back(now)
        if expected is not None:
            return expected
        if self.expires_at is not None:
            return self.expires_at
        return (now or 0.0) + self.ttl_s


class LeaseTable:
    """At most one lease per session, plus a clock and an expiry index."""

    def __init__(self, max_ttl_s: float = math.inf) -> None:
        self.max_ttl_s = max_ttl_s
        self._by_session: dict[str, Lease] = {}
        self._by_node: dict[NodeId, dict[str, Lease]] = {}
        self._seq = 0
        self.clock: float | None = None
        self._expiry_index: tuple[bool, float | None] | None = None  # cache, see _index

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self._by_session)

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._by_session

    def get(self, session_id: str) -> Lease | None:
        return self._by_session.get(session_id)

    def leases(self, tier: str | None = None) -> list[Lease]:
        """Leases in grant order (deterministic across ranks)."""
        out = [l for l in self._by_session.values() if tier is None or l.tier == tier]
        out.sort(key=lambda l: l.seq)
        return out

    def count(self, tier: str) -> int:
        return sum(1 for l in self._by_session.values() if l.tier == tier)

    def on_node(self, node_id: NodeId) -> list[Lease]:
        """Leases whose node is ``node_id`` (several sessions may share one)."""
        return list(self._by_node.get(node_id, {}).values())

    def is_soft_node(self, node_id: NodeId) -> bool:
        """True if a soft lease ends at this node (read by the eviction strategy)."""
        leases = self._by_node.get(node_id)
        return bool(leases) and any(l.tier == SOFT for l in leases.values())

    def has_unstamped(self) -> bool:
        return self._index()[0]

    def next_expiry(self) -> float | None:
        return self._index()[1]

    def _index(self) -> tuple[bool, float | None]:
        """(any lease unstamped, earliest expiry); cached because rank 0 asks on
        every scheduler iteration, recomputed after any change."""
        if self._expiry_index is None:
            leases = self._by_session.values()
            stamped = [l.expires_at for l in leases if l.expires_at is not None]
            unstamped_expectation = any(
                l.expect_s is not None and l.expected_at is None for l in leases
            )
            self._expiry_index = (
                len(stamped) < len(self._by_session) or unstamped_expectation,
                min(stamped) if stamped else None,
            )
        return self._expiry_index

    # ---------------------------------------------------------------- mutations
    def put(
        self,
        session_id: str,
        node_id: NodeId,
        ttl_s: float,
        tier: str,
        handle: Any = None,
        expect_s: float | None = None,
        spread_s: float = 0.0,
    ) -> tuple[Lease, Lease | None]:
        """Grant (or renew) the session's lease; returns (new, replaced-or-None)."""
        old = self.pop(session_id)
        self._expiry_index = None
        self._seq += 1
        lease = Lease(
            session_id, node_id, self._bounded(ttl_s), self._seq, tier, None, handle,
            expect_s=expect_s, spread_s=float(spread_s),
        )
        self._by_session[session_id] = lease
        self._by_node.setdefault(node_id, {})[session_id] = lease
        return lease, old

    def pop(self, session_id: str) -> Lease | None:
        lease = self._by_session.pop(session_id, None)
        if lease is not None:
            self._expiry_index = None
            on_node = self._by_node.get(lease.node_id)
            if on_node is not None:
                on_node.pop(session_id, None)
                if not on_node:
                    del self._by_node[lease.node_id]
        return lease

    def demote(self, session_id: str) -> Lease:
        """Turn a hard lease soft, keeping its expiry; the caller unlocks the node."""
        lease = self._by_session[session_id]
        lease.tier = SOFT
        lease.handle = None
        return lease

    def promote(self, session_id: str, handle: Any) -> Lease:
        """Turn a soft lease hard; the caller has locked its node (``handle``)."""
        lease = self._by_session[session_id]
        lease.tier = HARD
        lease.handle = handle
        return lease

    def restamp(
        self,
        session_id: str,
        ttl_s: float | None = None,
        expect_s: float | None = None,
        spread_s: float | None = None,
    ) -> Lease | None:
        """Replace the session's TTL and/or expected return, counted from the next tick."""
        lease = self._by_session.get(session_id)
        if lease is None:
            return None
        self._expiry_index = None
        if ttl_s is not None:
            lease.ttl_s, lease.expires_at = self._bounded(ttl_s), None
        if expect_s is not None:
            lease.expect_s, lease.expected_at = float(expect_s), None
        if spread_s is not None:
            lease.spread_s = float(spread_s)
        return lease

    def _bounded(self, ttl_s: float) -> float:
        """A requested TTL as the lease takes it: at most ``max_ttl_s`` (whatever a client asks)."""
        return min(float(ttl_s), self.max_ttl_s)

    def advance(self, now: float, hold: frozenset[str] | set[str] = frozenset()) -> list[Lease]:
        """Move the clock to ``now``: stamp new leases, remove and return due ones.

        Sessions in ``hold`` have a request queued or running: their lease is being used (it is
        what that request will match), so it does not expire while they wait for admission."""
        if self.clock is not None and now < self.clock:
            now = self.clock  # never run backwards
        self.clock = now
        self._expiry_index = None
        due = []
        for lease in self.leases():
            if lease.expect_s is not None and lease.expected_at is None:
                lease.expected_at = now + lease.expect_s
            if lease.expires_at is None:
                lease.expires_at = now + lease.ttl_s
            elif lease.expires_at <= now and lease.session_id not in hold:
                due.append(lease)
        for lease in due:
            self.pop(lease.session_id)
        return due

    def clear(self) -> list[Lease]:
        dropped = self.leases()
        self._expiry_index = None
        self._by_session.clear()
        self._by_node.clear()
        return dropped


# ---------------------------------------------------------------- token arithmetic
def union_tokens(paths: Iterable[Path]) -> int:
    """Tokens on the union of the paths (a shared prefix counts once)."""
    seen: set[NodeId] = set()
    total = 0
    for path in paths:
        for node_id, tokens in path:
            if node_id not in seen:
                seen.add(node_id)
                total += tokens
    return total


def exclusive_tokens(paths: dict[str, Path]) -> dict[str, int]:
    """Per key, tokens on its path that no other key's path covers."""
    cover: dict[NodeId, int] = {}
    for path in paths.values():
        for node_id, _ in path:
            cover[node_id] = cover.get(node_id, 0) + 1
    return {
        key: sum(tokens for node_id, tokens in path if cover[node_id] == 1)
        for key, path in paths.items()
    }
