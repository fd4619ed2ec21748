"""Where the plugin meets SGLang 0.5.23: HookRegistry hooks, thin adapters only.

Every hook finds the lease manager through the cache it is given
(``cache.tree_core.eviction_strategy`` is our ``SessionTTLStrategy``); with any
other eviction policy every hook is a no-op. What the hooks remember of the scheduler
between calls (the request a pass refused, the scheduler itself for the reserve and the
decode valve) is a ``PassState`` beside the manager (``pass_state``), not manager state.
Hook bodies never raise into SGLang (errors are logged) unless ``SGLANG_EXT_STRICT=1`` (tests).

Call sites (scheduler process unless noted):
* tree core selection  -> Python TreeCore for session_ttl (the Rust core rejects it)
* UnifiedRadixCache.on_release -> grant / renew / end a lease when a request finishes
* UnifiedRadixCache.reset      -> drop leases with the tree (flush_cache)
* UnifiedRadixCache._evict_device_leaf -> count evictions of (soft-)leased KV
  (with HiCache: a demotion to host keeps the lease)
* UnifiedRadixCache.evict_host -> forget leases whose KV left the host too
* UnifiedRadixCache.init_hicache -> log the tiers the plugin sees
* Scheduler.close_session / handle_generate_request -> release / reopen a session
* Scheduler._poll_timeout_aborts (rank 0) -> emit a LeaseClockTick into the input
  broadcast; Scheduler.init_request_dispatcher -> handle it on every rank (expiry)
* PrefillAdder.add_one_req + Scheduler._get_new_batch_prefill_raw -> prefill valve;
  admission accounting (returning turns, critical-path load-back); with HiCache,
  after the pass: guard the batch against in-flight prefetches, then prefetch
* ScheduleBatch.check_decode_mem -> decode valve (release leases before retracting)
* SchedulerInternalStateController.get_internal_state -> lease stats in /server_info
* SchedulerInternalStateController.set_internal_state -> the after-turn channel
  (keys "sglang_ext:<field>:<session>"; the rest goes to SGLang unchanged)
* resolution step handle_cache_compatibility (main process) -> validate settings early
"""

from __future__ import annotations

import functools
import logging
import os
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .lease_table import HARD
from .manager import LeaseManager
from .settings import POLICY_NAME, SessionTTLSettings
from .strategy import SessionTTLStrategy
from .wire import AFTER_TURN_PREFIX, parse_after_turn

logger = logging.getLogger(__name__)

_SCHED = "sglang.srt.managers.scheduler.Scheduler"
_CACHE = "sglang.srt.mem_cache.unified_radix_cache.UnifiedRadixCache"

DEFAULT_CHUNK_TOKENS = 8192  # SGLang's --chunked-prefill-size default (a scheduler without one)
DECODE_RESERVE_STEPS = 4  # decode steps of the running batch a lease must not take the room of


# --------------------------------------------------------------------------- helpers
def _strict() -> bool:
    return os.environ.get("SGLANG_EXT_STRICT") == "1"


def _guarded(fn: Callable) -> Callable:
    """Log instead of raising: a plugin bug must not take the scheduler down."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception:
            if _strict():
                raise
            logger.exception("sglang_ext: hook %s failed", fn.__name__)
            return None

    return wrapper


def manager_of(cache: Any) -> LeaseManager | None:
    """The lease manager of ``cache``, or None when session_ttl is not its policy."""
    if cache is None or getattr(cache, "disable", False):
        return None
    core = getattr(cache, "tree_core", None)
    strategy = getattr(core, "eviction_strategy", None)
    if not isinstance(strategy, SessionTTLStrategy) or not hasattr(core, "node_by_id"):
        return None
    return strategy.bind(cache)


@dataclass
class PassState:
    """What the hooks remember between calls about one cache's scheduler: the lease manager keeps
    lease state only. One per manager (``pass_state``), found from the cache as the manager is."""

    scheduler: Any = None  # weakref to the scheduler, from its first prefill pass on
    blocked_head: Any = None  # the first request the current prefill pass refused for lack of KV
    admission_tried: bool = False  # add_one_req ran in the current pass
    # GPU KV the last refused request still needs: no lock and no prefetch may take it until a
    # pass admits it (work-conserving leases over a host tier)
    blocked_need: int = 0
    metrics_checked: bool = False  # whether exporting lease metrics to /metrics was decided
    blocked_logged_at: float = float("-inf")  # monotonic time of the last refused-pass log line

    def live_scheduler(self) -> Any:
        return self.scheduler() if self.scheduler is not None else None


# manager -> its PassState; the state holds no reference back, so a manager's goes with it
_PASSES: weakref.WeakKeyDictionary[LeaseManager, PassState] = weakref.WeakKeyDictionary()


def pass_state(mgr: LeaseManager) -> PassState:
    """The hooks' state beside ``mgr``; the first call tells its host tier what the scheduler's
    work claims of the GPU KV (``HostTier.claimed``)."""
    state = _PASSES.get(mgr)
    if state is None:
        state = _PASSES[mgr] = PassState()
        mgr.host.claimed = functools.partial(_claimed_tokens, state, mgr.tree)
    return state


def reserve_tokens(scheduler: Any, tree: Any) -> int:
    """GPU KV the scheduler's own work may claim next, which leases must leave evictable: a
    whole prefill chunk while a prefill is in progress or waiting (SGLang continues a chunked
    prefill with a full chunk even when its budget says none is left; at most a quarter of
    the pool), plus a few decode steps of the running batch, a page each. Nothing while the
    scheduler has no work (or before its prefill hook ran once: ``scheduler`` None)."""
    if scheduler is None:
        return 0
    page = max(int(getattr(tree.cache, "page_size", 1) or 1), 1)
    running = getattr(getattr(scheduler, "running_batch", None), "reqs", None) or ()
    prefilling = getattr(scheduler, "chunked_req", None) is not None or bool(getattr(scheduler, "waiting_queue", None))
    if not (prefilling or running):
        return 0
    chunk = 0
    if prefilling:
        chunk = getattr(scheduler, "chunked_prefill_size", None) or DEFAULT_CHUNK_TOKENS
        chunk = min(int(chunk), tree.capacity_tokens() // 4)
    return chunk + 2 * page + DECODE_RESERVE_STEPS * page * len(running)


def _claimed_tokens(state: PassState, tree: Any) -> int:
    return reserve_tokens(state.live_scheduler(), tree) + state.blocked_need


def _session_ids(reqs: Iterable[Any]) -> set[str]:
    return {r.session_id for r in reqs if getattr(r, "session_id", None)}


def _busy_sessions(scheduler: Any) -> set[str]:
    """Sessions with a request queued or running: their lease is about to be used."""
    running = getattr(getattr(scheduler, "running_batch", None), "reqs", None) or []
    return _session_ids(list(scheduler.waiting_queue) + list(running))


# ------------------------------------------------------------------ tree core choice
_told_python_core = False


def rust_fallback_reason(original, params, *args, **kwargs):
    """AROUND tree_core_registry._rust_fallback_reason: session_ttl is a Python
    strategy, which only the Python TreeCore can call."""
    global _told_python_core
    if str(getattr(params, "eviction_policy", "")).lower() == POLICY_NAME:
        if not _told_python_core:
            _told_python_core = True
            logger.info(
                "sglang_ext: selected the Python TreeCore for --radix-eviction-policy "
                "%s (the Rust TreeCore implements only the built-in policies)",
                POLICY_NAME,
            )
        return f"the {POLICY_NAME} eviction policy (sglang_ext) requires the Python TreeCore"
    return original(params, *args, **kwargs)


# ------------------------------------------------------------------- cache events
@_guarded
def on_release(result, cache, req, *args, checkpointed: bool = False, **kwargs):
    """AFTER UnifiedRadixCache.on_release: ``req.last_node`` now holds prompt+output."""
    if not checkpointed or not getattr(req, "session_id", None):
        return
    mgr = manager_of(cache)
    if mgr is None or not req.finished():
        return
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    if isinstance(req.finished_reason, FINISH_ABORT):
        return  # an aborted turn leaves the previous lease as it was
    node_id = req.last_node
    if isinstance(node_id, bool) or not isinstance(node_id, int):
        return  # a streaming-session virtual node: its slot holds the KV
    mgr.on_request_finished(req.session_id, node_id, req.sampling_params.custom_params)


@_guarded
def on_reset(result, cache, *args, **kwargs):
    """AFTER UnifiedRadixCache.reset: the tree (and every lock in it) is gone."""
    strategy = getattr(getattr(cache, "tree_core", None), "eviction_strategy", None)
    mgr = getattr(strategy, "manager", None)
    if (
        isinstance(strategy, SessionTTLStrategy)
        and mgr is not None
        and mgr.tree.cache is cache
    ):
        dropped = mgr.forget_all()
        if dropped:
            logger.info("sglang_ext: tree reset, dropped %d lease(s)", dropped)


def evict_device_leaf(original, cache, node_id, tracker, *args, **kwargs):
    """AROUND UnifiedRadixCache._evict_device_leaf: count evictions of leased KV."""
    mgr = manager_of(cache)
    if mgr is None or not mgr.table.on_node(node_id):
        return original(cache, node_id, tracker, *args, **kwargs)
    before = sum(tracker.values())
    result = original(cache, node_id, tracker, *args, **kwargs)
    _note_eviction(mgr, node_id, sum(tracker.values()) - before)
    return result


@_guarded
def _note_eviction(mgr: LeaseManager, node_id: int, tokens: int) -> None:
    if tokens > 0:
        # With a host tier a backed-up node stays in the tree with its host copy (demoted).
        mgr.on_evicted(node_id, tokens, demoted=mgr.tree.in_tree(node_id))


@_guarded
def evict_host(result, cache, *args, **kwargs):
    """AFTER UnifiedRadixCache.evict_host: host leaves went; so did leases ending there."""
    mgr = manager_of(cache)
    if mgr is not None and len(mgr.table):
        mgr.drop_lost_leases()


@_guarded
def init_hicache(result, cache, *args, **kwargs):
    """AFTER UnifiedRadixCache.init_hicache: say which tiers the plugin sees (binding the
    manager logs them; a manager bound before the host tier came logs them again)."""
    bound = getattr(getattr(getattr(cache, "tree_core", None), "eviction_strategy", None), "manager", None)
    mgr = manager_of(cache)
    if mgr is not None and mgr is bound:
        logger.info("sglang_ext: session_ttl tiers: %s", mgr.host.describe())


# --------------------------------------------------------------- session requests
@_guarded
def close_session(result, scheduler, recv_req, *args, **kwargs):
    """AFTER Scheduler.close_session (/close_session {"session_id": S})."""
    mgr = manager_of(scheduler.tree_cache)
    if mgr is not None and getattr(recv_req, "session_id", None):
        mgr.close(recv_req.session_id)


@_guarded
def handle_generate_request(scheduler, recv_req, *args, **kwargs):
    """BEFORE Scheduler.handle_generate_request: a new turn reopens a closed session."""
    mgr = manager_of(scheduler.tree_cache)
    if mgr is not None:
        mgr.note_arrival(getattr(recv_req, "session_id", None))


# ------------------------------------------------------------------- lease clock
@dataclass
class LeaseClockTick:
    """Rank 0's monotonic time, broadcast with the requests of one loop iteration.

    Every rank advances its lease clock only from these, at the same position of
    the same input stream, so all TP ranks expire (and stamp) the same leases at
    the same time and keep identical trees.
    """

    now: float
    rid: str | None = None  # read by SGLang's health-check filter


@_guarded
def poll_timeout_aborts(result, scheduler, *args, **kwargs):
    """AFTER Scheduler._poll_timeout_aborts (rank 0 only): append a clock tick."""
    tick = clock_tick(scheduler, time.monotonic())
    if tick is None:
        return None
    return list(result or []) + [tick]


def clock_tick(scheduler: Any, now: float) -> LeaseClockTick | None:
    """Rank 0's decision at ``now``: the LeaseClockTick to broadcast, or None.

    ``poll_timeout_aborts`` asks with the monotonic clock; a scheduler that keeps its
    own clock (a virtual-time simulation) asks directly and dispatches the tick itself.
    """
    mgr = manager_of(scheduler.tree_cache)
    if mgr is None:
        return None
    running = scheduler.running_batch
    busy = (
        bool(scheduler.waiting_queue)
        or (running is not None and not running.is_empty())
        or scheduler.chunked_req is not None
    )
    if not mgr.wants_tick(now, busy):
        return None
    mgr.tick_sent(now)
    return LeaseClockTick(now)


@_guarded
def init_request_dispatcher(result, scheduler, *args, **kwargs):
    """AFTER Scheduler.init_request_dispatcher: route LeaseClockTick to the manager."""
    from sglang.utils import TypeBasedDispatcher

    handler = functools.partial(_on_tick, weakref.ref(scheduler))
    scheduler._request_dispatcher += TypeBasedDispatcher([(LeaseClockTick, handler)])


@_guarded
def _on_tick(scheduler_ref, tick: LeaseClockTick):
    scheduler = scheduler_ref()
    mgr = manager_of(getattr(scheduler, "tree_cache", None))
    if mgr is None:
        return
    _maybe_export_metrics(scheduler, mgr)
    mgr.on_tick(tick.now, _busy_sessions(scheduler))


def _maybe_export_metrics(scheduler: Any, mgr: LeaseManager) -> None:
    """Mirror lease metrics into /metrics once, from the ranks SGLang reports from."""
    state = pass_state(mgr)
    if mgr.metrics.exported or state.metrics_checked:
        return
    state.metrics_checked = True
    ctx = getattr(scheduler, "metrics_collector_context", None)
    collector = getattr(scheduler, "metrics_collector", None)
    if collector is None or not getattr(
        ctx, "current_scheduler_metrics_enabled", False
    ):
        return
    if mgr.metrics.attach_prometheus(collector.labels):
        logger.info("sglang_ext: session lease metrics exported to /metrics")


# ------------------------------------------------------------------ pressure valves
@_guarded
def touch_waiting_prefixes(result, policy_obj, policy, waiting_queue, *args, **kwargs):
    """AFTER SchedulePolicy._touch_waiting_prefixes: SGLang keeps the queued requests' cached
    prefixes recent (every 32nd pass, head last) for ``--radix-eviction-policy lru`` only, so LRU
    does not evict the KV a queued request is about to use. While the plugin steps aside
    (``HostTier.stepping_aside``) it is SGLang's LRU, refresh included, under the same conditions and on
    the same pass counter: without it a queued continuation loses its prefix to newer idle KV and
    then waits for the room to reload it (simulator, miniswe at ratio 3: p99 1.10x stock's). Under
    its own rules (no host tier, or the host short) the order is the plugin's and nothing is touched."""
    from sglang.srt.managers import schedule_policy as sp

    tree_cache = policy_obj.tree_cache
    mgr = manager_of(tree_cache)
    if (
        mgr is None
        or not mgr.host.stepping_aside
        or not waiting_queue
        or isinstance(policy, sp.CacheAwarePolicy)
        or not sp.envs.SGLANG_ENABLE_WAITING_PREFIX_REFRESH.get()
        or _disaggregated_decode(sp)
        or tree_cache.supports_fast_match_prefix()
        or not tree_cache.supports_prefix_sharing()
    ):
        return
    calls = policy_obj._waiting_prefix_refresh_calls
    policy_obj._waiting_prefix_refresh_calls = calls + 1
    if calls % sp.WAITING_PREFIX_REFRESH_INTERVAL:
        return
    for req in reversed(waiting_queue[: sp.WAITING_QUEUE_PREFIX_MATCH_MAX]):
        sp.touch_waiting_prefix(req, tree_cache)


def _disaggregated_decode(sp: Any) -> bool:
    try:
        return sp.get_disagg().disaggregation_mode == "decode"
    except ValueError:  # no disaggregation config published (a scheduler built without a server)
        return False


@_guarded
def add_one_req(result, adder, req, *args, **kwargs):
    """AFTER PrefillAdder.add_one_req: remember the first request refused for KV; account an
    admitted one (its load-back ran now, on its critical path; a leased session returned)."""
    mgr = manager_of(adder.tree_cache)
    if mgr is None:
        return
    state = pass_state(mgr)
    state.admission_tried = True
    if getattr(result, "name", None) == "NO_TOKEN":
        if state.blocked_head is None:
            state.blocked_head = req
    elif req in adder.can_run_list:
        mgr.on_admitted(
            getattr(req, "session_id", None), req.last_node, int(getattr(req, "host_loaded_length", 0) or 0)
        )


def get_new_batch_prefill_raw(original, scheduler, *args, **kwargs):
    """AROUND Scheduler._get_new_batch_prefill_raw: the prefill pressure valve.

    When a prefill pass admitted nothing because the head request did not fit
    (NO_TOKEN) while nothing runs or is in flight, no finishing request can ever
    free KV; only leases can. Release hard leases, least value first, until the
    head fits (estimated from its uncached length); the next loop iteration
    admits it. Each stalled pass releases at least one lease, so this ends.
    Nothing is retried inside the pass (DP-attention prefill negotiation and the
    prefill delayer expect one pass per iteration).
    """
    mgr = manager_of(scheduler.tree_cache)
    if mgr is None:
        return original(scheduler, *args, **kwargs)
    state = pass_state(mgr)
    if state.scheduler is None:
        state.scheduler = weakref.ref(scheduler)  # for the decode valve and the reserve
    state.blocked_head = None
    state.admission_tried = False
    if getattr(scheduler, "chunked_req", None) is not None and mgr.has_hard():
        _relieve_chunk_pressure(scheduler, mgr, state)
    if mgr.settings.prefer_leased_requests and not mgr.host.stepping_aside:
        leased_first(scheduler.waiting_queue, mgr)
    result = original(scheduler, *args, **kwargs)
    if mgr.host.active:
        _yield_for_blocked(scheduler, mgr, state, result[1])
    if result[0] is None and state.blocked_head is not None and mgr.has_hard():
        _relieve_prefill_stall(scheduler, mgr, state.blocked_head, result[1])
    state.blocked_head = None
    if mgr.host.active:
        _after_prefill_pass(scheduler, mgr, result[0])
    return result


@_guarded
def _yield_for_blocked(scheduler: Any, mgr: LeaseManager, state: PassState, running_batch: Any) -> None:
    """Work-conserving leases over a host tier: a request refused for lack of KV never waits for
    leased KV that is backed up on host. Such leases are unlocked (they stay soft; their KV reloads
    if evicted) until the refused request fits, and the running batch is told to try again
    (SGLang keeps ``batch_is_full`` until a request leaves otherwise). Until a later pass admits
    it, no lease is locked or prefetched into the room it needs (``PassState.blocked_need``)."""
    head = state.blocked_head
    if head is None:
        if state.admission_tried or not scheduler.waiting_queue:
            state.blocked_need = 0  # the queue moved (or is empty): nothing waits for room
        return
    need = _prefill_need(mgr, head)
    state.blocked_need = need
    # SGLang's PrefillBudget: free + evictable, less what the running requests may still decode
    reservation = _running_reservation(scheduler, running_batch)
    headroom = mgr.tree.headroom_tokens()
    deficit = need + reservation - headroom
    hard_before = mgr.hard_tokens()
    gained = 0
    if not mgr.has_hard():
        outcome = "no_hard_leases"
    # SGLang refused it: its budget has the last word even where this estimate says it fits (the
    # refused request then waits until a running one finishes), so yield at least its whole need
    elif (gained := mgr.host.yield_room("prefill", max(deficit, need), _busy_sessions(scheduler))) > 0:
        outcome = "yielded"
        if running_batch is not None and hasattr(running_batch, "batch_is_full"):
            running_batch.batch_is_full = False
    elif deficit <= 0:
        outcome = "fits"
    elif any(mgr.tree.path_state(lease.node_id).unbacked_tokens for lease in mgr.table.leases(HARD)):
        outcome = "unbacked"
    else:
        outcome = "in_use"
    mgr.metrics.inc("blocked_passes", outcome=outcome)
    _log_blocked_pass(
        scheduler, state, outcome, need=need, reservation=reservation, headroom=headroom, hard=hard_before, gained=gained
    )


def _log_blocked_pass(scheduler: Any, state: PassState, outcome: str, **figures: int) -> None:
    """One line a second at most: what a refused prefill pass saw, to read beside SGLang's
    decode log (why a request waits while the pool has room)."""
    now = time.monotonic()
    if now - state.blocked_logged_at < 1.0:
        return
    state.blocked_logged_at = now
    running = getattr(getattr(scheduler, "running_batch", None), "reqs", None) or ()
    logger.info(
        "sglang_ext: prefill refused for KV (%s): %s, running %d, queued %d",
        outcome,
        ", ".join(f"{k} {v}" for k, v in figures.items()),
        len(running),
        len(scheduler.waiting_queue),
    )


@_guarded
def _relieve_chunk_pressure(scheduler: Any, mgr: LeaseManager, state: PassState) -> None:
    """The chunk valve: SGLang continues a chunked prefill with a whole chunk even when its budget
    says nothing is left (the request must progress to free its KV), and that allocation fails
    (out of memory) when leases locked what it would evict. Release hard leases, least value
    first, until a chunk fits again."""
    deficit = reserve_tokens(state.live_scheduler(), mgr.tree) - mgr.tree.headroom_tokens()
    if deficit > 0:
        spare = _busy_sessions(scheduler) | _session_ids([scheduler.chunked_req])
        if mgr.host.active:  # backed-up KV yields first (a reload), then leases end (a recompute)
            deficit -= mgr.host.yield_room("chunk", deficit, spare)
        if deficit > 0:
            mgr.release_for_pressure("chunk", deficit, spare, force=True)


@_guarded
def _after_prefill_pass(scheduler: Any, mgr: LeaseManager, batch: Any) -> None:
    busy = _busy_sessions(scheduler)
    if batch is not None:
        busy |= _session_ids(batch.reqs)
    mgr.host.after_prefill_pass(batch, busy, queued=len(scheduler.waiting_queue))


def leased_first(waiting_queue: list, mgr: LeaseManager) -> None:
    """Requests whose session holds a hard lease go first, a request kept behind them longer than
    ``max_priority_wait_s`` joins them in arrival order (``sglang_ext.queue_order``).

    SGLang admits in queue order and stops at the first request that does not fit; a
    session whose KV was evicted needs its whole history recomputed, and at the head it
    would stall every cheap continuation behind it. FCFS order holds within each group
    (SGLang's FCFS does not re-sort the queue; cache-aware policies re-sort it anyway).
    """
    mgr.waiting_order.reorder(
        waiting_queue, mgr.table.clock, lambda req: mgr.holds_hard_lease(getattr(req, "session_id", None))
    )


@_guarded
def _relieve_prefill_stall(scheduler: Any, mgr: LeaseManager, head: Any, running_batch: Any) -> None:
    if not scheduler.waiting_queue or not running_batch.is_empty():
        return
    if not scheduler.is_fully_idle(ignore_waiting=True):
        return  # something in flight will free KV or make progress
    deficit = _prefill_deficit(mgr, head)
    mgr.release_for_pressure("prefill", deficit, _busy_sessions(scheduler), force=True)


def _prefill_deficit(mgr: LeaseManager, req: Any) -> int:
    """Tokens the refused head still needs beyond free + evictable KV (>= 1)."""
    return max(_prefill_need(mgr, req) - mgr.tree.headroom_tokens(), 1)


def _running_reservation(scheduler: Any, running_batch: Any) -> int:
    """KV SGLang's admission keeps for the running requests' remaining decode
    (``PrefillAdder._get_running_request_total_token_offset``)."""
    from sglang.srt.managers.schedule_policy import CLIP_MAX_NEW_TOKENS

    tracker = getattr(scheduler, "new_token_ratio_tracker", None)
    ratio = float(getattr(tracker, "current", 1.0))
    total = 0.0
    for req in getattr(running_batch, "reqs", None) or ():
        left = min(max(req.sampling_params.max_new_tokens - len(req.output_ids), 0), CLIP_MAX_NEW_TOKENS)
        total += left * (1.0 if req.sampling_params.ignore_eos else ratio)
    return int(total) + 1


def _prefill_need(mgr: LeaseManager, req: Any) -> int:
    """GPU KV the refused request needs to be admitted: its uncached tokens and its reply."""
    from sglang.srt.managers.schedule_policy import CLIP_MAX_NEW_TOKENS

    extend = len(req.full_untruncated_fill_ids) - req.prefix_len
    max_new = min(
        max(req.sampling_params.max_new_tokens - len(req.output_ids), 0),
        CLIP_MAX_NEW_TOKENS,
    )
    page = getattr(mgr.tree.cache, "page_size", 1) or 1
    return extend + max_new + 2 * page


def check_decode_mem(original, batch, *args, **kwargs):
    """AROUND ScheduleBatch.check_decode_mem: the decode pressure valve.

    Before SGLang retracts running requests (their KV is freed, not cached), let
    leases go, least value first, one at a time until the next decode step fits.
    """
    ok = original(batch, *args, **kwargs)
    if ok:
        return ok
    mgr = manager_of(getattr(batch, "tree_cache", None))
    if mgr is None or not mgr.settings.release_on_decode_pressure:
        return ok
    scheduler = pass_state(mgr).live_scheduler()
    spare = _session_ids(batch.reqs)
    if scheduler is not None:
        spare |= _busy_sessions(scheduler)
    while not ok and mgr.host.active and mgr.has_hard():  # backed-up KV yields first (a reload)
        if _yield_one_for_decode(mgr, spare) <= 0:
            break
        ok = original(batch, *args, **kwargs)
    while not ok and mgr.has_hard():
        released = _release_one_for_decode(mgr, spare)
        if not released:
            break
        ok = original(batch, *args, **kwargs)
    return ok


@_guarded
def _yield_one_for_decode(mgr: LeaseManager, spare: set[str]) -> int:
    return mgr.host.yield_room("decode", 1, spare) or 0


@_guarded
def _release_one_for_decode(mgr: LeaseManager, spare: set[str]) -> int:
    return mgr.release_for_pressure("decode", 1, spare)[0]


# ---------------------------------------------------------------- introspection
@_guarded
def get_internal_state(result, controller, *args, **kwargs):
    """AFTER SchedulerInternalStateController.get_internal_state: /server_info shows
    ``internal_states[i].session_ttl``."""
    mgr = manager_of(getattr(controller.scheduler, "tree_cache", None))
    if mgr is not None and isinstance(getattr(result, "internal_state", None), dict):
        result.internal_state["session_ttl"] = mgr.snapshot()


def set_internal_state(original, controller, recv_req, *args, **kwargs):
    """AROUND SchedulerInternalStateController.set_internal_state: the after-turn channel.

    Keys ``sglang_ext:<field>:<session_id>`` (``wire.after_turn_state``) update that session's
    lease; every other key goes to SGLang, which accepts or refuses them as it always did. The
    request is all-or-nothing like SGLang's: a malformed plugin key or value, or a refusal by
    SGLang, applies nothing. It arrives in every rank's input stream at the same position, and
    the new values are stamped at the next lease-clock tick, so all ranks decide alike.
    """
    server_args = getattr(recv_req, "server_args", None) or {}
    ours = {k: v for k, v in server_args.items() if isinstance(k, str) and k.startswith(AFTER_TURN_PREFIX)}
    mgr = manager_of(getattr(controller.scheduler, "tree_cache", None)) if ours else None
    if mgr is None:  # inert: SGLang refuses the keys it does not know, ours included
        return original(controller, recv_req, *args, **kwargs)
    from sglang.srt.managers.io_struct import SetInternalStateReqOutput

    try:
        updates = parse_after_turn(ours)
    except ValueError as exc:
        logger.warning("sglang_ext: /set_internal_state refused: %s", exc)
        return SetInternalStateReqOutput(updated=False)
    rest = {k: v for k, v in server_args.items() if k not in ours}
    if rest:
        import msgspec

        result = original(controller, msgspec.structs.replace(recv_req, server_args=rest), *args, **kwargs)
        if not getattr(result, "updated", False):
            return result
    _apply_after_turn(mgr, updates)
    return SetInternalStateReqOutput(updated=True)


@_guarded
def _apply_after_turn(mgr: LeaseManager, updates: dict[str, dict[str, float]]) -> None:
    for session_id, fields in updates.items():
        mgr.update_after_turn(session_id, fields.get("ttl"), fields.get("expect"), fields.get("spread"))


# --------------------------------------------------------- main-process validation
def validate_server_args(server_args, previous):
    """Resolution hook on handle_cache_compatibility (main process): reject bad
    session_ttl settings before the model is loaded."""
    previous(server_args)
    from sglang.srt.arg_groups.model_override_base import resolving_view

    cfg = resolving_view(server_args)
    if str(cfg.radix_eviction_policy).lower() != POLICY_NAME:
        return
    settings = SessionTTLSettings.from_policy_config(cfg.radix_eviction_policy_config)
    if cfg.disable_radix_cache:
        logger.warning(
            "sglang_ext: %s has no effect with --disable-radix-cache", POLICY_NAME
        )
    logger.info("sglang_ext: %s settings: %s", POLICY_NAME, settings.describe())


# ---------------------------------------------------------------------- registry
def hook_table():
    """(target, hook, type) for HookRegistry; one place lists every patch."""
    from sglang.srt.plugins.hook_registry import HookType

    A, B, R = HookType.AFTER, HookType.BEFORE, HookType.AROUND
    return [
        (
            "sglang.srt.mem_cache.unified_cache.tree_core_registry._rust_fallback_reason",
            rust_fallback_reason,
            R,
        ),
        (f"{_CACHE}.on_release", on_release, A),
        (f"{_CACHE}.reset", on_reset, A),
        (f"{_CACHE}._evict_device_leaf", evict_device_leaf, R),
        (f"{_CACHE}.evict_host", evict_host, A),
        (f"{_CACHE}.init_hicache", init_hicache, A),
        (f"{_SCHED}.close_session", close_session, A),
        (f"{_SCHED}.handle_generate_request", handle_generate_request, B),
        (f"{_SCHED}._poll_timeout_aborts", poll_timeout_aborts, A),
        (f"{_SCHED}.init_request_dispatcher", init_request_dispatcher, A),
        (f"{_SCHED}._get_new_batch_prefill_raw", get_new_batch_prefill_raw, R),
        (
            "sglang.srt.managers.schedule_policy.SchedulePolicy._touch_waiting_prefixes",
            touch_waiting_prefixes,
            A,
        ),
        (
            "sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req",
            add_one_req,
            A,
        ),
        (
            "sglang.srt.managers.schedule_batch.ScheduleBatch.check_decode_mem",
            check_decode_mem,
            R,
        ),
        (
            (
                "sglang.srt.managers.scheduler_components.internal_state."
                "SchedulerInternalStateController.get_internal_state"
            ),
            get_internal_state,
            A,
        ),
        (
            (
                "sglang.srt.managers.scheduler_components.internal_state."
                "SchedulerInternalStateController.set_internal_state"
            ),
            set_internal_state,
            R,
        ),
    ]
