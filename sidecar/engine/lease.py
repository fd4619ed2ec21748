"""The lease a request asks SGLang's session_ttl plugin for, in the sidecar's words (the policy
decides it; :mod:`sidecar.engine.generate` puts it on the wire)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LeaseRequest:
    """What a request asks SGLang's plugin for: keep the KV ``ttl_s`` seconds after the turn, and
    when the session is expected back (seconds after the turn ends) with how much earlier it may
    come, so that with a host tier the plugin locks the KV only around the return and loads it
    back from host just before it (prefetch)."""

    ttl_s: float
    expected_back_s: float | None = None
    spread_s: float | None = None
