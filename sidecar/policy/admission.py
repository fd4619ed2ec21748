"""Admission of new sessions: a FIFO-fair, bounded queue in front of the KV pool.

Rule: the session at the head of the queue may start when
    projected tokens of the resident sessions + its own projected tokens <= headroom * capacity,
or when nothing is resident (a lone session always runs, so the gate cannot deadlock), or when it
has waited ``max_wait`` seconds (if > 0; SGLang's own eviction then has the last word).
The rule itself lives in one place, the ``Placement`` (``sidecar.policy.placement``: one pool, or
the worker with most room); what "projected tokens" means (turns ahead, idle sessions' weight) is
LeasePolicy's, documented in ``sidecar.policy.lease_policy``.
Nobody overtakes the head. A full queue raises AdmissionRejected (the caller answers 429 with
Retry-After). Only new sessions' first requests come here; the caller lets the others through.

``AdmissionQueue`` makes every decision synchronously (offer, pump, cancel) on the injected
clock, so a virtual-time replay drives the same code as the server; ``AdmissionGate`` adds the
asyncio wait the HTTP layer awaits.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from sidecar.policy.base import AdmissionRejected
from sidecar.policy.settings import AdmissionSettings

# (projected tokens of the resident sessions, number of resident sessions)
class Placement(Protocol):
    """Where a session of ``tokens`` projected tokens fits (``choose``: a worker, or None when it
    fits nowhere; ``force``: the roomiest anyway), and where a grant puts it (``assign``).
    ``placement.OnePool`` is the single-pool case."""

    def choose(self, tokens: float, force: bool = False) -> str | None: ...

    def assign(self, session_id: str, worker: str) -> None: ...


@dataclass(eq=False)
class AdmissionTicket:
    """One session's request to start, from offer to grant (or cancel)."""

    session_id: str
    prompt_tokens: int
    tokens: float  # projected to the end of its next turn
    enqueued_at: float | None = None  # None: it never queued
    state: Literal["waiting", "granted", "cancelled"] = "waiting"
    # runs once, right after the grant (inside offer or pump); the request may start from then on
    on_grant: Callable[[], None] | None = None

    @property
    def granted(self) -> bool:
        return self.state == "granted"

    @property
    def waiting(self) -> bool:
        return self.state == "waiting"


class AdmissionQueue:
    """The admission decisions, without an event loop: time passes through ``clock`` and
    whoever changes the resident sessions calls ``pump``."""

    def __init__(
        self,
        settings: AdmissionSettings,
        placement: Placement,
        grant: Callable[[str, int], None],  # (session id, prompt tokens): it runs from now on
        ungrant: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
        metrics=None,
    ):
        self.settings = settings
        self.placement = placement
        self._grant = grant
        self._ungrant = ungrant
        self._clock = clock
        self._metrics = metrics
        self._queue: deque[AdmissionTicket] = deque()
        self._mean_wait: float | None = None

    @property
    def queue_length(self) -> int:
        return len(self._queue)

    def retry_after_s(self) -> float:
        """Retry-After for a rejected session: the recent mean wait, at least the setting."""
        return max(self.settings.retry_after, self._mean_wait or 0.0)

    def offer(
        self,
        session_id: str,
        prompt_tokens: int,
        tokens: float,
        on_grant: Callable[[], None] | None = None,
    ) -> AdmissionTicket:
        """A new session (``tokens`` projected) asks to start: granted now when nobody waits and
        it fits, else queued (granted by a later ``pump``); AdmissionRejected if the queue is full."""
        ticket = AdmissionTicket(session_id, prompt_tokens, tokens, on_grant=on_grant)
        worker = None if self._queue else self.placement.choose(tokens)
        if worker is not None:
            self._admit(ticket, "immediate", 0.0, worker)
            return ticket
        if len(self._queue) >= self.settings.max_queue:
            self._record("rejected", None)
            raise AdmissionRejected(self.retry_after_s())
        ticket.enqueued_at = self._clock()
        self._queue.append(ticket)
        self.pump()
        return ticket

    def let_through(
        self, session_id: str, prompt_tokens: int, on_grant: Callable[[], None] | None = None
    ) -> AdmissionTicket:
        """A request the gate does not hold (a continuing session, admission off): granted now,
        not counted as an admission decision."""
        ticket = AdmissionTicket(session_id, prompt_tokens, prompt_tokens, on_grant=on_grant)
        self._admit(ticket, None, None, None)
        return ticket

    def next_deadline(self) -> float | None:
        """When the head of the queue reaches ``max_wait`` (None: nobody waits, or no limit).
        Whoever drives the queue must pump at this time, not at its next periodic pass, or the
        wait overshoots ``max_wait`` by up to one period."""
        if not self._queue or self.settings.max_wait <= 0:
            return None
        return self._queue[0].enqueued_at + self.settings.max_wait

    def pump(self) -> int:
        """Let waiters through from the head while they fit or have waited ``max_wait``;
        returns how many went. Call it when time passed or the resident sessions changed."""
        granted = 0
        now = self._clock()
        while self._queue:
            head = self._queue[0]
            waited = now - head.enqueued_at
            timed_out = self.settings.max_wait > 0 and waited >= self.settings.max_wait
            worker = self.placement.choose(head.tokens)
            if worker is None and not timed_out:
                break
            self._queue.popleft()
            if worker is not None:
                self._admit(head, "queued", waited, worker)
            else:  # waited long enough: the roomiest worker (SGLang's eviction has the last word)
                self._admit(head, "timeout", waited, self.placement.choose(head.tokens, force=True))
            granted += 1
        return granted

    def cancel(self, ticket: AdmissionTicket) -> None:
        """The session gave up: a waiting ticket leaves the queue (the next may go now); a granted
        one is ungranted (its request will not run). A cancelled ticket stays cancelled."""
        if ticket.granted:
            ticket.state = "cancelled"
            self._ungrant(ticket.session_id)
        elif ticket.waiting:
            ticket.state = "cancelled"
            if ticket in self._queue:
                self._queue.remove(ticket)
            self._record("cancelled", None)
            self.pump()

    def _admit(self, ticket: AdmissionTicket, decision: str | None, waited: float | None, worker: str | None) -> None:
        if worker is not None:  # a gated session starts on the worker it fits (or was forced onto)
            self.placement.assign(ticket.session_id, worker)
        self._grant(ticket.session_id, ticket.prompt_tokens)
        ticket.state = "granted"
        if decision is not None:
            self._record(decision, waited)
        if ticket.on_grant is not None:
            ticket.on_grant()

    def _record(self, decision: str, waited: float | None) -> None:
        if waited is not None and decision != "immediate":
            self._mean_wait = waited if self._mean_wait is None else 0.8 * self._mean_wait + 0.2 * waited
        if self._metrics is not None:
            self._metrics.admission(decision, waited)


class AdmissionGate(AdmissionQueue):
    """``AdmissionQueue`` for asyncio callers: ``wait`` returns once the session may start."""

    async def wait(self, session_id: str, prompt_tokens: int, tokens: float) -> None:
        """Return once the session (``tokens`` projected) may start; AdmissionRejected if the queue is full."""
        await self.until_granted(self.offer(session_id, prompt_tokens, tokens))

    async def until_granted(self, ticket: AdmissionTicket) -> None:
        """Wait for ``ticket``'s grant, pumping every ``poll_interval`` (leases expire) and at the
        head's ``max_wait`` deadline exactly; cancelling the wait cancels the ticket."""
        if ticket.granted:
            return
        granted = asyncio.get_running_loop().create_future()
        ticket.on_grant = lambda: granted.done() or granted.set_result(None)
        try:
            while ticket.waiting:
                try:
                    await asyncio.wait_for(asyncio.shield(granted), self._next_wake_in())
                except TimeoutError:
                    self.pump()
        except asyncio.CancelledError:
            self.cancel(ticket)  # still queued: it leaves; granted meanwhile: ungranted
            raise

    def _next_wake_in(self) -> float:
        """Seconds to the next pump: the poll interval, or less when the head's deadline is sooner."""
        deadline = self.next_deadline()
        wake = self.settings.poll_interval
        if deadline is not None:
            wake = min(wake, max(0.0, deadline - self._clock()))
        return wake
