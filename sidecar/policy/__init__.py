"""Per-session policy: when may a session start, and how long should SGLang keep its KV.

The HTTP layer talks to a policy only through :class:`SessionPolicy`; the policy never touches
HTTP or SGLang. :func:`build_policy` picks the implementation from the settings.

Contract for the HTTP layer / session registry (all times ``time.monotonic()``):
  per request     ``await admit(sid, prompt_tokens, is_new_session)``   (AdmissionRejected -> 429)
                  ``on_request(sid, prompt_tokens, now)``
                  ``ttl = lease_ttl(sid, prompt_tokens, now)``  -> custom_params session_lease_ttl_s
                  ... engine turn ...
                  ``on_turn_end(TurnEnd(sid, prompt+output tokens, tool names, finished_at))``
                  ``release_admission(sid)``   (in finally, iff admit returned)
  every ~1 s      ``for sid in sessions_to_close(now)``: /close_session, then ``on_session_closed(sid)``
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from sidecar.policy.base import AdmissionRejected, EngineCapacity, TurnEnd

__all__ = [
    "AdmissionRejected",
    "EngineCapacity",
    "NullPolicy",
    "SessionPolicy",
    "TurnEnd",
    "build_policy",
]


class SessionPolicy(Protocol):
    async def admit(self, session_id: str, prompt_tokens: int, is_new_session: bool) -> None:
        """Wait until the request may go to the engine; raise AdmissionRejected if it may not queue."""

    def release_admission(self, session_id: str) -> None:
        """The request admitted by ``admit`` is over (finished, failed or aborted)."""

    def on_request(self, session_id: str, context_tokens: int, now: float) -> None:
        """A request of a session arrived (ends the gap that began at the last TurnEnd)."""

    def lease_ttl(self, session_id: str, context_tokens: int, now: float) -> float | None:
        """Seconds SGLang should keep this session's KV after the coming turn; None = no lease."""

    def on_turn_end(self, turn: TurnEnd) -> None:
        """A turn finished; the gap until the session's next request starts now."""

    def lease_expiry(self, session_id: str) -> float | None:
        """When SGLang's lease on the session's KV ends (time.monotonic clock); None = no lease."""

    def sessions_to_close(self, now: float) -> list[str]:
        """Idle sessions to close in SGLang now; each is reported once. Call periodically."""

    def on_session_closed(self, session_id: str) -> None:
        """The session was forgotten (closed in SGLang)."""


class NullPolicy:
    """No leases, no admission gate: the sidecar is a transparent session-aware proxy."""

    async def admit(self, session_id: str, prompt_tokens: int, is_new_session: bool) -> None:
        return None

    def release_admission(self, session_id: str) -> None:
        return None

    def on_request(self, session_id: str, context_tokens: int, now: float) -> None:
        return None

    def lease_ttl(self, session_id: str, context_tokens: int, now: float) -> float | None:
        return None

    def on_turn_end(self, turn: TurnEnd) -> None:
        return None

    def lease_expiry(self, session_id: str) -> float | None:
        return None

    def sessions_to_close(self, now: float) -> list[str]:
        return []

    def on_session_closed(self, session_id: str) -> None:
        return None


def build_policy(
    settings,
    capacity: EngineCapacity,
    *,
    registry=None,
    clock: Callable[[], float] = time.monotonic,
) -> SessionPolicy:
    """The policy the settings ask for. ``settings`` is the whole SidecarSettings.

    Always a LeasePolicy (mode=off still tracks sessions, closes idle ones and reports metrics);
    ``registry`` is the prometheus CollectorRegistry the sidecar's /metrics serves.
    """
    from sidecar.policy.lease_policy import LeasePolicy

    return LeasePolicy(
        settings.policy,
        settings.admission,
        capacity,
        max_sessions=settings.server.max_sessions,
        idle_grace_s=settings.server.session_idle_grace,
        registry=registry,
        clock=clock,
    )
