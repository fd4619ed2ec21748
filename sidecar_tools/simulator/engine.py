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
    cache_salt: str | None = None  # SGLang's cache namespace (RadixKey.cache_salt): no prefix shared across salts
    ignore_eos: bool = True
    custom_params: dict[str, Any] | None = None
    output_source: Callable[[int], list[int]] | None = None  # n -> the ids to emit
    on_update: Callable[[SimRequest], None] | None = None  # finished (and, with stream, new tokens)
    stream: bool = False  # call on_update after every step that added tokens
    # filled by the engine
    arrival_s: float = 0.0
    first_token_s: float | None = None
    finish_s: float | None = None
    cached_tokens: int = 0
    output_ids: list[int] = field(default_factory=list)
    finish_reason: dict[str, Any] | None = None
    num_retractions: int = 0
    planned: list[int] = field(default_factory=list, repr=False)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


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
        # SchedulePolicy._touch_waiting_prefixes runs for --radix-eviction-policy lru only
        self.waiting_prefix_refresh = waiting_prefix_refresh and self.policy == "lru"
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
        self.counters: dict[str, float] = {}
        self.busy_s = {"prefill": 0.0, "decode": 0.0}
        self._count_evictions()

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
                      sampling_params=params, session_id=sim.session_id, cache_salt=sim.cache_salt)
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

    def close_session(self, session_id: str) -> None:
        """SGLang /close_session: ``Scheduler.close_session`` (with the session radix cache the
        session's references are dropped), then the plugin's AFTER hook releases its lease."""
        if self.session_radix_cache and session_id:
            self.cache.release_radix_session(session_id)
        self._hooks.close_session(None, self, self.env.CloseSessionReqInput(session_id=session_id))

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
        """When a stalled engine should look at its queue again (lease expiry, retry)."""
        if self.waiting and not self.running and self.chunked_req is None:
            return self.now + IDLE_RETRY_S
        return None

    def advance_idle(self, t: float) -> None:
        """Nothing runs until ``t``: move the clock (the plugin's lease clock follows)."""
        self.now = max(self.now, t)
        self._stalled = False
        self._poll_lease_clock()

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
        reqs = self.running
        return SimpleNamespace(reqs=reqs, is_empty=lambda: not reqs, batch_size=lambda: len(reqs))

    def is_fully_idle(self, ignore_waiting: bool = False) -> bool:
        return not self.running and self.chunked_req is None and (ignore_waiting or not self.waiting)

    # ------------------------------------------------------------------ the loop
    def step(self, horizon: float | None = None) -> bool:
        """One scheduler iteration: a prefill batch, or a jump of decode steps that ends at the
        first finish, at the first step ending at or after ``horizon``, or when KV runs out.
        Returns False when nothing could run (idle or stalled)."""
        self._poll_lease_clock()
        batch = self._get_new_batch_prefill()
        if batch:
            self._stalled = False
            self._run_prefill(batch)
            self._poll_lease_clock()  # the next loop iteration stamps leases granted by finishes
            return True
        if self.running:
            self._stalled = False
            self._run_decode(horizon)
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
    def _get_new_batch_prefill(self) -> list[Any]:
        """``Scheduler.get_new_batch_prefill``: the plugin's AROUND hook on
        ``_get_new_batch_prefill_raw`` wraps this engine's pass as HookRegistry wraps SGLang's
        (leased-first queue order before it, the prefill pressure valve after it)."""
        leases = len(self.mgr.table) if self.mgr is not None else 0
        batch, _ = self._hooks.get_new_batch_prefill_raw(SimEngine._get_new_batch_prefill_raw, self)
        # the valve released leases: the next pass may admit the head, so do not wait for an event
        self._valve_released = self.mgr is not None and len(self.mgr.table) < leases
        return batch or []

    def _get_new_batch_prefill_raw(self) -> tuple[list[Any] | None, Any]:
        """``Scheduler._get_new_batch_prefill_raw``, FCFS, with SGLang's PrefillAdder:
        (the requests of the new prefill batch or None, the running batch)."""
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
        return can_run, self.running_batch

    def _allocatable(self, running_bs: int) -> int:
        rows = self.req_pool.available_size()
        return min(self.max_running_requests - running_bs, rows)

    def _refresh_waiting_prefixes(self) -> None:
        """SchedulePolicy._touch_waiting_prefixes (LRU, Python TreeCore): every 32nd pass the
        waiting requests' cached prefixes are touched, head last."""
        self._passes += 1
        if not self.waiting_prefix_refresh or (self._passes - 1) % WAITING_PREFIX_REFRESH_INTERVAL:
            return
        for req in reversed(self.waiting[:WAITING_QUEUE_PREFIX_MATCH_MAX]):
            self.env.touch_waiting_prefix(req, self.cache)

    def _run_prefill(self, batch: list[Any]) -> None:
        env, torch = self.env, self.env.torch
        chunks = []
        for req in batch:
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
            req.already_computed = req.extend_end
            chunks.append((n, req.prefix_len))
        dt = self.cost.prefill_time(chunks)
        self.now += dt
        self.busy_s["prefill"] += dt
        self._inc("sim:prefill_steps_total")
        self._inc("sim:prefill_tokens_total", sum(n for n, _ in chunks))
        for req in batch:
            if req is self.chunked_req:
                env.checkpoint_kv_cache(req, self.cache)  # stash_chunked_request
                continue
            sim = self._sim[req.rid]
            if sim.first_token_s is None:
                sim.first_token_s = self.now
                sim.cached_tokens = int(req.cached_tokens)
                self._inc("sglang:prompt_tokens_total", len(req.origin_input_ids))
                self._inc("sglang:cached_tokens_total", sim.cached_tokens)
            req.output_ids.append(sim.planned[len(req.output_ids)])
            if len(req.output_ids) >= req.sampling_params.max_new_tokens:
                self._finish(req)
            else:
                env.checkpoint_kv_cache(req, self.cache)
                self.running.append(req)
                self.batch_is_full = False
                self._emit(req)

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
        room = self.alloc.available_size() + self.cache.evictable_size()
        k = max(1, min(k, room // batch, self.max_jump_steps))
        kv = self.env.alloc_token_slots(self.cache, k * batch)
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
        self.counters[name] = self.counters.get(name, 0.0) + value

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
        if self.mgr is not None:
            snap = self.mgr.snapshot()
            out["sglang_ext:leased_tokens"] = snap["leased_tokens"]
            out["sglang_ext:hard_leases"] = snap["hard_leases"]
            out["sglang_ext:soft_leases"] = snap["soft_leases"]
        return out

    def lease_metrics(self) -> dict[str, Any] | None:
        return self.mgr.snapshot()["metrics"] if self.mgr is not None else None

    def metrics_text(self, model_name: str = "simulated") -> str:
        """Prometheus exposition of the counters and gauges (label model_name)."""
        label = f'model_name="{model_name}"'
        lines = []
        counters = dict(self.counters)
        cached = counters.pop("sglang:cached_tokens_total", 0.0)
        for name in sorted(set(counters) | {"sglang:prompt_tokens_total", "sglang:generation_tokens_total",
                                            "sglang:num_requests_total", "sglang:evicted_tokens_total",
                                            "sglang:num_retracted_requests_total"}):
            lines += [f"# TYPE {name} counter", f"{name}{{{label}}} {float(counters.get(name, 0.0))}"]
        lines.append("# TYPE sglang:cached_tokens_total counter")
        for source, value in (("device", cached), ("host", 0.0), ("storage", 0.0), ("total", cached)):
            lines.append(f'sglang:cached_tokens_total{{{label},cache_source="{source}"}} {float(value)}')
        for name, value in self.gauges().items():
            lines += [f"# TYPE {name} gauge", f"{name}{{{label}}} {float(value)}"]
        return "\n".join(lines) + "\n"

