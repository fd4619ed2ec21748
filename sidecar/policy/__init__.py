"""Per-session policy: when may a session start, and how long should SGLang keep its KV.

The turn core talks to a policy only through :class:`SessionPolicy`; the policy never touches
HTTP or SGLang, and keeps no session table of its own: each session's :class:`SessionRecord`
lives in the session store, which binds itself to the policy. :func:`build_policy` builds it
from the settings.

Contract (all times ``time.monotonic()``):
  store           ``bind(store)`` once; ``new_record(sid)`` for each session it opens;
                  ``on_session_closed(record, reason)`` for each session it forgets
  per request     ``await admit(sid, prompt_tokens, is_new_session, scope, prompt_ids)``   (AdmissionRejected -> 429)
                  ``on_request(sid, prompt_tokens, now)``
                  ``lease = lease_request(sid, prompt_tokens, now)``  -> the lease the request asks
                                                 SGLang for (TTL + expected return), or None
                  ... engine turn ...
                  ``on_turn_end(TurnEnd(sid, prompt+output tokens, tool names, finished_at))``
                  ``after_turn(sid, now)``  -> the lease revised now that the reply's tools are
                                               known; if sent (the plugin's after-turn channel),
                                               ``lease_revised(sid, lease, now)``
                  ``release_admission(sid)``   (in finally, iff admit returned)
  every ~1 s      ``sessions_to_close(now)``: the store forgets those (releasing their leases)
  engine info     ``set_capacity(capacity, worker)`` whenever a worker reports (again) what it holds;
                  ``set_placeable(worker, bool)`` as workers go down, leave or come back
  placement       after ``admit``, ``worker_of(sid)`` names the session's worker;
                  ``relocate(sid, worker)`` when its KV moved (None: its worker was lost)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

from sidecar.engine.capacity import EngineCapacity
from sidecar.policy.base import AdmissionRejected, LeaseRequest, TurnEnd
from sidecar.policy.lifecycle import SessionRecord, SessionRecords

__all__ = [
    "AdmissionRejected",
    "EngineCapacity",
    "LeaseRequest",
    "SessionPolicy",
    "SessionRecord",
    "TurnEnd",
    "build_policy",
]


class SessionPolicy(Protocol):
    def bind(self, sessions: SessionRecords) -> None:
        """The records the policy decides on (the session store's)."""

    def new_record(self, session_id: str) -> SessionRecord:
        """The record of a session the store opens."""

    async def admit(self, session_id: str, prompt_tokens: int, is_new_session: bool, scope: str = "",
                    prompt_ids: Sequence[int] | None = None) -> None:
        """Wait until the request may go to the engine; raise AdmissionRejected if it may not queue
        (``scope``: the key it came with; keys are served in turn, each within its share;
        ``prompt_ids``: the prompt, whose prefix shared with open sessions counts once)."""

    def release_admission(self, session_id: str) -> None:
        """The request admitted by ``admit`` is over (finished, failed or aborted)."""

    def on_request(self, session_id: str, context_tokens: int, now: float) -> None:
        """A request of a session arrived (ends the gap that began at the last TurnEnd)."""

    def lease_request(self, session_id: str, context_tokens: int, now: float) -> LeaseRequest | None:
        """What SGLang should keep of this session's KV after the coming turn; None = no lease."""

    def after_turn(self, session_id: str, now: float) -> LeaseRequest | None:
        """The finished turn's lease revised from ``now`` (its tools are known); None = no change."""

    def lease_revised(self, session_id: str, lease: LeaseRequest, now: float) -> None:
        """The revised lease went to the engine."""

    def set_capacity(self, capacity: EngineCapacity, worker: str | None = None) -> None:
        """What a worker holds, as it reported it (again); a new name is a worker that joined."""

    def set_placeable(self, worker: str, placeable: bool) -> None:
        """New sessions may (no longer) be placed on ``worker``."""

    def relocate(self, session_id: str, worker: str | None) -> None:
        """The session's KV is on ``worker`` now (a turn was served there); None: its worker was
        lost, and its next request is placed afresh."""

    def worker_of(self, session_id: str) -> str | None:
        """The worker the session was placed on (admission or a forced placement decided)."""

    def on_turn_end(self, turn: TurnEnd) -> None:
        """A turn finished; the gap until the session's next request starts now."""

    def sessions_to_close(self, now: float) -> list[str]:
        """Idle sessions to forget now. Call periodically."""

    def on_session_closed(self, record: SessionRecord, reason: str) -> None:
        """The store forgot the session."""


def build_policy(
    settings,
    capacity: EngineCapacity,
    *,
    registry=None,
    clock: Callable[[], float] = time.monotonic,
    worker: str = "",
) -> SessionPolicy:
    """The policy the settings ask for. ``settings`` is the whole SidecarSettings; the policy reads
    its [policy] and [admission] sections, and from [server] the idle grace, how many closed
    sessions to remember (max_sessions) and each key's share of the admission queue.

    Always a LeasePolicy (mode=off still closes idle sessions and reports metrics); ``registry``
    is the prometheus CollectorRegistry the sidecar's /metrics serves.
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
        worker=worker,
        key_queue_share=settings.server.key_queue_share,
    )
