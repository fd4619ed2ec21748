"""What goes first: the plugin's one eviction key, and the order in which pressure releases leases.

Like SGLang's ``mem_cache/evict_policy.py`` (a strategy is a sort key), pure and small: the
strategy (no host tier) and ``HostTier`` (with one) both build their key here, and the valves take
their victims from ``release_order``. Lower keys go first. No sglang import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .lease_table import Lease


def eviction_key(
    last_access_time: float,
    *,
    soft_leased: bool = False,
    host_tier: bool = False,
    reloadable: bool = True,
    lease_due_back: float | None = None,
) -> tuple:
    """The GPU (and host) eviction key of one node.

    Without a host tier: ``(1 if the node is the tail of a live soft lease else 0, LRU)``:
    exactly LRU for everything not softly leased (hard leases are locked, never candidates).

    With a host tier, by what bringing the KV back costs: ``(no host copy, leased, -due back |
    LRU)``: backed-up KV before KV without a host copy; within each, KV no lease covers (LRU),
    then leased KV, the session expected back latest first. ``lease_due_back`` is the covering
    lease's expected return (None: no lease covers the node)."""
    if not host_tier:
        return (1 if soft_leased else 0, last_access_time)
    unbacked = 0 if reloadable else 1
    if lease_due_back is None:
        return (unbacked, 0, last_access_time)
    return (unbacked, 1, -lease_due_back)


def prefetch_threshold(lease_due_back: float) -> tuple[int, int, float]:
    """The key of backed-up KV leased by a session due back then: a prefetch for it may evict only
    what sorts before this."""
    return (0, 1, -lease_due_back)


def release_order(
    leases: Sequence[Lease],
    exclusive: dict[str, int],
    now: float | None,
    spare: Any = frozenset(),
) -> list[Lease]:
    """Leases from least to most valuable: what pressure (valves, the bound, yields) gives up first.

    Value = tokens only this lease protects / seconds until the session is
    expected back (remaining TTL): the longest expected absence per token held
    goes first. Two groups go last: leases that protect no token of their own
    (releasing them frees nothing) and, after them, sessions in ``spare`` (a
    request of theirs is queued or running, so the lease is about to be used).
    Ties break by grant order, so every rank picks the same lease.
    """

    def key(lease: Lease):
        tokens = exclusive.get(lease.session_id, 0)
        absence = max(lease.remaining_s(now), 1e-3)
        return (lease.session_id in spare, tokens <= 0, tokens / absence, lease.seq)

    return sorted(leases, key=key)
