"""Where a new session goes when several workers serve: the worker with the most room for its
projected footprint (GPU + host tier of that worker, minus what its resident sessions are
projected to need). Pure data in, a worker's name out: no HTTP, no session table.

A session then stays on its worker (its KV is there); only a worker's loss moves it (the turn core
re-homes it, with a full recompute on the new worker).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerRoom:
    """One worker as placement sees it."""

    worker: str
    budget_tokens: float  # headroom x (GPU + host tokens); 0 = capacity not known yet
    projected_tokens: float  # what its resident sessions are projected to need
    sessions: int  # its resident sessions

    @property
    def free_tokens(self) -> float:
        return self.budget_tokens - self.projected_tokens

    def fits(self, tokens: float) -> bool:
        """The gate's rule on one worker: unknown capacity or nothing resident always fits (a lone
        session always runs, so the gate cannot deadlock), else the projection must fit the budget."""
        return self.budget_tokens <= 0 or self.sessions == 0 or self.projected_tokens + tokens <= self.budget_tokens


def choose_worker(rooms: list[WorkerRoom], tokens: float, force: bool = False) -> str | None:
    """The worker a session of ``tokens`` projected tokens starts on: among those it fits, the one
    with the most free tokens (ties: fewer sessions, then the order given); None when it fits
    nowhere, unless ``force`` (it waited long enough, or admission is off): then the roomiest.
    Workers whose capacity is still unknown are used only when none is known."""
    known = [r for r in rooms if r.budget_tokens > 0] or rooms
    candidates = known if force else [r for r in known if r.fits(tokens)]
    if not candidates:
        return None
    order = {r.worker: i for i, r in enumerate(known)}
    best = max(candidates, key=lambda r: (r.free_tokens if r.budget_tokens > 0 else 0.0, -r.sessions, -order[r.worker]))
    return best.worker


class OnePool:
    """The placement of a single KV pool (one worker, or a caller that keeps no workers): the same
    fit rule as ``WorkerRoom.fits``, over ``resident()`` = (projected tokens, sessions)."""

    def __init__(self, budget_tokens: Callable[[], float], resident: Callable[[], tuple[float, int]]):
        self.budget_tokens = budget_tokens
        self.resident = resident

    def choose(self, tokens: float, force: bool = False) -> str | None:
        projected, sessions = self.resident()
        return choose_worker([WorkerRoom("", self.budget_tokens(), projected, sessions)], tokens, force)

    def assign(self, session_id: str, worker: str) -> None:
        """One pool: nothing to record."""
