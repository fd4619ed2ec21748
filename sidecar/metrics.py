"""The sidecar's own Prometheus metrics, on a registry of their own (served at GET /metrics).

Names follow Prometheus' conventions: base units in the name (``_seconds``, ``_tokens``),
counters exposed with ``_total``. The ``_created`` series prometheus-client adds to every counter
and histogram are switched off (process-wide): they double the exposition and no dashboard reads
them.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

CLIENT_CLOSED = 499  # status of a request whose client went away before the answer ended (nginx's code)
SESSION_STATES = ("generating", "leased", "idle")
LATENCY_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1, 2.5)
LOOP_LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class _SessionStates(Collector):
    """``sidecar_sessions_by_state``: counted at scrape time from the session store."""

    def __init__(self) -> None:
        self.counts: Callable[[], Mapping[str, int]] = dict

    def collect(self):
        family = GaugeMetricFamily(
            "sidecar_sessions_by_state",
            "Sessions by state: generating (a request in flight or waiting for admission), leased "
            "(idle under the lease the sidecar requested), idle.",
            labels=["state"],
        )
        counts = self.counts()
        for state in SESSION_STATES:
            family.add_metric([state], counts.get(state, 0))
        yield family


class _TokenHistogram(Collector):
    """A histogram observed once per token arrival, on the event loop: bucket counts in a plain
    list, turned into Prometheus' cumulative buckets at scrape time. prometheus-client's
    ``Histogram.observe`` takes two locks per call (~1.3 us; this ~0.2 us), and the relay observes
    every chunk of every stream. Same exposition as a ``Histogram`` (``_bucket``, ``_sum``, ``_count``)."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]):
        self.name, self.documentation = name, documentation
        self.bounds = tuple(float(b) for b in buckets)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf only)
        self.sum = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += times  # le: a value on a bound counts there
        for _ in range(times):  # added one at a time, as a Histogram sums them (the same float)
            self.sum += value

    def collect(self):
        cumulative, total = [], 0
        for bound, count in zip(self.bounds + (float("inf"),), list(self.counts)):
            total += count
            cumulative.append((_bound_text(bound), total))
        yield HistogramMetricFamily(self.name, self.documentation, buckets=cumulative, sum_value=self.sum)


def _bound_text(bound: float) -> str:
    """A bucket's ``le`` as prometheus-client's Histogram writes it (``0.01``, ``1.0``, ``+Inf``)."""
    return "+Inf" if bound == float("inf") else repr(bound)


class SidecarMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        disable_created_metrics()
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "sidecar_requests",
            f"HTTP requests by route and status ({CLIENT_CLOSED}: the client closed the connection before the answer ended)",
            ["route", "status"],
            registry=r,
        )
        self.turns = Counter(
            "sidecar_turns", "Chat turns by how the session was found: continued, new, branch", ["kind"], registry=r
        )
        self.prompt_tokens = Counter("sidecar_prompt_tokens", "Prompt tokens sent to SGLang", registry=r)
        self.cached_tokens = Counter("sidecar_cached_tokens", "Prompt tokens SGLang served from cache", registry=r)
        self.completion_tokens = Counter("sidecar_completion_tokens", "Tokens generated", registry=r)
        self.sessions = Gauge("sidecar_sessions", "Sessions the sidecar remembers", registry=r)
        self._session_states = _SessionStates()
        r.register(self._session_states)
        self.session_bytes = Gauge(
            "sidecar_session_bytes", "Bytes the remembered sessions' turn states take (token ids)", registry=r
        )
        self.sessions_closed = Counter("sidecar_sessions_closed", "Sessions closed in SGLang and forgotten", ["reason"], registry=r)
        self.engine_capacity = Gauge(
            "sidecar_engine_capacity_tokens",
            "KV tokens the engine holds, by tier (gpu: its KV pool; host: HiCache's host tier); 0 = unknown or none",
            ["tier"],
            registry=r,
        )
        self.engine_info_known = Gauge(
            "sidecar_engine_info_known", "1 once SGLang told its capacity and limits (new sessions wait for it)", registry=r
        )
        self.latency = Histogram(
            "sidecar_request_duration_seconds",
            "Time from request to last byte, by route",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "sidecar_time_to_first_token_seconds",
            "Time from the start of a turn (request read, admission wait included) to SGLang's first token",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = _TokenHistogram(
            "sidecar_inter_token_latency_seconds",
            "Time between tokens as they arrive from SGLang (a chunk of n tokens counts n times its interval / n)",
            ITL_BUCKETS,
        )
        r.register(self.itl)
        self.sessions_rehomed = Counter(
            "sidecar_sessions_rehomed",
            "Sessions whose worker was lost (down or removed) and that continued on another worker; "
            "their history is recomputed there",
            registry=r,
        )
        self.rehomed_recompute_tokens = Counter(
            "sidecar_rehomed_recompute_tokens",
            "Tokens of history a re-homed session's new worker had to recompute (its old worker was lost, "
            "or smg served the turn elsewhere)",
            registry=r,
        )
        self.rehomed_restored_tokens = Counter(
            "sidecar_rehomed_restored_tokens",
            "Tokens of history a re-homed session's new worker found cached instead of recomputing them: "
            "read back from HiCache L3 storage the workers share (or a prefix it held)",
            registry=r,
        )
        self.turns_served_elsewhere = Counter(
            "sidecar_turns_served_elsewhere",
            "Turns smg served on another worker than the session's, even after the sidecar re-read its "
            "listing and sent them again; the session moves to that worker (counted in sessions_rehomed)",
            registry=r,
        )
        self.loop_lag = Histogram(
            "sidecar_event_loop_lag_seconds",
            "How late the event loop ran a timer due every 20 ms: the longest any request, stream or "
            "probe waited for the loop (work that held it, or the GIL, that long)",
            buckets=LOOP_LAG_BUCKETS,
            registry=r,
        )
        self.engine_up = Gauge(
            "sidecar_engine_up", "1 while every SGLang worker answers /health (probed every few seconds), else 0", registry=r
        )

    def count_session_states(self, counts: Callable[[], Mapping[str, int]]) -> None:
        """Where ``sidecar_sessions_by_state`` reads its counts ({state: sessions}) at scrape time."""
        self._session_states.counts = counts

    def observe_tokens(self, interval_s: float, n_tokens: int) -> None:
        """``n_tokens`` new tokens arrived ``interval_s`` after the previous ones (as SGLang counts)."""
        self.itl.observe(interval_s / n_tokens, n_tokens)
