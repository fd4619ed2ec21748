"""Lease mechanism: applies lease decisions to the tree of one cache.

The rules (who gets a lease, for how long, what goes first under pressure) live
in ``lease_table``; this class turns them into tree locks and metrics. It talks
to the tree only through ``tree`` (``tree.SGLangTree`` in production), so it has
no sglang import and can run against a fake tree.

Invariants:
* a hard lease holds exactly one tree lock on its node; a soft lease holds none;
* hard-leased tokens (union of hard paths) stay <= ``limit_tokens()`` after
  every grant (overflow is demoted to soft, or dropped with soft_overflow=off);
* every lease leaves the table through ``_retire`` (which unlocks it), except
  ``forget_all`` after the tree itself was reset (its locks died with it);
* with a host tier (HiCache), ``host`` decides which leases need a lock at all
  (``host_tier``, which moves leases between tiers and asks this class to recount);
  without one every lease is hard until the bound demotes it.

What the scheduler is doing (its reserve, the request it refused) is the hooks'
business (``hooks.PassState``); nothing here keeps state for them.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from .host_tier import HostTier
from .lease_table import (
    HARD,
    SOFT,
    Lease,
    LeaseTable,
    exclusive_tokens,
    union_tokens,
)
from .metrics import LeaseMetrics
from .order import release_order
from .queue_order import WaitingOrder
from .settings import SessionTTLSettings
from .wire import LEASE_TTL_PARAM as TTL_PARAM
from .wire import asked_ttl, parse_expectation, parse_ttl

logger = logging.getLogger(__name__)

_CLOSED_TOMBSTONES = 8192  # like SGLang's session-ref tracker
_MAX_TTL_WARNINGS = 5


class LeaseManager:
    def __init__(
        self,
        tree: Any,
        settings: SessionTTLSettings,
        table: LeaseTable | None = None,
        metrics: LeaseMetrics | None = None,
    ) -> None:
        self.tree = tree
        self.settings = settings
        self.table = table if table is not None else LeaseTable(settings.max_ttl_s)
        self.metrics = metrics if metrics is not None else LeaseMetrics()
        self._closed: OrderedDict[str, None] = OrderedDict()
        self._hard_tokens = 0
        self._last_tick_sent: float | None = None
        self._ttl_warnings = 0
        self.host = HostTier(self.table, tree, settings, self.metrics, recount=self.recount)
        self.waiting_order = WaitingOrder(settings.max_priority_wait_s)
        self._refresh_gauges()

    # ------------------------------------------------------------------ numbers
    def limit_tokens(self) -> int:
        return self.settings.limit_tokens(self.tree.capacity_tokens())

    def hard_tokens(self) -> int:
        return self._hard_tokens

    def has_hard(self) -> bool:
        return self.table.count(HARD) > 0

    def holds_hard_lease(self, session_id: str | None) -> bool:
        lease = self.table.get(session_id) if session_id else None
        return lease is not None and lease.tier == HARD

    # -------------------------------------------------------------------- clock
    def wants_tick(self, now: float, busy: bool) -> bool:
        """Rank 0 only: should a clock tick be broadcast now?

        While requests are in flight the clock advances every tick_interval_s
        (grants are stamped from it); while idle only when a lease needs a stamp
        or is due, so an idle server is not kept busy by the plugin.
        """
        last = self._last_tick_sent
        if busy and (last is None or now - last >= self.settings.tick_interval_s):
            return True
        if self.table.has_unstamped():
            return True
        nxt = self.table.next_expiry()
        if nxt is not None and now >= nxt:
            return True
        return self.host.due(now)

    def tick_sent(self, now: float) -> None:
        self._last_tick_sent = now

    def on_tick(self, now: float, busy: frozenset[str] | set[str] = frozenset()) -> list[Lease]:
        """Advance the lease clock; expired leases go back to plain LRU order, except those of
        ``busy`` sessions (a request of theirs is queued or running and will use the lease)."""
        due = self.table.advance(now, busy)
        for lease in due:
            self._retire(lease)
            self.metrics.inc("expirations", tier=lease.tier)
        if due:
            self._recount()
        if self.host.active:
            self.drop_lost_leases()
            self.host.retier(set(busy))
        self._refresh_gauges()
        return due

    # ----------------------------------------------------------------- sessions
    def on_request_finished(
        self, session_id: str | None, node_id: int, custom_params: Any
    ) -> None:
        """A non-aborted request of ``session_id`` finished with its KV ending at
        ``node_id``: lease it for the requested TTL, or end the session's lease."""
        if not session_id or session_id in self._closed:
            return
        ttl = parse_ttl(custom_params, self.settings.default_ttl_s)
        if ttl is None:
            self._warn_bad_ttl(session_id, custom_params)
            self.end(session_id, reason="ended")
        elif self.tree.is_root(node_id):
            self.end(session_id, reason="ended")  # nothing cached to keep
        else:
            expect_s, spread_s = parse_expectation(custom_params)
            self.grant(session_id, node_id, ttl, expect_s, spread_s)

    def note_arrival(self, session_id: str | None) -> None:
        """A new request of the session arrived: it is open again."""
        if session_id:
            self._closed.pop(session_id, None)

    def close(self, session_id: str) -> None:
        """/close_session: release now, and ignore finishes of requests already in flight."""
        self._closed[session_id] = None
        self._closed.move_to_end(session_id)
        while len(self._closed) > _CLOSED_TOMBSTONES:
            self._closed.popitem(last=False)
        self.end(session_id, reason="closed")

    def end(self, session_id: str, reason: str) -> bool:
        lease = self.table.pop(session_id)
        if lease is None:
            return False
        self._retire(lease)
        self.metrics.inc("releases", reason=reason)
        if lease.hard:
            self._recount()
        self._refresh_gauges()
        return True

    def grant(
        self,
        session_id: str,
        node_id: int,
        ttl_s: float,
        expect_s: float | None = None,
        spread_s: float = 0.0,
    ) -> Lease:
        """Lease (or renew) with a real tree lock, then enforce the bound. With a host tier the
        lease is locked only if ``host_tier`` says losing the KV would cost a recompute or a
        reload on the critical path. The table bounds ``ttl_s`` (``max_ttl_s``)."""
        tier = HARD
        if self.host.active:
            probe = Lease(session_id, node_id, ttl_s, 0, HARD, expect_s=expect_s, spread_s=spread_s)
            tier = self.host.tier_for_grant(probe)
        handle = self.tree.lock(node_id) if tier == HARD else None  # before the old one goes
        lease, old = self.table.put(session_id, node_id, ttl_s, tier, handle, expect_s, spread_s)
        if old is not None:
            self._retire(old)
        self.metrics.inc("grants")
        self._enforce_bound()
        self._refresh_gauges()
        return self.table.get(session_id) or lease

    def forget_all(self) -> int:
        """The tree was reset (flush_cache): its locks are gone, drop every lease."""
        dropped = self.table.clear()
        for lease in dropped:
            self.metrics.inc("releases", reason="flush")
        self._hard_tokens = 0
        self.host.forget()
        self._refresh_gauges()
        return len(dropped)

    # ----------------------------------------------------------------- pressure
    def release_for_pressure(
        self,
        stage: str,
        deficit_tokens: int,
        spare: Iterable[str] = (),
        force: bool = False,
    ) -> tuple[int, int]:
        """Release hard leases, least valuable first, until ``deficit_tokens``
        became evictable. Returns (leases released, tokens made evictable).

        Value = tokens the release would make evictable (nodes no other lock
        holds) per second of remaining TTL. Leases whose release frees nothing
        now are skipped unless ``force`` (the engine is otherwise stuck, e.g. two
        sessions leasing the same node), so a release is never wasted.
        """
        spare_set: set[str] = set(spare)
        released = gained = 0
        while gained < max(deficit_tokens, 1):
            hard = self.table.leases(HARD)
            if not hard:
                break
            gains = {l.session_id: self.tree.unlock_gain(l.node_id) for l in hard}
            victim = release_order(hard, gains, self.table.clock, spare_set)[0]
            if gains[victim.session_id] <= 0 and not force:
                break
            before = self.tree.evictable_tokens()
            self.table.pop(victim.session_id)
            self._retire(victim)
            gained += self.tree.evictable_tokens() - before
            released += 1
            self.metrics.inc("pressure_releases", stage=stage)
        if released:
            self._recount()
            self._refresh_gauges()
            logger.info(
                "sglang_ext: %s pressure released %d lease(s), %d tokens evictable "
                "(deficit %d); hard leases left %d",
                stage,
                released,
                gained,
                deficit_tokens,
                self.table.count(HARD),
            )
        return released, gained

    # ----------------------------------------------------------------- eviction
    def on_evicted(self, node_id: int, tokens: int, demoted: bool = False) -> None:
        """A node left device memory. Dropped: leases pointing at it are spent. ``demoted`` (its
        KV stays on host): they stay, to be loaded back on return or by a prefetch."""
        for lease in self.table.on_node(node_id):
            if lease.hard:  # cannot happen: hard leases are locked
                logger.error("sglang_ext: locked leased node %d was evicted", node_id)
            self._prefetch_outcome(lease, used=False)
            if demoted:
                self.metrics.inc("leased_demoted_tokens", tokens, tier=lease.tier)
                continue
            self.metrics.inc("leased_evicted_tokens", tokens, tier=lease.tier)
            self.table.pop(lease.session_id)
        self._refresh_gauges()

    def _drop_lost(self, lease: Lease) -> None:
        """The lease's node left the tree on both tiers (host eviction): the lease is spent."""
        self.table.pop(lease.session_id)
        self._retire(lease)
        self.metrics.inc("releases", reason="host_evicted")
        self._refresh_gauges()

    def drop_lost_leases(self) -> None:
        """After SGLang evicted host leaves (and before the host tier re-decides tiers): forget
        leases whose node went with them."""
        lost = [l for l in self.table.leases() if not self.tree.in_tree(l.node_id)]
        for lease in lost:
            self._drop_lost(lease)
        if lost:
            self._recount()

    def recount(self) -> int:
        """Recount the hard-leased tokens (after a tier change) and return them."""
        self._recount()
        self._refresh_gauges()
        return self._hard_tokens

    # ---------------------------------------------------------------- turns
    def update_after_turn(
        self,
        session_id: str,
        ttl_s: float | None = None,
        expect_s: float | None = None,
        spread_s: float | None = None,
    ) -> bool:
        """The after-turn channel: replace the session's TTL / expected return (seconds from
        the next tick). TTL 0 ends the lease. False when the session holds no lease."""
        if session_id not in self.table:
            self.metrics.inc("after_turn_updates", result="no_lease")
            return False
        self.metrics.inc("after_turn_updates", result="applied")
        if ttl_s is not None and ttl_s <= 0.0:
            self.end(session_id, reason="ended")
            return True
        self.table.restamp(session_id, ttl_s, expect_s, spread_s)
        return True

    def on_admitted(self, session_id: str | None, last_node: Any, host_loaded_tokens: int) -> None:
        """A request was admitted to a prefill batch. Its load-back (if any) ran at admission, on
        its critical path. If its session holds a lease, this is the session's return: was the
        leased KV on the GPU, loaded from host now, or missed (not a prefix of the request)?"""
        if host_loaded_tokens > 0:
            self.metrics.inc("critical_load_back_tokens", host_loaded_tokens)
        lease = self.table.get(session_id) if session_id else None
        if lease is None or lease.returned:
            return
        lease.returned = True
        if not self.tree.on_path(lease.node_id, last_node):
            where = "missed"
        else:
            where = "host" if host_loaded_tokens > 0 else "gpu"
        self.metrics.inc("returning_turns", kv=where)
        self._prefetch_outcome(lease, used=where == "gpu")

    def _prefetch_outcome(self, lease: Lease, used: bool) -> None:
        if lease.prefetch is not None:
            lease.prefetch = None
            self.metrics.inc("prefetches", outcome="used" if used else "wasted")

    # ------------------------------------------------------------ introspection
    def snapshot(self) -> dict[str, Any]:
        returning = self.metrics.total("returning_turns")
        return {
            "settings": self.settings.model_dump(),
            "clock": self.table.clock,
            "hard_leases": self.table.count(HARD),
            "soft_leases": self.table.count(SOFT),
            "leased_tokens": self._hard_tokens,
            "limit_tokens": self.limit_tokens(),
            "tiers": self.host.describe(),
            # read by the sidecar (sidecar.engine.capacity): the pools it admits sessions against
            "tier_tokens": {
                "gpu": self.tree.capacity_tokens(),
                "host": self.tree.host_capacity_tokens() if self.tree.host_tier_attached() else 0,
            },
            "returning_turns_on_gpu_share": (
                self.metrics.get("returning_turns", kv="gpu") / returning if returning else None
            ),
            "metrics": self.metrics.snapshot(),
        }

    # ------------------------------------------------------------------ helpers
    def _retire(self, lease: Lease) -> None:
        """Unlock a lease that has already left the table (no-op when soft); KV prefetched
        for a return that did not come was wasted."""
        self._prefetch_outcome(lease, used=False)
        if lease.hard and lease.handle is not None:
            try:
                self.tree.unlock(lease.handle)
            except Exception:
                logger.exception(
                    "sglang_ext: failed to unlock lease of %s", lease.session_id
                )
            lease.handle = None

    def _enforce_bound(self) -> None:
        limit = self.limit_tokens()
        hard = self.table.leases(HARD)
        paths = {l.session_id: self.tree.path(l.node_id) for l in hard}
        total = union_tokens(paths.values())
        while total > limit and hard:
            exclusive = exclusive_tokens(paths)
            victim = release_order(hard, exclusive, self.table.clock)[0]
            self.tree.unlock(victim.handle)
            if self.settings.soft_overflow:
                self.table.demote(victim.session_id)
            else:
                self.table.pop(victim.session_id)
            self.metrics.inc("demotions")
            hard.remove(victim)
            del paths[victim.session_id]
            total -= exclusive[victim.session_id]  # what only its path covered leaves the union
        self._hard_tokens = total

    def _recount(self) -> None:
        self._hard_tokens = union_tokens(
            self.tree.path(l.node_id) for l in self.table.leases(HARD)
        )

    def _refresh_gauges(self) -> None:
        self.metrics.set("leased_tokens", self._hard_tokens)
        self.metrics.set("lease_limit_tokens", self.limit_tokens())
        self.metrics.set("leases", self.table.count(HARD), tier=HARD)
        self.metrics.set("leases", self.table.count(SOFT), tier=SOFT)

    def _warn_bad_ttl(self, session_id: str, custom_params: Any) -> None:
        value = asked_ttl(custom_params)
        if value is None or value == 0 or self._ttl_warnings >= _MAX_TTL_WARNINGS:
            return
        self._ttl_warnings += 1
        logger.warning(
            "sglang_ext: session %s sent %s=%r; expected seconds >= 0, lease ended",
            session_id,
            TTL_PARAM,
            value,
        )
