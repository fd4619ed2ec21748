"""The simulated SGLang engine: SGLang's real radix cache and admission code, a cost model for time.

One ``SimEngine`` owns a real ``UnifiedRadixCache`` on a CPU token pool of ``kv_tokens`` slots and
runs the scheduler loop of ``Scheduler.get_next_batch_to_run`` in virtual time:

* waiting queue, FCFS; each pass builds SGLang's own ``PrefillAdder`` (``PrefillBudget``:
  available + evictable - reservations of running requests; the whole uncached prompt plus
  ``max_new_tokens`` must fit; temporary lock on the matched prefix; chunked prefill with
  ``chunked_prefill_size``; ``batch_is_full`` after a refusal until a request leaves);
* a prefill batch runs before any decode; its KV is allocated with SGLang's ``alloc_token_slots``
  (which evicts through the strategy), then the prompt is published with ``checkpoint_kv_cache``;
* decode is continuous batching; when nothing else can happen it advances many steps in one jump
  (to the next finish, the next outside event, or the end of free KV) - the same tree operations
  as one step at a time, since nothing touches the tree in between;
* a finished request goes through ``release_kv_cache(checkpoint=True)`` (prompt + output[:-1]
  inserted, lock released, ``on_release`` - where the plugin grants leases);
* when the next decode step does not fit: ``ScheduleBatch.check_decode_mem`` (plugin decode valve),
  then retraction in SGLang's order with its ``release_req``;
* the plugin (``sglang_ext.hooks``): its hooks run where SGLang's Scheduler runs them: the AROUND
  hook on ``_get_new_batch_prefill_raw`` wraps this engine's pass (leased-first queue order, prefill
  valve), ``handle_generate_request`` before a request is queued, ``close_session`` after the
  session is closed, and rank 0's ``LeaseClockTick`` at step boundaries, decided at virtual time by
  ``hooks.clock_tick`` (the body of the ``_poll_timeout_aborts`` hook) and handled by the
  dispatcher that its ``init_request_dispatcher`` hook extends; ``on_release``, ``reset``,
  eviction and ``check_decode_mem`` hooks run inside the real SGLang methods. Every hook is a no-op
  unless the cache's policy is ``session_ttl``.

The plugin's scheduler tests (``tests/sglang_ext``) drive this engine too: it is the project's one
imitation of SGLang's Scheduler, which is why it exposes Scheduler-shaped attributes.

With a host tier (``host_tier=HostTierArgs(...)``, SGLang's ``--enable-hierarchical-cache``) the
cache gets SGLang's real HiCache (``hicache_cpu.attach_host_tier``: controller, host pool,
write-through, demotion, host eviction, load-back), and the loop does what SGLang's Scheduler
does with it: ``check_hicache_events`` (``writing_check`` / ``loading_check``) at the start of
every iteration, ``init_load_back`` inside the real ``PrefillAdder`` for a host hit, and
``ready_to_load_host_cache`` when the prefill batch is built (its producer index becomes the
batch's ``hicache_consumer_index``; the plugin's prefetch runs after the pass, as its hook does
in SGLang). Copies take virtual time on the controller's two streams (``hicache_cpu.CopyEngine``,
rates from the cost model), so backups and loads land - and SGLang reaps them - when they would
on the GPU; a prefill batch with a consumer index waits for that load layer by layer
(``CostModel.prefill_time_with_load``). Without a host tier none of this runs.

Time is the cost model's (``costmodel.CostModel``): nothing sleeps here. ``serve`` mode advances
the engine to wall-clock targets; ``replay`` to the next client event.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from sidecar_tools.simulator import sglang_env
from sidecar_tools.simulator.costmodel import CostModel
from sidecar_tools.simulator.hicache_cpu import CopyEngine, CopyRate, HostTierArgs, attach_host_tier

log = logging.getLogger(__name__)

WAITING_PREFIX_REFRESH_INTERVAL = 32  # schedule_policy.py
WAITING_QUEUE_PREFIX_MATCH_MAX = 128
IDLE_RETRY_S = 0.05  # a stalled engine retries admission about this often (the plugin's tick)
MAX_JUMP_STEPS = 100_000


@dataclass
class SimRequest:
    """One /generate request as the engine sees it, and what happened to it."""

    rid: str
    input_ids: list[int]
    max_new_tokens: int
    session_id: str | None = None
    ignore_eos: bool = True
    custom_params: dict[str, Any] | None = None
    extra_key: str | None = None  # cache namespaces (RadixKey.extra_key / cache_salt): disjoint prefixes
    cache_salt: str | None = None
    # prompt tokens [start, end) read from a shared L3 store into the host tier before this request
    # was queued (a re-homed session's history, ``shared_l3``): copied to the GPU, not prefilled
    storage_range: tuple[int, int] | None = None
    output_source: Callable[[int], list[int]] | None = None  # n -> the ids to emit
    on_update: Callable[[SimRequest], None] | None = None  # finished (and, with stream, new tokens)
    stream: bool = False  # call on_update after every step that added tokens
    # filled by the engine
    arrival_s: float = 0.0
    first_token_s: float | None = None
    finish_s: float | None = None
    cached_tokens: int = 0
    cached_tokens_host: int = 0  # of cached_tokens, loaded back from the host tier
    cached_tokens_storage: int = 0  # of cached_tokens, read from the shared L3 store (storage_range)
    output_ids: list[int] = field(default_factory=list)
    finish_reason: dict[str, Any] | None = None
    num_retractions: int = 0
    planned: list[int] = field(default_factory=list, repr=False)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class PrefillBatch:
    """The new prefill batch of one pass (the parts of SGLang's ScheduleBatch the plugin reads):
    its requests and the host load its forward waits for (-1: none)."""

    reqs: list[Any]
    hicache_consumer_index: int = -1
    chunks: list[tuple[int, int]] = field(default_factory=list)  # (computed tokens, prefix tokens) per request
    storage_tokens: int = 0  # of the batch's new tokens: copied in from L3 reads, not computed


class _RunningBatchView:
    """``Scheduler.running_batch`` as the plugin's hooks read it: the running requests, and
    ``batch_is_full`` (the engine's flag: a hook that made room clears it, as on SGLang's batch)."""

    def __init__(self, engine: SimEngine) -> None:
        self._engine = engine
        self.reqs = engine.running

    def is_empty(self) -> bool:
        return not self.reqs

    def batch_size(self) -> int:
        return len(self.reqs)

    @property
    def batch_is_full(self) -> bool:
        return self._engine.batch_is_full

    @batch_is_full.setter
    def batch_is_full(self, value: bool) -> None:
        self._engine.batch_is_full = bool(value)


class SimEngine:
    def __init__(
        self,
        kv_tokens: int = 173_200,
        policy: str = "lru",
        policy_config: dict[str, Any] | None = None,
        cost: CostModel | None = None,
        *,
        chunked_prefill_size: int = 8192,
        max_prefill_tokens: int = 16384,
        max_running_requests: int = 256,
        context_length: int = 40960,
        waiting_prefix_refresh: bool = True,
        session_radix_cache: bool = False,
        max_jump_steps: int = MAX_JUMP_STEPS,
        host_tier: HostTierArgs | None = None,
    ):
        self.env = sglang_env.setup()
        self.kv_tokens = kv_tokens
        self.policy = policy.lower()
        self.policy_config = dict(policy_config or {})
        self.cost = cost or CostModel()
        self.chunked_prefill_size = chunked_prefill_size
        self.max_prefill_tokens = max_prefill_tokens
        self.max_running_requests = max_running_requests
        self.context_length = context_length
        # SchedulePolicy._touch_waiting_prefixes: SGLang's own for --radix-eviction-policy lru,
        # the plugin's AFTER hook for session_ttl (same conditions, same pass counter)
        self.waiting_prefix_refresh = waiting_prefix_refresh and self.policy in ("lru", "session_ttl")
        self._schedule_policy = SimpleNamespace(tree_cache=None, _waiting_prefix_refresh_calls=0)
        self.session_radix_cache = session_radix_cache
        self.max_jump_steps = max(1, max_jump_steps)  # 1 = one decode step at a time (tests)
        self.cache, self.req_pool, self.alloc = sglang_env.build_cache(
            kv_tokens, self.policy, self.policy_config, max_running_requests=max_running_requests,
            max_context_len=context_length, session_radix_cache=session_radix_cache)
        self.mgr = sglang_env.lease_manager(self.cache)  # read for gauges and time steps only
        self._hooks = sglang_env.plugin_hooks()
        self._request_dispatcher = self.env.TypeBasedDispatcher([])
        self._hooks.init_request_dispatcher(None, self)  # routes LeaseClockTick to the lease manager
        self.ratio = self.env.NewTokenRatioTracker.from_config()
        self.now = 0.0
        self.waiting: list[Any] = []
        self.running: list[Any] = []
        self.chunked_req: Any = None
        self.batch_is_full = False
        self._passes = 0
        self._sim: dict[str, SimRequest] = {}
        self._counters: dict[str, float] = {}
        self.busy_s = {"prefill": 0.0, "decode": 0.0}
        self._count_evictions()
        self.host_tier = host_tier
        self.copies: CopyEngine | None = None
        self.host_metrics: Any = None  # SGLang's radix-cache metrics (Prometheus registry), host tier only
        self._server_args: dict[str, Any] | None = None
        if host_tier is not None:
            self._attach_host_tier(host_tier)

    def _attach_host_tier(self, args: HostTierArgs) -> None:
        cost = self.cost
        self.copies = CopyEngine(lambda: self.now,
                                 load=CopyRate(cost.host_load_tokens_per_s, cost.host_load_latency_s),
                                 write=CopyRate(cost.host_write_tokens_per_s, cost.host_write_latency_s))
        self.host_metrics = sglang_env.host_tier_metrics(self.cache)
        host_tokens = args.host_tokens(self.kv_tokens, cost.kv_bytes_per_token)
        attach_host_tier(self.cache, host_tokens=host_tokens, write_policy=args.write_policy, copies=self.copies)
        self.busy_s["host_wait"] = 0.0  # the scheduler blocked on a copy (write_back eviction)

    # ------------------------------------------------------------------ outside API
    @property
    def max_req_input_len(self) -> int:
        return min(self.context_length - 1, self.kv_tokens - 1)

    def submit(self, sim: SimRequest) -> None:
        """A request arrives now (it joins the waiting queue; scheduled at the next step)."""
        env = self.env
        if not sim.input_ids:
            raise ValueError("input_ids is empty")
        if len(sim.input_ids) > self.max_req_input_len:
            raise ValueError(f"The input ({len(sim.input_ids)} tokens) is longer than the model's context length "
                             f"({self.context_length} tokens).")
        if len(sim.input_ids) + sim.max_new_tokens > self.context_length:
            raise ValueError(f"Requested token count exceeds the model's maximum context length of "
                             f"{self.context_length} tokens.")
        reserve = len(sim.input_ids) + min(sim.max_new_tokens, self.env.CLIP_MAX_NEW_TOKENS) + 1
        if reserve >= self.kv_tokens:  # could never be admitted (PrefillBudget), even into an empty pool
            raise ValueError(f"prompt ({len(sim.input_ids)} tokens) + max_new_tokens does not fit in the KV pool "
                             f"of {self.kv_tokens} tokens")
        if sim.rid in self._sim:
            raise ValueError(f"duplicate request id {sim.rid}")
        planned = list(sim.output_source(sim.max_new_tokens)) if sim.output_source else [0] * sim.max_new_tokens
        if len(planned) < sim.max_new_tokens:
            raise ValueError("output_source returned too few ids")
        self._hooks.handle_generate_request(self, sim)  # BEFORE Scheduler.handle_generate_request
        params = env.SamplingParams(max_new_tokens=sim.max_new_tokens, ignore_eos=sim.ignore_eos,
                                    custom_params=sim.custom_params)
        params.normalize(None)
        req = env.Req(rid=sim.rid, origin_input_text="", origin_input_ids=array("q", sim.input_ids),
                      sampling_params=params, session_id=sim.session_id, extra_key=sim.extra_key,
                      cache_salt=sim.cache_salt)
        if self.session_radix_cache and sim.session_id:  # Scheduler._handle_generate_request
            req.session_generation = self.cache.ensure_session_generation(sim.session_id)
        sim.arrival_s = self.now
        sim.planned = planned
        self._sim[sim.rid] = sim
        self.waiting.append(req)
        self._inc("sglang:num_requests_total")

    def abort(self, rid: str) -> bool:
        """Abort a queued or running request (SGLang /abort_request)."""
        sim = self._sim.get(rid)
        if sim is None or sim.finished:
            return False
        req = next((r for r in self.waiting + self.running + [self.chunked_req] if r is not None and r.rid == rid), None)
        if req is None:
            return False
        reason = self.env.FINISH_ABORT("Aborted by AbortReq.")
        if req in self.waiting:
            self.waiting.remove(req)
            if req.kv.holds_kv:  # a retracted request holds nothing; defensive
                self.env.release_kv_cache(req, self.cache, checkpoint=False)
        elif req is self.chunked_req:
            self.chunked_req = None
            req.finished_reason = reason
            self.env.release_kv_cache(req, self.cache, checkpoint=False)
        else:
            self.running.remove(req)
            self.batch_is_full = False
            req.finished_reason = reason
            self.env.release_kv_cache(req, self.cache, checkpoint=True)
        self._inc("sglang:num_aborted_requests_total")
        self._finish_sim(sim, {"type": "abort", "message": "Aborted by AbortReq.", "status_code": None,
                               "err_type": None})
        return True

    def cached_prefix_len(self, ids: list[int], extra_key: str | None = None) -> int:
        """Tokens of ``ids`` this engine holds (GPU or host tier): the part of a prompt a storage
        read skips (SGLang matches the tree this way before it prefetches from L3)."""
        env = self.env
        match = self.cache.match_prefix(env.MatchPrefixParams(key=env.RadixKey(array("q", ids), extra_key=extra_key)))
        return int(match.device_prefix_len) + int(match.host_hit_length or 0)

    def close_session(self, session_id: str) -> None:
        """SGLang /close_session: ``Scheduler.close_session`` (with the session radix cache the
        session's references are dropped), then the plugin's AFTER hook releases its lease."""
        if self.session_radix_cache and session_id:
            self.cache.release_radix_session(session_id)
        self._hooks.close_session(None, self, self.env.CloseSessionReqInput(session_id=session_id))

    def set_internal_state(self, server_args: dict[str, Any]) -> bool:
        """SGLang /set_internal_state through the plugin's AROUND hook (its after-turn channel);
        SGLang's own numeric knobs (pp_max_micro_batch_size, ...) are not simulated, so every
        other key is refused, as SGLang refuses keys it does not know."""
        env = self.env
        recv = env.SetInternalStateReq(server_args=server_args)
        controller = SimpleNamespace(scheduler=self)
        result = self._hooks.set_internal_state(lambda *_a, **_k: env.SetInternalStateReqOutput(updated=False),
                                                controller, recv)
        return bool(getattr(result, "updated", False))

    def idle(self) -> bool:
        return not self.waiting and not self.running and self.chunked_req is None

    def flush_cache(self) -> bool:
        """SGLang /flush_cache: only when idle; resets the tree, the pools and (plugin) leases."""
        if not self.idle():
            return False
        self.cache.reset()
        self.req_pool.clear()
        self.alloc.clear()
        return True

    @property
    def busy(self) -> bool:
        """Something can run now (a prefill may be admitted or a decode batch runs)."""
        return bool(self.running) or self.chunked_req is not None or (bool(self.waiting) and not self._stalled)

    _stalled = False  # the last pass admitted nothing and nothing runs: wait for time or events
    _valve_released = False  # the last pass's prefill valve released leases: try again at once

    def next_wakeup(self) -> float | None:
        """When a stalled engine should look at its queue again (lease expiry, retry; with a host
        tier also the next copy landing, which may unlock KV)."""
        if self.waiting and not self.running and self.chunked_req is None:
            wake = self.now + IDLE_RETRY_S
            landing = self.copies.next_landing() if self.copies is not None else None
            return min(wake, landing) if landing is not None else wake
        tick = self._host_tick_interval()
        if tick is not None and self.is_fully_idle():  # the plugin may want to prefetch while idle
            return self.now + tick
        return None

    def _host_tick_interval(self) -> float | None:
        """The plugin's lease-clock tick while it manages leases over a host tier (it may lock or
        prefetch at any tick); None otherwise."""
        mgr = self.mgr
        if self.copies is None or mgr is None or not mgr.host.active or not len(mgr.table):
            return None
        return mgr.settings.tick_interval_s

    def advance_idle(self, t: float) -> None:
        """Nothing runs until ``t``: move the clock (the plugin's lease clock follows)."""
        self.now = max(self.now, t)
        self._stalled = False
        self._poll_lease_clock()
        if self.copies is not None and self.is_fully_idle():
            self._idle_iteration()

    def _idle_iteration(self) -> None:
        """An idle Scheduler iteration with a host tier: SGLang still polls the copies and runs the
        (hooked) prefill pass, which admits nothing but lets the plugin prefetch."""
        self.cache.check_hicache_events()
        self._wait_for_copies()
        self._get_new_batch_prefill()

    def notify(self) -> None:
        """Something changed outside (arrival, lease released): re-check the queue."""
        self._stalled = False

    # ------------------------------------------------------------------ Scheduler-shaped views
    # (the plugin's hooks read these attributes of SGLang's Scheduler)
    @property
    def tree_cache(self) -> Any:
        return self.cache

    @property
    def waiting_queue(self) -> list[Any]:
        return self.waiting

    @property
    def running_batch(self) -> Any:
        return _RunningBatchView(self)

    @property
    def new_token_ratio_tracker(self) -> Any:
        return self.ratio

    def is_fully_idle(self, ignore_waiting: bool = False) -> bool:
        return not self.running and self.chunked_req is None and (ignore_waiting or not self.waiting)

    # ------------------------------------------------------------------ the loop
    def step(self, horizon: float | None = None) -> bool:
        """One scheduler iteration: a prefill batch, or a jump of decode steps that ends at the
        first finish, at the first step ending at or after ``horizon``, or when KV runs out.
        Returns False when nothing could run (idle or stalled)."""
        self._poll_lease_clock()
        if self.copies is not None:
            self.cache.check_hicache_events()  # Scheduler._process_hicache_events
            self._wait_for_copies()
        batch = self._get_new_batch_prefill()
        if batch:
            self._stalled = False
            self._run_prefill(batch)
            self._flush_backups()
            self._poll_lease_clock()  # the next loop iteration stamps leases granted by finishes
            return True
        if self.running:
            self._stalled = False
            self._run_decode(horizon)
            self._flush_backups()
            self._poll_lease_clock()
            return True
        # nothing admitted and nothing runs: wait for an event, unless the valve just made room
        self._stalled = bool(self.waiting) and not self._valve_released
        return False

    def run_until(self, t: float) -> None:
        """Run steps until the clock reaches ``t`` (the last step may end after it)."""
        while self.now < t:
            if not self.busy or not self.step(horizon=t):
                wake = self.next_wakeup()
                self.advance_idle(min(t, wake) if wake is not None else t)

    # ------------------------------------------------------------------ plugin clock
    def _poll_lease_clock(self) -> None:
        """Rank 0's lease clock in virtual time, where ``Scheduler.recv_requests`` polls
        (``_poll_timeout_aborts``, hooked) and ``process_input_requests`` dispatches: the plugin
        decides on a LeaseClockTick at ``now`` and its handler stamps new leases and expires due
        ones (except those of sessions with a request queued or running)."""
        tick = self._hooks.clock_tick(self, self.now)
        if tick is None:
            return
        leases = len(self.mgr.table)
        self._request_dispatcher(tick)
        if len(self.mgr.table) < leases:
            self._stalled = False  # expired leases became evictable

    def next_lease_expiry(self) -> float | None:
        if self.mgr is None:
            return None
        return self.mgr.table.next_expiry()

    # ------------------------------------------------------------------ prefill
    def _get_new_batch_prefill(self) -> PrefillBatch | None:
        """``Scheduler.get_new_batch_prefill``: the plugin's AROUND hook on
        ``_get_new_batch_prefill_raw`` wraps this engine's pass as HookRegistry wraps SGLang's
        (leased-first queue order before it, the prefill pressure valve and, with a host tier,
        its prefetch after it)."""
        leases = self._lease_counts()
        batch, _ = self._hooks.get_new_batch_prefill_raw(SimEngine._get_new_batch_prefill_raw, self)
        # the valve released (or unlocked) leases: the next pass may admit the head, so do not wait
        # for an event
        after = self._lease_counts()
        self._valve_released = self.mgr is not None and (after[0] < leases[0] or after[1] < leases[1])
        return batch

    def _lease_counts(self) -> tuple[int, int]:
        """(leases, hard leases) of the plugin; (0, 0) without it."""
        if self.mgr is None:
            return 0, 0
        return len(self.mgr.table), self.mgr.table.count("hard")

    def _get_new_batch_prefill_raw(self) -> tuple[PrefillBatch | None, Any]:
        """``Scheduler._get_new_batch_prefill_raw``, FCFS, with SGLang's PrefillAdder:
        (the new prefill batch or None, the running batch). With a host tier the adder's
        ``init_load_back`` queued the host hits' loads; building the batch submits them."""
        env = self.env
        if not self.running:
            self.batch_is_full = False
        if (self.batch_is_full or not self.waiting) and self.chunked_req is None:
            return None, self.running_batch
        running_bs = len(self.running)
        if self._allocatable(running_bs) <= 0 and self.chunked_req is None:
            self.batch_is_full = True
            return None, self.running_batch
        self._refresh_waiting_prefixes()
        view = SimpleNamespace(reqs=self.running, batch_size=lambda: running_bs)
        adder = env.PrefillAdder(
            1, self.cache, self.alloc, view, self.ratio.current, self.max_prefill_tokens,
            self.chunked_prefill_size, 0, 0, max_prefill_bs=0, max_running_requests=self.max_running_requests,
            prefill_max_requests=None, waiting_queue_len=len(self.waiting))
        if self.chunked_req is not None:
            self.chunked_req.init_next_round_input()
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        for req in self.waiting:
            if adder.budget_state() == env.AddReqResult.OTHER:
                break
            held = sum(1 for r in adder.can_run_list if r.kv.holds_kv)
            if len(adder.can_run_list) - held >= self._allocatable(running_bs):
                self.batch_is_full = True
                break
            req.init_next_round_input(self.cache)
            res = adder.add_one_req(req, has_chunked_req=self.chunked_req is not None, truncation_align_size=None)
            if res != env.AddReqResult.CONTINUE:
                if res == env.AddReqResult.NO_TOKEN:
                    self.batch_is_full = bool(adder.can_run_list) or bool(self.running)
                break
        can_run = list(adder.can_run_list)
        if not can_run:
            return None, self.running_batch
        chosen = set(map(id, can_run))
        self.waiting = [r for r in self.waiting if id(r) not in chosen]
        if adder.new_chunked_req is not None:
            assert self.chunked_req is None
            self.chunked_req = adder.new_chunked_req
        batch = PrefillBatch(can_run)
        if self.copies is not None:
            batch.hicache_consumer_index = self.cache.ready_to_load_host_cache()
        self._prepare_for_extend(batch)
        return batch, self.running_batch

    def _allocatable(self, running_bs: int) -> int:
        rows = self.req_pool.available_size()
        return min(self.max_running_requests - running_bs, rows)

    def _refresh_waiting_prefixes(self) -> None:
        """SchedulePolicy._touch_waiting_prefixes (LRU, Python TreeCore): every 32nd pass the
        waiting requests' cached prefixes are touched, head last."""
        self._passes += 1
        if not self.waiting_prefix_refresh:
            return
        if self.policy != "lru":  # SGLang's method returns at its policy-name check; the hook runs after it
            self._schedule_policy.tree_cache = self.cache
            self._hooks.touch_waiting_prefixes(None, self._schedule_policy, None, self.waiting)
            return
        if (self._passes - 1) % WAITING_PREFIX_REFRESH_INTERVAL:
            return
        for req in reversed(self.waiting[:WAITING_QUEUE_PREFIX_MATCH_MAX]):
            self.env.touch_waiting_prefix(req, self.cache)

    def _prepare_for_extend(self, batch: PrefillBatch) -> None:
        """``ScheduleBatch.prepare_for_extend``, still inside the pass (before the plugin's hook
        may prefetch): request rows and the new tokens' KV (allocation evicts), cached tokens."""
        env, torch = self.env, self.env.torch
        chunks = batch.chunks
        for req in batch.reqs:
            if req.kv.holds_kv:  # a later chunk: its prefix is in its own row
                prefix = None
            elif req.prefix_len:
                prefix = self.cache.prefix_device_indices(req)
            else:
                prefix = torch.empty((0,), dtype=torch.int64)
            n = req.extend_end - req.prefix_len
            if prefix is not None:
                env.alloc_req_slots(self.req_pool, [req], self.cache)
            kv = env.alloc_token_slots(self.cache, n)
            row = req.kv.req_pool_idx
            if prefix is not None:
                self.req_pool.write((row, slice(0, req.extend_end)), torch.cat([prefix.to(kv.dtype), kv]))
            else:
                self.req_pool.write((row, slice(req.prefix_len, req.extend_end)), kv)
            req.kv.kv_allocated_len = req.kv.kv_committed_len = req.extend_end
            if not req.retracted_stain:  # prepare_for_extend: cached tokens counted once
                req.cached_tokens += req.prefix_len - req.already_computed
                if self.copies is not None and not req._cache_breakdown_computed:
                    req.cached_tokens_device, req.cached_tokens_host, req.cached_tokens_storage = \
                        env.split_cached_prefix_by_tier(
                            prefix_len=req.prefix_len, host_hit_len=req.materialized_host_hit_len(),
                            storage_hit_len=req.storage_hit_length, storage_hit_start=req.storage_hit_start,
                            host_hit_is_storage=req.host_hit_is_storage)
                    req._cache_breakdown_computed = True
            req.already_computed = req.extend_end
            loaded = self._storage_tokens(req, req.prefix_len, req.extend_end)
            batch.storage_tokens += loaded
            chunks.append((n - loaded, req.prefix_len + loaded))

    def _storage_tokens(self, req: Any, start: int, end: int) -> int:
        """Tokens of the chunk [start, end) the request already read from L3 (counted as cached once)."""
        sim = self._sim[req.rid]
        if sim.storage_range is None:
            return 0
        lo, hi = sim.storage_range
        loaded = max(0, min(end, hi) - max(start, lo))
        if loaded and not req.retracted_stain:
            sim.cached_tokens_storage += loaded
        return loaded

    def _run_prefill(self, batch: PrefillBatch) -> None:
        env, chunks = self.env, batch.chunks
        self._wait_for_copies()  # write_back: the allocation's eviction may have blocked on its backup
        dt = self.cost.prefill_time(chunks)
        compute_s = dt
        if batch.hicache_consumer_index >= 0:
            dt = self._prefill_time_with_load(dt, batch.hicache_consumer_index)
        if batch.storage_tokens:  # the L3 read landed in host memory: host-to-GPU inside the step
            cost = self.cost
            copy_s = cost.host_load_latency_s + batch.storage_tokens / cost.host_load_tokens_per_s
            dt = max(dt, cost.prefill_time_with_load(compute_s, 0.0, copy_s))
        self.now += dt
        self.busy_s["prefill"] += dt
        self._inc("sim:prefill_steps_total")
        self._inc("sim:prefill_tokens_total", sum(n for n, _ in chunks))
        for req in batch.reqs:
            if req is self.chunked_req:
                env.checkpoint_kv_cache(req, self.cache)  # stash_chunked_request
                continue
            sim = self._sim[req.rid]
            if sim.first_token_s is None:
                sim.first_token_s = self.now
                sim.cached_tokens = int(req.cached_tokens) + sim.cached_tokens_storage
                if sim.cached_tokens_storage:
                    self._inc("sim:cached_tokens_storage_total", sim.cached_tokens_storage)
                self._inc("sglang:prompt_tokens_total", len(req.origin_input_ids))
                self._inc("sglang:cached_tokens_total", sim.cached_tokens)
                if self.copies is not None:
                    sim.cached_tokens_host = int(req.cached_tokens_host)
                    self._inc("sim:cached_tokens_host_total", sim.cached_tokens_host)
            req.output_ids.append(sim.planned[len(req.output_ids)])
            if len(req.output_ids) >= req.sampling_params.max_new_tokens:
                self._finish(req)
            else:
                env.checkpoint_kv_cache(req, self.cache)
                self.running.append(req)
                self.batch_is_full = False
                self._emit(req)

    def _prefill_time_with_load(self, compute_s: float, consumer: int) -> float:
        """The batch's forward waits, layer by layer, for load ``consumer`` (SGLang's
        ``LayerDoneCounter`` events; their virtual times say when the copy ran)."""
        landed = self.cache.cache_controller.layer_done_counter.events[consumer].finish_event
        if landed.at is None:  # no timed copy behind it
            return compute_s
        dt = self.cost.prefill_time_with_load(compute_s, landed.copy_from - self.now, landed.at - self.now)
        if dt > compute_s:
            self._inc("sim:load_wait_s_total", dt - compute_s)
            self._inc("sim:prefill_steps_waiting_for_load_total")
        return dt

    def _flush_backups(self) -> None:
        """``process_batch_result`` ends by submitting the batch's queued host backups."""
        if self.copies is not None:
            self.cache.flush_pending_backups()

    def _wait_for_copies(self) -> None:
        """A blocking wait of the scheduler on a copy (``synchronize``) moves the clock."""
        if self.copies is None:
            return
        until = self.copies.take_stall()
        if until is not None and until > self.now:
            self.busy_s["host_wait"] += until - self.now
            self.now = until

    # ------------------------------------------------------------------ decode
    def _run_decode(self, horizon: float | None) -> None:
        if not self._ensure_decode_room():
            return
        batch = len(self.running)
        ctx = sum(r.kv.kv_committed_len for r in self.running)
        k = min(r.sampling_params.max_new_tokens - len(r.output_ids) for r in self.running)
        if horizon is not None and horizon > self.now:
            k = min(k, self.cost.decode_steps_to_reach(batch, ctx, horizon - self.now))
        elif horizon is not None:
            k = 1
        if self.waiting and any(not r.sampling_params.ignore_eos for r in self.running):
            k = min(k, 32)  # admission estimates drift with new_token_ratio
        expiry = self.next_lease_expiry()
        if expiry is not None and expiry > self.now:
            k = min(k, self.cost.decode_steps_to_reach(batch, ctx, expiry - self.now))
        tick = self._host_tick_interval()
        if tick is not None:  # the plugin re-decides tiers and prefetches at its ticks
            k = min(k, self.cost.decode_steps_to_reach(batch, ctx, tick))
        room = self.alloc.available_size() + self.cache.evictable_size()
        k = max(1, min(k, room // batch, self.max_jump_steps))
        kv = self.env.alloc_token_slots(self.cache, k * batch)
        self._wait_for_copies()
        for i, req in enumerate(self.running):
            pos = req.kv.kv_allocated_len
            self.req_pool.write((req.kv.req_pool_idx, slice(pos, pos + k)), kv[i * k:(i + 1) * k])
            req.kv.kv_allocated_len = req.kv.kv_committed_len = pos + k
            sim = self._sim[req.rid]
            n = len(req.output_ids)
            req.output_ids.extend(sim.planned[n:n + k])
        dt = self.cost.decode_jump_time(batch, ctx, k)
        self.now += dt
        self.busy_s["decode"] += dt
        self._inc("sim:decode_steps_total", k)
        for _ in range(min(k, 1000)):
            self.ratio.decay_step()
        keep = []
        for req in self.running:
            if len(req.output_ids) >= req.sampling_params.max_new_tokens:
                self._finish(req)
                self.batch_is_full = False
            else:
                keep.append(req)
                self._emit(req)
        self.running = keep

    def _schedule_batch(self, reqs: list[Any]) -> Any:
        env = self.env
        return env.ScheduleBatch(reqs=reqs, req_to_token_pool=self.req_pool, token_to_kv_pool_allocator=self.alloc,
                                 tree_cache=self.cache, device="cpu", spec_algorithm=env.SpeculativeAlgorithm.NONE)

    def _ensure_decode_room(self) -> bool:
        """``update_running_batch``: if the next step does not fit, the (plugin-hooked)
        ``check_decode_mem`` runs, then requests are retracted in SGLang's order."""
        if self.alloc.available_size() + self.cache.evictable_size() >= len(self.running):
            return True
        batch = self._schedule_batch(self.running)
        if batch.check_decode_mem():
            return True
        env = self.env
        order = sorted(range(len(self.running)),
                       key=lambda i: (len(self.running[i].output_ids), -len(self.running[i].origin_input_ids)),
                       reverse=True)
        retracted = []
        first = True
        while first or not batch.check_decode_mem(selected_indices=order):
            if len(order) == 1:
                break
            first = False
            idx = order.pop()
            req = self.running[idx]
            env.release_req(req=req, remaing_req_count=len(order), req_to_token_pool=self.req_pool,
                            token_to_kv_pool_allocator=self.alloc, tree_cache=self.cache, hisparse_coordinator=None)
            retracted.append(req)
        keep = [self.running[i] for i in sorted(order)]
        if not batch.check_decode_mem(selected_indices=order):
            raise RuntimeError("simulated KV pool too small for a single request")
        self.running = keep
        self.batch_is_full = False
        self.ratio.current = env.NewTokenRatioTracker.estimate_new_token_ratio_after_retract(keep)
        for req in retracted:
            self._sim[req.rid].num_retractions += 1
            self.waiting.append(req)
        self._inc("sglang:num_retracted_requests_total", len(retracted))
        log.debug("t=%.3f retracted %d request(s)", self.now, len(retracted))
        return bool(self.running)

    # ------------------------------------------------------------------ finishing
    def _finish(self, req: Any) -> None:
        env = self.env
        req.finished_reason = env.FINISH_LENGTH(length=len(req.output_ids))
        env.release_kv_cache(req, self.cache, checkpoint=True)
        self._inc("sglang:generation_tokens_total", len(req.output_ids))
        self._finish_sim(self._sim[req.rid], {"type": "length", "length": len(req.output_ids)}, req)

    def _finish_sim(self, sim: SimRequest, reason: dict[str, Any], req: Any = None) -> None:
        if req is not None:
            sim.output_ids = list(req.output_ids)
        sim.finish_reason = reason
        sim.finish_s = self.now
        del self._sim[sim.rid]
        if sim.on_update:
            sim.on_update(sim)

    def _emit(self, req: Any) -> None:
        sim = self._sim[req.rid]
        if sim.stream and sim.on_update:
            sim.output_ids = list(req.output_ids)
            sim.on_update(sim)

    # ------------------------------------------------------------------ numbers
    def _inc(self, name: str, value: float = 1.0) -> None:
        self._counters[name] = self._counters.get(name, 0.0) + value

    # SGLang's HiCache counters (radix-cache collector), summed over their pool / reason labels
    HOST_COUNTERS = ("sglang:load_back_tokens_total", "sglang:hicache_backup_tokens_total",
                     "sglang:hicache_dropped_tokens_total")

    @property
    def counters(self) -> dict[str, float]:
        """The engine's counters; with a host tier also SGLang's HiCache token counters."""
        out = dict(self._counters)
        if self.host_metrics is not None:
            totals = dict.fromkeys(self.HOST_COUNTERS, 0.0)
            for family in self.host_metrics.collect():
                for sample in family.samples:
                    if sample.name in totals:
                        totals[sample.name] += sample.value
            out.update(totals)
        return out

    def _count_evictions(self) -> None:
        """Count evicted tokens (sglang:evicted_tokens_total) around the cache's eviction entry."""
        cache, original = self.cache, self.cache._evict

        def counted(*args, **kwargs):
            result = original(*args, **kwargs)
            self._inc("sglang:evicted_tokens_total", getattr(result, "num_tokens_evicted", 0) or 0)
            return result

        cache._evict = counted

    def gauges(self) -> dict[str, float]:
        avail, evictable = self.alloc.available_size(), self.cache.evictable_size()
        used = self.kv_tokens - avail - evictable
        out = {
            "sglang:max_total_num_tokens": self.kv_tokens,
            "sglang:num_running_reqs": len(self.running) + (1 if self.chunked_req is not None else 0),
            "sglang:num_queue_reqs": len(self.waiting),
            "sglang:kv_available_tokens": avail,
            "sglang:kv_evictable_tokens": evictable,
            "sglang:kv_used_tokens": used,
            "sglang:num_used_tokens": used,
            "sglang:token_usage": used / self.kv_tokens if self.kv_tokens else 0.0,
            "sglang:new_token_ratio": self.ratio.current,
        }
        if self.copies is not None:  # SchedulerMetricsReporter._log_hicache_stats
            host = self.cache.cache_controller.mem_pool_host
            out["sglang:hicache_host_used_tokens"] = host.logical_size - host.available_size()
            out["sglang:hicache_host_total_tokens"] = host.logical_size
        if self.mgr is not None:
            snap = self.mgr.snapshot()
            out["sglang_ext:leased_tokens"] = snap["leased_tokens"]
            out["sglang_ext:hard_leases"] = snap["hard_leases"]
            out["sglang_ext:soft_leases"] = snap["soft_leases"]
        return out

    def lease_metrics(self) -> dict[str, Any] | None:
        return self.mgr.snapshot()["metrics"] if self.mgr is not None else None

    def metrics_text(self, model_name: str = "simulated") -> str:
        """Prometheus exposition of the counters and gauges (label model_name); with a host tier
        also SGLang's radix-cache collector as SGLang exports it (its own labels)."""
        label = f'model_name="{model_name}"'
        lines = []
        counters = dict(self._counters)
        cached = counters.pop("sglang:cached_tokens_total", 0.0)
        host = counters.pop("sim:cached_tokens_host_total", 0.0)
        storage = counters.pop("sim:cached_tokens_storage_total", 0.0)
        names = {"sglang:prompt_tokens_total", "sglang:generation_tokens_total", "sglang:num_requests_total",
                 "sglang:evicted_tokens_total", "sglang:num_retracted_requests_total"}
        names |= set(counters)
        if self.host_metrics is not None:  # SGLang's radix-cache collector reports it (below)
            names.discard("sglang:evicted_tokens_total")
        for name in sorted(names):
            lines += [f"# TYPE {name} counter", f"{name}{{{label}}} {float(counters.get(name, 0.0))}"]
        lines.append("# TYPE sglang:cached_tokens_total counter")
        for source, value in (("device", cached - host - storage), ("host", host), ("storage", storage), ("total", cached)):
            lines.append(f'sglang:cached_tokens_total{{{label},cache_source="{source}"}} {float(value)}')
        for name, value in self.gauges().items():
            lines += [f"# TYPE {name} gauge", f"{name}{{{label}}} {float(value)}"]
        lines += self._lease_metric_lines(label)
        text = "\n".join(lines) + "\n"
        if self.host_metrics is not None:
            text += self._host_metrics_text()
        return text

    def _lease_metric_lines(self, label: str) -> list[str]:
        """The plugin's lease series under the names the real plugin exports (``sglang_ext:session_*``,
        ``sglang_ext.metrics.METRIC_SPECS``), so dashboards read the demo as they read SGLang."""
        if self.mgr is None:
            return []
        from sglang_ext.metrics import METRIC_SPECS

        series: dict[str, list[str]] = {}
        for key, extra, value in self.mgr.metrics.series():
            kind, name, _, _ = METRIC_SPECS[key]
            labels = label + "".join(f',{k}="{v}"' for k, v in extra)
            series.setdefault(f"# TYPE {name} {kind}", []).append(f"{name}{{{labels}}} {float(value)}")
        return [line for head, rows in series.items() for line in (head, *rows)]

    def _host_metrics_text(self) -> str:
        """SGLang's radix-cache series (its evicted tokens replace the engine's line), less the
        eviction-pass durations, which time this CPU process rather than the GPU."""
        from prometheus_client import generate_latest

        registry = self.host_metrics
        wall_clock = "sglang:eviction_duration_seconds"
        view = SimpleNamespace(collect=lambda: (f for f in registry.collect() if f.name != wall_clock))
        return generate_latest(view).decode()

    def hicache_server_args(self) -> dict[str, Any]:
        """The HiCache fields SGLang's /server_info reports for this engine's flags."""
        if self._server_args is None:
            args = self.host_tier or HostTierArgs()
            ratio = args.ratio
            if args.size_tokens:  # the simulator's own size: the ratio SGLang would be given for it
                ratio = args.size_tokens / self.kv_tokens
            self._server_args = sglang_env.hicache_server_args(
                self.host_tier is not None, ratio, 0.0 if args.size_tokens else args.size_gb, args.write_policy)
        return self._server_args

    def host_pool_tokens(self) -> int | None:
        """Tokens of the host pool SGLang allocated (padding page included); None without a tier."""
        return None if self.copies is None else int(self.cache.cache_controller.mem_pool_host.logical_size)

