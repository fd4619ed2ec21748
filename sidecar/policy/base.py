"""The values the turn core and the policy exchange (re-exported by ``sidecar.policy``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sidecar.engine.lease import LeaseRequest  # noqa: F401  (re-exported: the policy returns it)


class AdmissionRejected(Exception):
    """The admission queue (or the key's share of it) is full: the caller answers 429 with Retry-After."""

    def __init__(self, retry_after_s: float, message: str | None = None, code: str = "admission_queue_full"):
        super().__init__(message or f"admission queue full; retry after {retry_after_s:.1f} s")
        self.retry_after_s = retry_after_s
        self.code = code  # the 429's error code


@dataclass
class TurnEnd:
    """A finished turn, as the policy sees it."""

    session_id: str
    context_tokens: int  # prompt + output tokens the session now holds in KV
    tool_names: list[str] = field(default_factory=list)  # tools the reply asked for ([] = none)
    finished_at: float = 0.0  # time.monotonic() when the reply ended

