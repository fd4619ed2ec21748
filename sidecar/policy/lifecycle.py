"""The policy's session table and when an idle session is closed.

Rule: a session with no request in flight is due for closing once
    now >= max(last activity, lease expiry) + idle grace;
it is then closed in SGLang by the caller and forgotten. The table holds at most
``max_sessions``; beyond that the least recently active idle session is dropped (and also
reported for closing). A closed session's open gap is remembered (bounded the same way) so that,
if the session comes back after all, the predictor learns the true gap instead of the censored one.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from sidecar.policy.predictor import CensoredMark, SessionGapStats


@dataclass
class SessionState:
    session_id: str
    last_active: float
    context_tokens: int = 0  # tokens the session holds in KV (prompt, then prompt + output)
    in_flight: int = 0  # admitted requests not yet released
    last_prompt_tokens: int | None = None  # prompt of the latest request (for growth learning)
    request_started_at: float | None = None  # arrival of the latest request (service and cycle times)
    # the open gap: the reply ended at turn_ended_at and the next request has not come yet
    turn_ended_at: float | None = None
    turn_tools: tuple[str, ...] = ()
    predicted_gap_s: float | None = None
    # the lease: the TTL sent with the running request, then its expiry once the turn ended
    pending_ttl: float | None = None
    lease_expires_at: float | None = None
    closing: bool = False  # reported by sessions_to_close, not yet confirmed closed
    gap_stats: SessionGapStats = field(default_factory=SessionGapStats)
    censored: CensoredMark | None = None  # set when the open gap was learned as censored at close

    def is_resident(self, now: float) -> bool:
        """Its KV is in use or leased: running, or idle under an unexpired lease."""
        return self.in_flight > 0 or (self.lease_expires_at is not None and now < self.lease_expires_at)

    def idle_since(self) -> float:
        """When the session stopped needing its KV: last activity or lease expiry, the later."""
        if self.lease_expires_at is None:
            return self.last_active
        return max(self.last_active, self.lease_expires_at)


class SessionTable:
    def __init__(self, max_sessions: int, idle_grace_s: float):
        self.max_sessions = max_sessions
        self.idle_grace_s = idle_grace_s
        self._sessions: OrderedDict[str, SessionState] = OrderedDict()
        self._dropped: list[SessionState] = []
        self._closed: OrderedDict[str, SessionState] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def __iter__(self):
        return iter(list(self._sessions.values()))

    def get(self, session_id: str) -> SessionState | None:
        return self._sessions.get(session_id)

    def get_or_create(
        self, session_id: str, now: float, reopened: SessionState | None = None
    ) -> SessionState:
        """The session's state, created if new (from ``reopened``'s gap, if given); marks it most recently active."""
        state = self._sessions.get(session_id)
        if state is None:
            state = SessionState(session_id=session_id, last_active=now)
            if reopened is not None:
                state.gap_stats = reopened.gap_stats
                state.context_tokens = reopened.context_tokens
                state.turn_ended_at = reopened.turn_ended_at
                state.turn_tools = reopened.turn_tools
                state.predicted_gap_s = reopened.predicted_gap_s
                state.censored = reopened.censored
            self._sessions[session_id] = state
            self._enforce_bound(keep=session_id)
        self._sessions.move_to_end(session_id)
        return state

    def pop(self, session_id: str) -> SessionState | None:
        return self._sessions.pop(session_id, None)

    def remember_closed(self, state: SessionState) -> None:
        """Keep a closed session's open gap (with its censored mark) in case it comes back."""
        self._closed[state.session_id] = state
        self._closed.move_to_end(state.session_id)
        while len(self._closed) > self.max_sessions:
            self._closed.popitem(last=False)

    def reopen(self, session_id: str, now: float, horizon_s: float) -> SessionState | None:
        """A closed session's remembered state, if it closed its gap less than ``horizon_s`` ago."""
        state = self._closed.pop(session_id, None)
        if state is None or state.turn_ended_at is None or now - state.turn_ended_at > horizon_s:
            return None
        return state

    def take_dropped(self) -> list[SessionState]:
        """Sessions dropped to keep the table bounded since the last call."""
        dropped, self._dropped = self._dropped, []
        return dropped

    def resident(self, now: float) -> list[SessionState]:
        return [s for s in self._sessions.values() if s.is_resident(now)]

    def due_for_close(self, now: float) -> list[SessionState]:
        """Idle sessions past their lease (or last activity) plus the grace, not already reported."""
        return [
            s
            for s in self._sessions.values()
            if s.in_flight == 0 and not s.closing and now >= s.idle_since() + self.idle_grace_s
        ]

    def _enforce_bound(self, keep: str) -> None:
        excess = len(self._sessions) - self.max_sessions
        if excess <= 0:
            return
        for session_id in list(self._sessions):
            if excess <= 0:
                break
            state = self._sessions[session_id]
            if state.in_flight == 0 and session_id != keep:
                del self._sessions[session_id]
                self._dropped.append(state)
                excess -= 1
