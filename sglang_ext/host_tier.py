"""Leases over two tiers (HiCache): lock only what must stay, load back what is due.

``HostTier`` is given the lease table, the tree, the settings and the metrics of one cache, and
asks its lease manager for one thing only: the hard-leased tokens, recounted (``recount``: read
before a decision, refreshed after a tier change). It is active only while the cache has a host tier and ``tier_aware`` is on;
otherwise nothing here runs and leases behave as without HiCache. What the scheduler's own work
claims of the GPU KV (``claimed``) is told by the hooks, which see the scheduler.

* **Eviction order** (``eviction_key``, read by the strategy for GPU and host leaves alike):
  KV with a host copy before KV without; within each, KV no lease expects back (LRU) before
  leased KV, and leased KV of the session expected back latest first; plain LRU while
  ``defer_with_host_room`` and the host has room (``deferring``).
* **Tiers** (``retier``, every clock tick): a lease is hard (locked) only while
  ``tiers.wants_hard`` says so, soft otherwise, within the hard-lease bound. With
  ``lock_due_backed_up = "host_short"`` KV backed up on host is locked only while the host tier is short.
* **Prefetch** (``after_prefill_pass``): once a session's expected return is a reload
  (+ margin) away, its host-only KV is loaded back through SGLang's ``load_back`` and locked,
  if free KV or KV less valuable than it makes the room; a batch that matched KV whose load is
  still in flight is made to wait for that load (its ``hicache_consumer_index``).

Every decision reads only the lease clock, the tree and SGLang's lockstep load-ack count, and
runs at points every TP rank passes in the same order, so all ranks decide alike.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from . import order, tiers
from .lease_table import HARD, SOFT, Lease, LeaseTable
from .metrics import LeaseMetrics
from .order import release_order
from .settings import SessionTTLSettings

logger = logging.getLogger(__name__)

# SGLang keeps 3 sets of load events (LayerDoneCounter) and asserts, when a load starts, that
# the set it reuses has finished; admission's own loads queue behind a prefetch on the same
# stream. A prefetch starts only when no other load is pending, so at most it and the two
# loads of the overlap scheduler's batches are ever in flight.


def _nothing_claimed() -> int:
    return 0


class HostTier:
    def __init__(
        self,
        table: LeaseTable,
        tree: Any,
        settings: SessionTTLSettings,
        metrics: LeaseMetrics,
        recount: Callable[[], int],
    ) -> None:
        self.table, self.tree, self.settings, self.metrics = table, tree, settings, metrics
        # the manager recounts the hard-leased tokens (its count and gauges) and returns them
        self._recount = recount
        # GPU KV the scheduler's own work may claim next (a prefill chunk, decode steps, the room
        # a refused request still needs): no lock and no prefetch may take it (work-conserving
        # leases). The hooks set it once they know the scheduler; nothing is claimed before.
        self.claimed: Callable[[], int] = _nothing_claimed
        self.inflight: dict[int, str] = {}  # prefetched node id -> session, until its load is reaped
        self._next_change: float | None = None
        self._window_open: list[str] = []  # sessions due at the last retier (prefetch candidates)
        self._skipped: dict[str, str] = {}  # session -> why its due prefetch waits (counted once)
        # the host tier was short at the last retier (None before the first): grants read this one
        # rather than recounting every lease's path on each request that finishes
        self._short: bool | None = None
        # defer_with_host_room and the host had room at the last retier: order and queue as SGLang
        self.deferring = False

    @property
    def active(self) -> bool:
        return self.settings.tier_aware and self.tree.host_tier_attached()

    @property
    def stepping_aside(self) -> bool:
        """The plugin is SGLang's LRU now (``defer_with_host_room`` and room on host): the hooks
        leave SGLang's queue order alone and refresh queued prefixes as SGLang does for lru."""
        return self.deferring and self.active

    # ------------------------------------------------------------------ eviction
    def eviction_key(self, node: Any, gone_children: tuple = ()) -> tuple[int, int, float]:
        """Lower goes first: (no host copy, leased, latest expected return first | LRU).

        ``gone_children``: children a dry run of the eviction walk took off the GPU already,
        whose leases then run through ``node`` (see ``_room_for``)."""
        if self.deferring:
            return (0, 0, node.last_access_time)  # plain LRU, as SGLang's own strategy
        tree = self.tree
        lease = self._covering_lease((node, *gone_children))
        return order.eviction_key(
            node.last_access_time,
            host_tier=True,
            reloadable=tree.node_reloadable(node, bool(getattr(tree.cache, "is_write_back", False))),
            lease_due_back=None if lease is None else lease.due_back(self.table.clock),
        )

    def _covering_lease(self, roots: tuple) -> Lease | None:
        """The most valuable lease whose path runs through the first root: one ending at a root
        or below it in its host-only subtree (a GPU or host leaf has no GPU KV below it)."""
        table = self.table
        if not len(table):
            return None
        now, best = table.clock, None
        for root in roots:
            for current in self.tree.host_only_subtree(root):
                for lease in table.on_node(current.id):
                    if best is None or (lease.due_back(now), lease.seq) < (best.due_back(now), best.seq):
                        best = lease
        return best

    # --------------------------------------------------------------------- tiers
    def host_is_short(self) -> bool:
        """``tiers.host_short`` of this cache's host pool and GPU pool (read only by the
        ``host_short`` lock rule and ``defer_with_host_room``; every rank's pools hold the same,
        so all ranks agree). True where neither reads it."""
        if not self.settings.reads_host_room:
            return True
        tree = self.tree
        leased = tree.distinct_path_tokens(lease.node_id for lease in self.table.leases())
        return tiers.host_short(tree.host_capacity_tokens(), leased, tree.capacity_tokens())

    def tier_for_grant(self, lease: Lease, busy: bool = False) -> str:
        state = self.tree.path_state(lease.node_id)
        short = self._short if self._short is not None else self.host_is_short()
        want = tiers.wants_hard(lease, state, self.table.clock, self.settings, busy, short)
        return HARD if want else SOFT

    def retier(self, busy: set[str] | frozenset[str]) -> None:
        """Re-decide every lease's tier at the current lease clock (the manager dropped the leases
        whose KV left both tiers)."""
        tree, now, settings = self.tree, self.table.clock, self.settings
        if now is None:
            return
        hard_nodes = self._hard_path_nodes()
        limit, used = self._limit_tokens(), self._recount()
        # a lock takes evictable KV away: never below what the scheduler's own work may claim, and
        # never the room a queued request is waiting for
        spare = self.tree.headroom_tokens() - self.claimed()
        changed, nxt, window_open = False, None, []
        short = self._short = self.host_is_short()
        self.deferring = settings.defer_with_host_room and not short
        for lease in self.table.leases():
            state = tree.path_state(lease.node_id)
            want = tiers.wants_hard(lease, state, now, settings, lease.session_id in busy, short)
            if lease.hard and not want:
                self._soften(lease)
                self.metrics.inc("tier_changes", to=SOFT)
                changed = True
            elif not lease.hard and want:
                extra = _added_tokens(tree.path(lease.node_id), hard_nodes)
                if used + extra <= limit and extra <= spare:
                    self._harden(lease)
                    hard_nodes.update(node_id for node_id, _ in tree.path(lease.node_id))
                    used += extra
                    spare -= extra
                    self.metrics.inc("tier_changes", to=HARD)
                    changed = True
            if not lease.hard and tiers.in_window(tiers.critical_window(lease, state.tokens, now, settings), now):
                window_open.append(lease.session_id)
            t = tiers.next_change(lease, state, now, settings)
            if t is not None and (nxt is None or t < nxt):
                nxt = t
        self._next_change, self._window_open = nxt, window_open
        self._skipped = {k: v for k, v in self._skipped.items() if k in window_open}
        if changed:
            self._recount()

    def due(self, now: float) -> bool:
        """Rank 0: a tier or prefetch decision is due (so an idle server still ticks)."""
        return self._next_change is not None and now >= self._next_change

    # ---------------------------------------------------------------- pressure
    def yield_room(self, stage: str, deficit_tokens: int, spare: set[str] | frozenset[str] = frozenset()) -> int:
        """Work-conserving leases: unlock hard leases whose whole path is backed up on host, least
        valuable first (``release_order``), until ``deficit_tokens`` became evictable. Losing their
        GPU copy costs a reload, not a recompute, so no request waits for them; each lease stays
        (soft), so its KV keeps its place in the eviction order and may be prefetched again.
        Returns the tokens made evictable."""
        tree = self.tree
        gained = 0
        yielded = 0
        while gained < max(deficit_tokens, 1):
            candidates = [l for l in self.table.leases(HARD) if tree.path_state(l.node_id).unbacked_tokens == 0]
            gains = {l.session_id: tree.unlock_gain(l.node_id) for l in candidates}
            candidates = [l for l in candidates if gains[l.session_id] > 0]
            if not candidates:
                break
            victim = release_order(candidates, gains, self.table.clock, set(spare))[0]
            before = tree.evictable_tokens()
            self._soften(victim)
            gained += tree.evictable_tokens() - before
            yielded += 1
            self.metrics.inc("yields", stage=stage)
        if yielded:
            self._recount()
            logger.debug("sglang_ext: %s pressure: %d lease(s) yielded, %d tokens evictable", stage, yielded, gained)
        return gained

    # ------------------------------------------------------------------ prefetch
    def after_prefill_pass(self, batch: Any, busy: set[str], queued: int = 0) -> None:
        """After SGLang built this iteration's prefill batch (or none): guard it, then prefetch,
        only while no request is queued (a prefetch never takes KV a queued request could use)."""
        self._reap()
        if batch is not None:
            self._guard(batch)
        if self.settings.prefetch and not queued:
            self._prefetch(busy)

    def _reap(self) -> None:
        tree = self.tree
        for node_id in [n for n in self.inflight if not tree.load_in_flight(n)]:
            del self.inflight[node_id]

    def _guard(self, batch: Any) -> None:
        """A request whose prefix includes a prefetched node whose copy may still be landing:
        make the batch's forward wait for the loads (SGLang waits per layer on the consumer
        index; loads share one stream, so the latest producer covers the earlier ones)."""
        if not self.inflight or getattr(batch, "hicache_consumer_index", -1) >= 0:
            return
        tree = self.tree
        for req in getattr(batch, "reqs", ()):
            last = getattr(req, "last_node", None)
            if any(tree.on_path(node_id, last) for node_id in self.inflight):
                batch.hicache_consumer_index = tree.latest_load_producer()
                return

    def _prefetch(self, busy: set[str]) -> None:
        tree, now, settings = self.tree, self.table.clock, self.settings
        if now is None:
            return
        due = []
        for session_id in self._window_open:  # the clock moves only at ticks, which retier
            lease = self.table.get(session_id)
            if lease is None or lease.hard or session_id in busy:
                continue  # gone, held, or its request is here (admission loads it)
            state = tree.path_state(lease.node_id)
            if state.exists and tiers.wants_prefetch(lease, state, now, settings):
                due.append((lease.expected_back(now), lease.seq, lease, state))
        if not due:
            return
        if tree.loads_pending():
            for _, _, lease, _ in due:
                self._skip(lease, "slots")
            return
        due.sort(key=lambda item: item[:2])  # soonest expected return first
        issued = []
        hard_nodes = self._hard_path_nodes()
        used = self._recount()
        spare = self.tree.headroom_tokens() - self.claimed()  # see retier
        for _, _, lease, state in due:
            extra = _added_tokens(tree.path(lease.node_id), hard_nodes)
            if used + extra > self._limit_tokens():
                self._skip(lease, "bound")
                continue
            if self._room_for(lease, state.host_only_tokens) < state.host_only_tokens:
                self._skip(lease, "room")
                continue
            if extra > spare:  # the load takes GPU KV for its host-only part, the lock the rest of its path
                self._skip(lease, "reserve")
                continue
            if not tree.start_load_back(lease.node_id):  # below SGLang's load_back_threshold, or no KV
                self._skip(lease, "declined")
                continue
            self._skipped.pop(lease.session_id, None)
            self._harden(lease)
            hard_nodes.update(node_id for node_id, _ in tree.path(lease.node_id))
            used += extra
            spare -= extra
            lease.prefetch = "issued"
            issued.append(lease)
            self.metrics.inc("prefetches", outcome="issued")
            self.metrics.inc("prefetched_tokens", state.host_only_tokens)
        if issued:
            tree.submit_loads()
            for lease in issued:
                self.inflight[lease.node_id] = lease.session_id
            self._recount()
            logger.debug("sglang_ext: prefetched %d session(s) from host", len(issued))

    def _skip(self, lease: Lease, reason: str) -> None:
        """Count a due prefetch that waits, once per reason (it is retried every pass)."""
        if self._skipped.get(lease.session_id) != reason:
            self._skipped[lease.session_id] = reason
            self.metrics.inc("prefetch_skips", reason=reason)

    def _room_for(self, lease: Lease, need: int) -> int:
        """GPU KV a load for ``lease`` may take (up to ``need``): free KV, then what SGLang's
        eviction would free before it reaches KV as valuable as this lease's (backed up and
        expected back no later)."""
        tree = self.tree
        free = tree.available_tokens()
        if free >= need:
            return free
        threshold = order.prefetch_threshold(lease.due_back(self.table.clock))
        return free + tree.eviction_room(self.eviction_key, lambda key: key >= threshold, need - free)

    # --------------------------------------------------------------------- locks
    def _soften(self, lease: Lease) -> None:
        """Hard -> soft: unlock, keep the lease (its KV may now be demoted); the caller recounts."""
        if lease.handle is not None:
            self.tree.unlock(lease.handle)
        self.table.demote(lease.session_id)

    def _harden(self, lease: Lease) -> None:
        """Soft -> hard: lock the lease's node; the caller recounts."""
        self.table.promote(lease.session_id, self.tree.lock(lease.node_id))

    def _hard_path_nodes(self) -> set[int]:
        return {n for l in self.table.leases(HARD) for n, _ in self.tree.path(l.node_id)}

    def _limit_tokens(self) -> int:
        return self.settings.limit_tokens(self.tree.capacity_tokens())

    # ------------------------------------------------------------------ bookkeeping
    def forget(self) -> None:
        self.inflight.clear()
        self._next_change, self._window_open = None, []
        self._skipped.clear()
        self._short, self.deferring = None, False

    def describe(self) -> str:
        tree = self.tree
        if not tree.host_tier_attached():
            return f"GPU {tree.capacity_tokens()} tokens; no host tier"
        return (
            f"GPU {tree.capacity_tokens()} tokens, host {tree.host_capacity_tokens()} tokens "
            f"({tree.write_policy()}), storage {tree.storage_backend() or 'none'}; "
            f"tier-aware leases {'on' if self.settings.tier_aware else 'off'}, "
            f"prefetch {'on' if self.active and self.settings.prefetch else 'off'}"
        )


def _added_tokens(path: list[tuple[int, int]], covered: set[int]) -> int:
    """Tokens a lock at the end of ``path`` would add to the hard-leased nodes ``covered``."""
    return sum(tokens for node_id, tokens in path if node_id not in covered)
