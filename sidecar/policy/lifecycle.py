"""The policy's record of one session, and when an idle session is closed.

Sessions live in one store (``sidecar.conversation.store``); each holds a :class:`SessionRecord`,
which only the policy reads and writes. The policy finds them through :class:`SessionRecords`.

Rule: a session with no request running is due for closing once
    now >= max(last activity, lease expiry) + idle grace;
the store then forgets it (and releases its lease in SGLang). A closed session's open gap is
remembered (:class:`ClosedSessions`, bounded like the store) so that, if the session comes back
after all, the predictor learns the true gap instead of the censored one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from sidecar.policy.predictor import CensoredMark, SessionGapStats
from sidecar.policy.shared_prefix import Share


@dataclass(eq=False)
class SessionRecord:
    session_id: str
    last_active: float
    context_tokens: int = 0  # tokens the session holds in KV (prompt, then prompt + output)
    running: int = 0  # admitted requests not yet released
    turns: int = 0  # turns it finished since it was opened (what shrinks its projection)
    worker: str | None = None  # the worker it was placed on (its KV is there); None: not placed yet
    last_prompt_tokens: int | None = None  # prompt of the latest request (for growth learning)
    request_started_at: float | None = None  # arrival of the latest request (service and cycle times)
    # the open gap: the reply ended at turn_ended_at and the next request has not come yet
    turn_ended_at: float | None = None
    turn_tools: tuple[str, ...] = ()
    predicted_gap_s: float | None = None
    # the lease the sidecar asks SGLang for: the TTL sent with the running request, then the
    # expiry it expects once the turn ended (SGLang's plugin holds the real lease)
    pending_ttl: float | None = None
    lease_expires_at: float | None = None
    gap_stats: SessionGapStats = field(default_factory=SessionGapStats)
    censored: CensoredMark | None = None  # set when the open gap was learned as censored at close
    share: Share | None = None  # the leading tokens it shares with other open sessions (held once)
    paced: bool = False  # let in without room: its later turns wait for room (``paced_turn_max_wait``)

    def is_resident(self, now: float) -> bool:
        """Its KV is in use or leased: running, or idle under an unexpired lease."""
        return self.running > 0 or (self.lease_expires_at is not None and now < self.lease_expires_at)

    def holds_kv(self) -> bool:
        """A turn of it finished: the engine has its KV (somewhere in its cache tiers)."""
        return self.turn_ended_at is not None and self.context_tokens > 0

    def idle_since(self) -> float:
        """When the session stopped needing its KV: last activity or lease expiry, the later."""
        if self.lease_expires_at is None:
            return self.last_active
        return max(self.last_active, self.lease_expires_at)

    def due_for_close(self, now: float, idle_grace_s: float) -> bool:
        return self.running == 0 and now >= self.idle_since() + idle_grace_s


class SessionRecords(Protocol):
    """Where the policy finds its records: the session store."""

    def record(self, session_id: str) -> SessionRecord | None: ...

    def records(self) -> Iterable[SessionRecord]: ...

    def __len__(self) -> int: ...


class ClosedSessions:
    """Records of closed sessions with an open gap (and its censored mark), in case they come back."""

    def __init__(self, max_sessions: int):
        self.max_sessions = max_sessions
        self._closed: OrderedDict[str, SessionRecord] = OrderedDict()

    def remember(self, record: SessionRecord) -> None:
        self._closed[record.session_id] = record
        self._closed.move_to_end(record.session_id)
        while len(self._closed) > self.max_sessions:
            self._closed.popitem(last=False)

    def reopen(self, session_id: str, now: float, horizon_s: float) -> SessionRecord | None:
        """A fresh record carrying a closed session's open gap, if that gap began less than
        ``horizon_s`` ago."""
        old = self._closed.pop(session_id, None)
        if old is None or old.turn_ended_at is None or now - old.turn_ended_at > horizon_s:
            return None
        return SessionRecord(
            session_id=session_id,
            last_active=now,
            context_tokens=old.context_tokens,
            turn_ended_at=old.turn_ended_at,
            turn_tools=old.turn_tools,
            predicted_gap_s=old.predicted_gap_s,
            gap_stats=old.gap_stats,
            censored=old.censored,
        )
