"""The sidecar's own Prometheus metrics, on a registry of their own (served at GET /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class SidecarMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter("sidecar_requests", "HTTP requests by route and status", ["route", "status"], registry=r)
        self.turns = Counter(
            "sidecar_turns", "Chat turns by how the session was found: continued, new, branch", ["kind"], registry=r
        )
        self.prompt_tokens = Counter("sidecar_prompt_tokens", "Prompt tokens sent to SGLang", registry=r)
        self.cached_tokens = Counter("sidecar_cached_tokens", "Prompt tokens SGLang served from cache", registry=r)
        self.completion_tokens = Counter("sidecar_completion_tokens", "Tokens generated", registry=r)
        self.sessions = Gauge("sidecar_sessions", "Sessions the sidecar remembers", registry=r)
        self.session_bytes = Gauge(
            "sidecar_session_bytes", "Bytes the remembered sessions' turn states take (token ids)", registry=r
        )
        self.sessions_closed = Counter("sidecar_sessions_closed", "Sessions closed in SGLang and forgotten", ["reason"], registry=r)
        self.latency = Histogram(
            "sidecar_request_seconds",
            "Time from request to last byte, by route",
            ["route"],
            buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
            registry=r,
        )
