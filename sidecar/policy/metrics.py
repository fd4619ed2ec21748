"""Prometheus metrics of the policy, registered on the registry the sidecar's /metrics serves."""

from __future__ import annotations

import math
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

GAP_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600)
LOG2_ERROR_BUCKETS = (-8, -6, -4, -3, -2, -1, -0.5, 0, 0.5, 1, 2, 3, 4, 6, 8)
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)

LEASE_OUTCOMES = ("hit", "miss", "unused", "unleased")
ADMISSION_DECISIONS = ("immediate", "queued", "timeout", "rejected", "cancelled")
PACED_TURN_OUTCOMES = ("room", "timeout")
CLOSE_REASONS = ("idle", "table_full")


class PolicyMetrics:
    def __init__(self, registry: CollectorRegistry):
        self._registry = registry
        self.worker_admissions = Counter(
            "sidecar_worker_admissions",
            "New (or re-homed) sessions placed on each worker.",
            ["worker"],
            registry=registry,
        )
        self.gap_predicted = Histogram(
            "sidecar_gap_predicted_seconds",
            "Predicted median gap until a session's next request, at the end of each turn.",
            buckets=GAP_BUCKETS,
            registry=registry,
        )
        self.gap_actual = Histogram(
            "sidecar_gap_actual_seconds",
            "Observed gap between the end of a reply and the session's next request.",
            buckets=GAP_BUCKETS,
            registry=registry,
        )
        self.gap_error_log2 = Histogram(
            "sidecar_gap_prediction_error_log2",
            "log2(actual gap / predicted median gap); 0 = exact, +1 = came back twice as late.",
            buckets=LOG2_ERROR_BUCKETS,
            registry=registry,
        )
        self.gap_abs_error = Histogram(
            "sidecar_gap_prediction_abs_error_seconds",
            "|actual gap - predicted median gap| in seconds.",
            buckets=GAP_BUCKETS,
            registry=registry,
        )
        self.lease_ttl = Histogram(
            "sidecar_lease_ttl_seconds", "Lease TTL attached to a turn.", buckets=GAP_BUCKETS, registry=registry
        )
        self.lease_outcomes = Counter(
            "sidecar_lease_outcomes",
            "Gaps by outcome: hit (back before the lease expired), miss (back after), "
            "unused (closed without coming back while leased), unleased (no lease).",
            ["outcome"],
            registry=registry,
        )
        self.leased_token_seconds = Counter(
            "sidecar_leased_token_seconds",
            "Token-seconds of idle KV held under leases (tokens x min(gap, lease)).",
            registry=registry,
        )
        self.admission_decisions = Counter(
            "sidecar_admission_decisions",
            "New sessions by admission decision (timeout = let through after max_wait).",
            ["decision"],
            registry=registry,
        )
        self.admission_wait = Histogram(
            "sidecar_admission_wait_seconds",
            "Seconds a new session waited before its first request could start.",
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.admission_queue_length = Gauge(
            "sidecar_admission_queue_length", "New sessions waiting for admission.", registry=registry
        )
        self.paced_turns = Counter(
            "sidecar_admission_paced_turns",
            "Later turns of paced sessions (let in at max_wait without room) by how they went: room = the session "
            "fitted and is paced no more; timeout = it ran after paced_turn_max_wait without room.",
            ["outcome"],
            registry=registry,
        )
        self.paced_turn_wait = Histogram(
            "sidecar_admission_paced_turn_wait_seconds",
            "Seconds a paced session's later turn waited for room (part of its time to first token).",
            buckets=WAIT_BUCKETS,
            registry=registry,
        )
        self.paced_turns_waiting = Gauge(
            "sidecar_admission_paced_turns_waiting", "Later turns of paced sessions waiting for room.", registry=registry
        )
        self.resident_tokens = Gauge(
            "sidecar_resident_tokens", "KV tokens of sessions running or under an unexpired lease.", registry=registry
        )
        self.resident_projected_tokens = Gauge(
            "sidecar_resident_projected_tokens",
            "Resident sessions' tokens projected to their next turn (what admission compares).",
            registry=registry,
        )
        self.resident_sessions = Gauge(
            "sidecar_resident_sessions", "Sessions running or under an unexpired lease.", registry=registry
        )
        self.sessions = Gauge("sidecar_policy_sessions", "Sessions in the policy's table.", registry=registry)
        self.sessions_closed = Counter(
            "sidecar_policy_sessions_closed", "Sessions the policy asked to close, by reason.", ["reason"], registry=registry
        )
        for outcome in LEASE_OUTCOMES:
            self.lease_outcomes.labels(outcome)
        for decision in ADMISSION_DECISIONS:
            self.admission_decisions.labels(decision)
        for outcome in PACED_TURN_OUTCOMES:
            self.paced_turns.labels(outcome)
        for reason in CLOSE_REASONS:
            self.sessions_closed.labels(reason)

    def bind_workers(self, state) -> None:
        """Per-worker gauges read at scrape time; ``state()`` maps a worker to (resident tokens,
        leases, sessions)."""
        self._workers_state = state
        if not getattr(self, "_workers_bound", False):
            self._workers_bound = True
            self._registry.register(_WorkerCollector(lambda: self._workers_state()))

    def worker_admission(self, worker: str) -> None:
        self.worker_admissions.labels(worker=worker).inc()

    def bind_state(
        self,
        queue_length: Callable[[], float],
        resident: Callable[[], tuple[float, float, int]],
        sessions: Callable[[], float],
        paced_turns_waiting: Callable[[], float],
    ) -> None:
        """Gauges read at scrape time; ``resident`` returns (tokens, projected tokens, sessions)."""
        self.admission_queue_length.set_function(queue_length)
        self.paced_turns_waiting.set_function(paced_turns_waiting)
        self.resident_tokens.set_function(lambda: resident()[0])
        self.resident_projected_tokens.set_function(lambda: resident()[1])
        self.resident_sessions.set_function(lambda: resident()[2])
        self.sessions.set_function(sessions)

    def gap_predicted_at_turn_end(self, predicted_s: float) -> None:
        self.gap_predicted.observe(predicted_s)

    def gap_observed(self, actual_s: float, predicted_s: float | None) -> None:
        self.gap_actual.observe(actual_s)
        if predicted_s is None:
            return
        self.gap_abs_error.observe(abs(actual_s - predicted_s))
        if actual_s > 0 and predicted_s > 0:
            self.gap_error_log2.observe(math.log2(actual_s / predicted_s))

    def lease_granted(self, ttl_s: float) -> None:
        self.lease_ttl.observe(ttl_s)

    def lease_outcome(self, outcome: str, token_seconds: float = 0.0) -> None:
        self.lease_outcomes.labels(outcome).inc()
        if token_seconds > 0:
            self.leased_token_seconds.inc(token_seconds)

    def admission(self, decision: str, waited_s: float | None) -> None:
        self.admission_decisions.labels(decision).inc()
        if waited_s is not None:
            self.admission_wait.observe(waited_s)

    def paced_turn(self, had_room: bool, waited_s: float) -> None:
        self.paced_turns.labels("room" if had_room else "timeout").inc()
        self.paced_turn_wait.observe(waited_s)

    def session_closed(self, reason: str) -> None:
        self.sessions_closed.labels(reason).inc()


class _WorkerCollector:
    """``sidecar_worker_resident_tokens`` / ``_leases`` / ``_sessions`` per worker, at scrape time."""

    def __init__(self, state):
        self._state = state

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        tokens = GaugeMetricFamily("sidecar_worker_resident_tokens", "Tokens of the sessions resident on each worker.", labels=["worker"])
        leases = GaugeMetricFamily("sidecar_worker_leases", "Sessions holding a requested lease on each worker.", labels=["worker"])
        sessions = GaugeMetricFamily("sidecar_worker_sessions", "Open sessions placed on each worker.", labels=["worker"])
        for worker, (t, n_leases, n) in self._state().items():
            tokens.add_metric([worker], t)
            leases.add_metric([worker], n_leases)
            sessions.add_metric([worker], n)
        yield from (tokens, leases, sessions)
