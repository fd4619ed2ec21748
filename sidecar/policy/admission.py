"""Admission of new sessions: a FIFO-fair, bounded queue in front of the KV pool.

Rule: the session at the head of the queue may start when
    projected tokens of the resident sessions + its own projected tokens <= headroom * capacity,
or when nothing is resident (a lone session always runs, so the gate cannot deadlock), or when it
has waited ``max_wait`` seconds (if > 0; SGLang's own eviction then has the last word).
What "projected tokens" means (turns ahead, idle sessions' weight) is the caller's
``resident`` callback; LeasePolicy's is documented in ``sidecar.policy.lease_policy``.
Nobody overtakes the head. A full queue raises AdmissionRejected (the caller answers 429 with
Retry-After). Only new sessions' first requests come here; the caller lets the others through.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sidecar.policy.base import AdmissionRejected
from sidecar.policy.settings import AdmissionSettings

# (projected tokens of the resident sessions, number of resident sessions)
ResidentProjection = Callable[[], tuple[float, int]]


@dataclass(eq=False)
class _Waiter:
    session_id: str
    prompt_tokens: int
    tokens: int  # projected to the end of its next turn
    future: asyncio.Future
    enqueued_at: float


class AdmissionGate:
    def __init__(
        self,
        settings: AdmissionSettings,
        capacity_tokens: int,
        resident: ResidentProjection,
        grant: Callable[[str, int], None],  # (session id, prompt tokens): it runs from now on
        ungrant: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
        metrics=None,
    ):
        self.settings = settings
        self.capacity_tokens = capacity_tokens
        self._resident = resident
        self._grant = grant
        self._ungrant = ungrant
        self._clock = clock
        self._metrics = metrics
        self._queue: deque[_Waiter] = deque()
        self._mean_wait: float | None = None

    @property
    def queue_length(self) -> int:
        return len(self._queue)

    @property
    def budget_tokens(self) -> float:
        return self.settings.headroom * self.capacity_tokens

    def fits(self, tokens: int) -> bool:
        """Would a session of ``tokens`` projected tokens fit next to the resident ones now?"""
        if self.capacity_tokens <= 0:
            return True
        resident_tokens, resident_sessions = self._resident()
        if resident_sessions == 0:
            return True
        return resident_tokens + tokens <= self.budget_tokens

    def retry_after_s(self) -> float:
        """Retry-After for a rejected session: the recent mean wait, at least the setting."""
        return max(self.settings.retry_after, self._mean_wait or 0.0)

    async def wait(self, session_id: str, prompt_tokens: int, tokens: int) -> None:
        """Return once the session (``tokens`` projected) may start; AdmissionRejected if the queue is full."""
        if not self._queue and self.fits(tokens):
            self._grant(session_id, prompt_tokens)
            self._record("immediate", 0.0)
            return
        if len(self._queue) >= self.settings.max_queue:
            self._record("rejected", None)
            raise AdmissionRejected(self.retry_after_s())
        future = asyncio.get_running_loop().create_future()
        waiter = _Waiter(session_id, prompt_tokens, tokens, future, self._clock())
        self._queue.append(waiter)
        try:
            self.pump()
            while not waiter.future.done():
                try:
                    await asyncio.wait_for(asyncio.shield(waiter.future), self.settings.poll_interval)
                except TimeoutError:
                    self.pump()
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                self._ungrant(session_id)  # granted, but the client went away first
            else:
                waiter.future.cancel()
                if waiter in self._queue:
                    self._queue.remove(waiter)
                self._record("cancelled", None)
                self.pump()
            raise

    def pump(self) -> int:
        """Let waiters through from the head while they fit; returns how many went."""
        granted = 0
        now = self._clock()
        while self._queue:
            head = self._queue[0]
            if head.future.done():
                self._queue.popleft()
                continue
            waited = now - head.enqueued_at
            timed_out = self.settings.max_wait > 0 and waited >= self.settings.max_wait
            fits = self.fits(head.tokens)
            if not (fits or timed_out):
                break
            self._queue.popleft()
            self._grant(head.session_id, head.prompt_tokens)
            head.future.set_result(None)
            self._record("queued" if fits else "timeout", waited)
            granted += 1
        return granted

    def _record(self, decision: str, waited: float | None) -> None:
        if waited is not None and decision != "immediate":
            self._mean_wait = waited if self._mean_wait is None else 0.8 * self._mean_wait + 0.2 * waited
        if self._metrics is not None:
            self._metrics.admission(decision, waited)
