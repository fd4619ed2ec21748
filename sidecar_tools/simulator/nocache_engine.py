"""The engine of SGLang launched with ``--disable-radix-cache``, reduced to its clock: for load tests.

Nothing is cached (``cached_tokens`` is always 0, as with SGLang's ``ChunkCache``) and no KV is
accounted, so a step costs a few microseconds a request instead of the real cache's bookkeeping
(about a millisecond a request, and tens of microseconds a decode step, in ``engine.SimEngine``):
what lets one CPU serve 500 streaming sessions. Every step, each running request (up to
``max_running_requests``, FCFS) gets its next token, and the step takes ``cost.step_s``. It
offers the part of ``SimEngine``'s interface that ``server.SimServer`` drives. No sglang import.
"""

from __future__ import annotations

from typing import Any

from sidecar_tools.simulator.costmodel import CostModel
from sidecar_tools.simulator.engine import SimEngine, SimRequest

ABORT_REASON = {"type": "abort", "message": "Aborted by AbortReq.", "status_code": None, "err_type": None}


class NoCacheEngine:
    disable_radix_cache = True
    policy = "lru"
    policy_config: dict[str, Any] = {}
    session_radix_cache = False
    mgr = None  # no plugin: leases need the real cache

    def __init__(self, kv_tokens: int = 173_200, cost: CostModel | None = None, *, context_length: int = 40960,
                 max_running_requests: int = 256, chunked_prefill_size: int = 8192, max_prefill_tokens: int = 16384):
        self.kv_tokens = kv_tokens
        self.cost = cost or CostModel.paced(0.0)
        self.context_length = context_length
        self.max_running_requests = max_running_requests
        self.chunked_prefill_size = chunked_prefill_size
        self.max_prefill_tokens = max_prefill_tokens
        self.now = 0.0
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self._counters: dict[str, float] = {}
        self.host_metrics = None  # no host tier

    @property
    def max_req_input_len(self) -> int:
        return min(self.context_length - 1, self.kv_tokens - 1)

    metrics_text = SimEngine.metrics_text  # the same exposition: counters, then gauges()
    _lease_metric_lines = SimEngine._lease_metric_lines  # empty: no plugin (mgr is None)

    @property
    def counters(self) -> dict[str, float]:
        return dict(self._counters)

    # ------------------------------------------------------------------ outside API
    def submit(self, sim: SimRequest) -> None:
        if not sim.input_ids:
            raise ValueError("input_ids is empty")
        if any(s.rid == sim.rid for s in self.waiting + self.running):
            raise ValueError(f"duplicate request id {sim.rid}")
        sim.arrival_s = self.now
        sim.planned = list(sim.output_source(sim.max_new_tokens)) if sim.output_source else [0] * sim.max_new_tokens
        self.waiting.append(sim)
        self._inc("sglang:num_requests_total")

    def abort(self, rid: str) -> bool:
        sim = next((s for s in self.waiting + self.running if s.rid == rid), None)
        if sim is None:
            return False
        (self.waiting if sim in self.waiting else self.running).remove(sim)
        self._inc("sglang:num_aborted_requests_total")
        self._finish(sim, dict(ABORT_REASON))
        return True

    def close_session(self, session_id: str) -> None:
        """Nothing is held for a session."""

    def hicache_server_args(self) -> dict:
        """No host tier (SGLang refuses HiCache without a radix cache)."""
        return {"enable_hierarchical_cache": False}

    def host_pool_tokens(self) -> None:
        return None

    def set_internal_state(self, server_args: dict) -> bool:
        """No plugin and none of SGLang's knobs: every key is refused."""
        return False

    def flush_cache(self) -> bool:
        return self.idle()

    def idle(self) -> bool:
        return not self.waiting and not self.running

    @property
    def busy(self) -> bool:
        return not self.idle()

    def next_wakeup(self) -> float | None:
        return None

    def next_lease_expiry(self) -> float | None:
        return None

    def advance_idle(self, t: float) -> None:
        self.now = max(self.now, t)

    def notify(self) -> None:
        """Arrivals join at the next step."""

    # ------------------------------------------------------------------ the loop
    def step(self, horizon: float | None = None) -> bool:
        """One step: the waiting requests that fit start, and every running request gets a token."""
        if self.idle():
            return False
        room = self.max_running_requests - len(self.running)
        starting, self.waiting = self.waiting[:room], self.waiting[room:]
        self.running += starting
        self.now += self.cost.step_s
        for sim in starting:
            sim.first_token_s = self.now
            self._inc("sglang:prompt_tokens_total", len(sim.input_ids))
        still = []
        for sim in self.running:
            sim.output_ids.append(sim.planned[len(sim.output_ids)])
            if len(sim.output_ids) >= sim.max_new_tokens:
                self._inc("sglang:generation_tokens_total", len(sim.output_ids))
                self._finish(sim, {"type": "length", "length": len(sim.output_ids)})
            else:
                still.append(sim)
                if sim.stream and sim.on_update:
                    sim.on_update(sim)
        self.running = still
        return True

    def _finish(self, sim: SimRequest, reason: dict[str, Any]) -> None:
        sim.finish_reason = reason
        sim.finish_s = self.now
        if sim.on_update:
            sim.on_update(sim)

    # ------------------------------------------------------------------ numbers
    def _inc(self, name: str, value: float = 1.0) -> None:
        self._counters[name] = self._counters.get(name, 0.0) + value

    def gauges(self) -> dict[str, float]:
        return {"sglang:max_total_num_tokens": self.kv_tokens, "sglang:num_running_reqs": len(self.running),
                "sglang:num_queue_reqs": len(self.waiting)}
