"""Admission of new sessions: a bounded queue in front of the KV pools, fair across keys.

Who is gated: a new session's first request, and only with ``[admission] enabled``; with a host
tier and ``paced_turn_max_wait`` also the later turns of a paced session (one let in at ``max_wait``
without room); every other request is let through at once (``LeasePolicy.offer_admission``). The
turn core answers a rejection (``AdmissionRejected``) with 429 + Retry-After.

The rule: the session at the head of the queue starts on a worker (``placement.choose_worker``,
the roomiest that fits) when
    projected tokens of that worker + the session's own projection
        <= GPU + host tokens - (1 - headroom) x GPU tokens  [+ the overflow ``host_tier_recompute_share`` allows],
or when the worker has nothing resident (a lone session always runs, so the gate cannot deadlock),
or when it has waited ``max_wait`` seconds (then on the roomiest worker; SGLang's eviction has the
last word). With ``host_tier_capacity = distinct`` the budget counts GPU + host without the pages
write-through holds twice (``EngineCapacity.distinct_hierarchy_tokens``). What is counted
(``projection.Projection.projected`` over ``residency.Residency``):
    a new session   its prompt + growth per turn x turns ahead (``Projection.turns_ahead``: with a
                    host tier ``host_tier_projection_turns`` or, with ``learn_session_turns``, the
                    mean length of the sessions that ended; else the turns of
                    ``projection_horizon_s`` at the learned turn cycle, or ``projection_turns``);
    with a host tier every open session holding KV, as measured (its context) + growth per turn x
                    ``host_tier_projection_turns`` until it closes, or with ``host_tier_projection
                    = remaining`` x the turns it has left of them, at least one (a session near its
                    end adds little more, so the next wave may start while the first finishes), or
                    with ``peak`` the most all of them and the new one hold at once, each growing
                    until its turns are done and then gone (``Projection.peak``); a session between
                    turns x its duty cycle with ``host_tier_idle_weight = duty_cycle``; a prefix
                    open sessions share (an agent deployment's system prompt and tools) once,
                    as SGLang's radix tree and host tier hold it (``shared_prefix``). The overflow
                    allowed: the tokens whose loss, taken from the sessions between turns that
                    return last and recomputed as they return, costs at most
                    ``host_tier_recompute_share`` of the engine's time (``Projection.overflow_tokens``;
                    before any turn has ended, priced from the priors at the projected peak, so a
                    wave of agents starting together is not held for an overshoot that costs less
                    than their wait);
    without one     the resident sessions (running, or idle under an unexpired lease): context +
                    growth x turns ahead, an idle one weighted by its duty cycle with ``idle_weight
                    = duty_cycle`` (service / (service + predicted remaining gap): leased KV of an
                    agent out for 5 s is needed ~1/5 of the time; the plugin's leased-fraction bound
                    and pressure valve give it up when running requests need the room).

Paced turns: where the door's ``max_wait`` lets a session in that does not fit, it would thrash
the admitted ones (on the 48-agent overload at ratio 1, 20 first turns let in at 60 s recomputed
41 % of all history). Such a session is paced: each later turn waits, first in first out and before
any new session, until the session fits the budget counted at its remaining growth
(``Placement.resume``, no overflow: then it is admitted like any other) or ``paced_turn_max_wait``
(then that turn runs and the session stays paced). While paced it counts at its context only: it
grows a turn at a time. New sessions wait behind a paced turn waiting at the gate, and behind a paced
session back within ``paced_turn_max_wait`` of its last turn (``Placement``); one away longer (a long
tool call, or gone without closing) holds nobody back. Where the door never lets a session in
without room (every ratio-3 run) no session is paced and nothing changes. Metrics:
``sidecar_admission_paced_turns_total{outcome}``, ``sidecar_admission_paced_turn_wait_seconds``,
``sidecar_admission_paced_turns_waiting``.

Order: keys are served round-robin (a key = an API key's scope; without auth every session has the
same one, and the queue is plain FIFO): the next session to go is the head of the key whose turn it
is, and nobody overtakes that head. A key holds at most ``key_share`` of ``max_queue``; when the
queue is full, a key holding less than the largest key takes the place of that key's newest waiter
(which gets AdmissionRejected), so N flooding keys cannot refuse another key's new session nor make
it wait behind all of theirs.

``AdmissionQueue`` makes every decision synchronously (offer, pump, cancel) on the injected clock,
so a virtual-time replay drives the same code as the server; ``AdmissionGate`` adds the asyncio
wait the turn core awaits.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from sidecar.policy.base import AdmissionRejected
from sidecar.policy.settings import AdmissionSettings
from sidecar.policy.shared_prefix import Share


class Placement(Protocol):
    """Where a session of ``tokens`` projected tokens fits: a worker, or None when it fits nowhere
    (``force``: the roomiest anyway; ``share``: the prefix it shares with open sessions, held once).
    ``sidecar.policy.placement.Placement`` is the product's."""

    def choose(self, tokens: float, force: bool = False, share: Share | None = None) -> str | None: ...

    def resume(self, session_id: str, worker: str | None) -> bool:
        """A paced session's next turn has room on its worker."""


@dataclass(eq=False)
class AdmissionTicket:
    """One session's request to start, from offer to grant (or cancel, or rejection)."""

    session_id: str
    prompt_tokens: int
    tokens: float  # projected to the end of its next turns
    scope: str = ""  # the key it came with
    share: Share | None = None  # the prefix it shares with open sessions (counted once)
    paced_turn: bool = False  # a paced session's later turn (``worker``: where its KV is)
    worker: str | None = None
    enqueued_at: float | None = None  # None: it never queued
    state: Literal["waiting", "granted", "cancelled", "rejected"] = "waiting"
    # runs once, right after the grant (inside offer or pump); the request may start from then on
    on_grant: Callable[[], None] | None = None
    # a waiting ticket gave its place to another key's session: it will not start
    on_reject: Callable[[], None] | None = None
    retry_after_s: float = 0.0

    @property
    def granted(self) -> bool:
        return self.state == "granted"

    @property
    def waiting(self) -> bool:
        return self.state == "waiting"


class AdmissionQueue:
    """The admission decisions, without an event loop: time passes through ``clock`` and whoever
    changes the residency calls ``pump``."""

    def __init__(
        self,
        settings: AdmissionSettings,
        placement: Placement,
        grant: Callable[[str, int, str | None], None],  # (session, prompt tokens, worker): it runs from now on
        ungrant: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
        metrics=None,
        key_share: float = 1.0,
        on_room: Callable[[str, bool], None] | None = None,
    ):
        """``on_room(session, had_room)``: a gated request was let through, with room or (False) at
        its wait limit without: the policy paces the session from then on, or stops pacing it."""
        self.settings = settings
        self.placement = placement
        self._grant = grant
        self._ungrant = ungrant
        self._clock = clock
        self._metrics = metrics
        self.key_limit = max(1, math.floor(key_share * settings.max_queue))
        self._keys: dict[str, deque[AdmissionTicket]] = {}  # waiting tickets by key, in serving order
        self._length = 0
        self._paced: deque[AdmissionTicket] = deque()  # paced sessions' later turns, first in first out
        self._on_room = on_room
        self._mean_wait: float | None = None

    @property
    def queue_length(self) -> int:
        return self._length

    @property
    def turns_waiting(self) -> int:
        """Later turns of paced sessions waiting for room."""
        return len(self._paced)

    def waiting_of(self, scope: str) -> int:
        """New sessions of ``scope`` waiting now."""
        queue = self._keys.get(scope)
        return len(queue) if queue else 0

    def retry_after_s(self) -> float:
        """Retry-After for a rejected session: the recent mean wait, at least the setting."""
        return max(self.settings.retry_after, self._mean_wait or 0.0)

    def offer(
        self,
        session_id: str,
        prompt_tokens: int,
        tokens: float,
        on_grant: Callable[[], None] | None = None,
        scope: str = "",
        share: Share | None = None,
    ) -> AdmissionTicket:
        """A new session (``tokens`` projected; ``share``: the prefix it shares with open sessions)
        asks to start: granted now when nobody waits and it fits, else queued (granted by a later
        ``pump``); AdmissionRejected if its key's share or the queue is full."""
        ticket = AdmissionTicket(session_id, prompt_tokens, tokens, scope, share, on_grant=on_grant)
        worker = None if self._length or self._paced else self.placement.choose(tokens, share=share)
        if worker is not None:
            self._admit(ticket, "immediate", 0.0, worker)
            return ticket
        own = self.waiting_of(scope)
        if scope and own >= self.key_limit:
            self._record("rejected", None)
            raise AdmissionRejected(
                self.retry_after_s(),
                f"this key already has {own} new sessions waiting for admission (its share of the queue)",
                "key_queue_share_exceeded",
            )
        if self._length >= self.settings.max_queue and not self._displace_for(scope):
            self._record("rejected", None)
            raise AdmissionRejected(self.retry_after_s())
        ticket.enqueued_at = self._clock()
        self._keys.setdefault(scope, deque()).append(ticket)
        self._length += 1
        self.pump()
        return ticket

    def offer_turn(self, session_id: str, worker: str | None, prompt_tokens: int,
                   on_grant: Callable[[], None] | None = None) -> AdmissionTicket:
        """A later turn of a paced session (its KV on ``worker``) asks to run: granted now when no
        paced turn waits and it has room, else queued until it has or ``paced_turn_max_wait``."""
        ticket = AdmissionTicket(session_id, prompt_tokens, prompt_tokens, on_grant=on_grant, paced_turn=True,
                                 worker=worker)
        if not self._paced and self.placement.resume(session_id, worker):
            self._admit(ticket, None, None, None)
            self.pump()  # no longer paced: new sessions may go now
            return ticket
        ticket.enqueued_at = self._clock()
        self._paced.append(ticket)
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
        """When the first waiter reaches ``max_wait`` (None: nobody waits, or no limit). Whoever
        drives the queue must pump at this time, not at its next periodic pass, or the wait
        overshoots ``max_wait`` by up to one period."""
        deadlines = []
        if self._length and self.settings.max_wait > 0:
            deadlines.append(min(q[0].enqueued_at for q in self._keys.values()) + self.settings.max_wait)
        if self._paced:
            deadlines.append(self._paced[0].enqueued_at + self.settings.paced_turn_max_wait)
        return min(deadlines, default=None)

    def pump(self) -> int:
        """Let waiters through, keys in turn, while the next one fits, and any that waited
        ``max_wait``; returns how many went. Call it when time passed or the residency changed."""
        now = self._clock()
        granted = self._pump_paced(now)
        while self._length:
            key, head = self._next_timed_out(now)
            timed_out = head is not None
            if not timed_out:
                key = next(iter(self._keys))  # whose turn it is
                head = self._keys[key][0]
            # a paced turn waiting for room goes first: no new session takes that room before its max_wait
            worker = self.placement.choose(head.tokens, share=head.share) if timed_out or not self._paced else None
            if worker is None and not timed_out:
                break
            self._pop(key)
            if worker is not None:
                self._admit(head, "queued", now - head.enqueued_at, worker)
            else:  # waited long enough: the roomiest worker (SGLang's eviction has the last word)
                self._admit(head, "timeout", now - head.enqueued_at,
                            self.placement.choose(head.tokens, force=True, share=head.share), had_room=False)
            granted += 1
        return granted

    def cancel(self, ticket: AdmissionTicket) -> None:
        """The session gave up: a waiting ticket leaves the queue (the next may go now); a granted
        one is ungranted (its request will not run). A cancelled ticket stays cancelled."""
        if ticket.granted:
            ticket.state = "cancelled"
            self._ungrant(ticket.session_id)
        elif ticket.waiting and ticket.paced_turn:
            ticket.state = "cancelled"
            self._paced.remove(ticket)
            self.pump()
        elif ticket.waiting:
            ticket.state = "cancelled"
            queue = self._keys.get(ticket.scope)
            if queue is not None and ticket in queue:
                queue.remove(ticket)
                self._length -= 1
                if not queue:
                    del self._keys[ticket.scope]
            self._record("cancelled", None)
            self.pump()

    # ------------------------------------------------------------------ internals
    def _pump_paced(self, now: float) -> int:
        """Paced turns, in order, while the head has room or waited ``paced_turn_max_wait``."""
        granted = 0
        while self._paced:
            head = self._paced[0]
            timed_out = now >= head.enqueued_at + self.settings.paced_turn_max_wait  # as next_deadline has it
            had_room = self.placement.resume(head.session_id, head.worker)
            if not (had_room or timed_out):
                break
            self._paced.popleft()
            self._admit(head, None, None, None, had_room=had_room)
            granted += 1
        return granted

    def _next_timed_out(self, now: float) -> tuple[str | None, AdmissionTicket | None]:
        """The longest-waiting head past ``max_wait``, if any."""
        if self.settings.max_wait <= 0:
            return None, None
        key = min(self._keys, key=lambda k: self._keys[k][0].enqueued_at)
        head = self._keys[key][0]
        return (key, head) if now >= head.enqueued_at + self.settings.max_wait else (None, None)  # as next_deadline

    def _pop(self, key: str) -> None:
        """The head of ``key`` goes; the key's turn passes to the next key."""
        queue = self._keys.pop(key)
        queue.popleft()
        self._length -= 1
        if queue:
            self._keys[key] = queue  # to the back of the round

    def _displace_for(self, scope: str) -> bool:
        """The queue is full: the key holding most gives up its newest waiter to ``scope`` if
        ``scope`` holds fewer; False when it does not."""
        largest = max(self._keys, key=lambda k: len(self._keys[k]))
        if len(self._keys[largest]) <= self.waiting_of(scope) + 1:
            return False
        queue = self._keys[largest]
        victim = queue.pop()
        self._length -= 1
        victim.state = "rejected"
        victim.retry_after_s = self.retry_after_s()
        self._record("rejected", None)
        if victim.on_reject is not None:
            victim.on_reject()
        return True

    def _admit(self, ticket: AdmissionTicket, decision: str | None, waited: float | None, worker: str | None,
               had_room: bool = True) -> None:
        """Grant ``ticket`` (``decision`` None: not a new session's; ``had_room``: it fitted)."""
        self._grant(ticket.session_id, ticket.prompt_tokens, worker)
        ticket.state = "granted"
        if self._on_room is not None and (decision is not None or ticket.paced_turn):
            self._on_room(ticket.session_id, had_room)
        if ticket.paced_turn and self._metrics is not None:
            self._metrics.paced_turn(had_room, 0.0 if ticket.enqueued_at is None else self._clock() - ticket.enqueued_at)
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
    """``AdmissionQueue`` for asyncio callers: ``until_granted`` returns once the session may start."""

    async def until_granted(self, ticket: AdmissionTicket) -> None:
        """Wait for ``ticket``'s grant, pumping every ``poll_interval`` (leases expire) and at the
        first waiter's ``max_wait`` deadline exactly; cancelling the wait cancels the ticket;
        AdmissionRejected if another key's session took its place."""
        if ticket.granted:
            return
        woken = asyncio.get_running_loop().create_future()
        ticket.on_grant = ticket.on_reject = lambda: woken.done() or woken.set_result(None)
        try:
            while ticket.waiting:
                try:
                    await asyncio.wait_for(asyncio.shield(woken), self._next_wake_in())
                except TimeoutError:
                    self.pump()
        except asyncio.CancelledError:
            self.cancel(ticket)  # still queued: it leaves; granted meanwhile: ungranted
            raise
        if ticket.state == "rejected":
            raise AdmissionRejected(ticket.retry_after_s)

    def _next_wake_in(self) -> float:
        """Seconds to the next pump: the poll interval, or less when a deadline is sooner."""
        deadline = self.next_deadline()
        wake = self.settings.poll_interval
        if deadline is not None:
            wake = min(wake, max(0.0, deadline - self._clock()))
        return wake
