"""The sidecar's session policy: predictor + TTL rule + admission gate + when sessions close.

It keeps no session table: each session's record lives in the session store, which binds itself
(``bind``) and asks for a new session's record (``new_record``). Call order per request (see
``sidecar.policy.SessionPolicy``):
    admit -> on_request -> lease_request -> (engine turn) -> on_turn_end [-> after_turn] -> release_admission
and periodically the store's close_due(now): sessions_to_close(now) -> forget -> on_session_closed.
All times are the injectable clock's (time.monotonic by default), like TurnEnd.finished_at.

What the admission gate counts (``placement.WorkerRoom.fits``, per worker: sum <= headroom x KV
pool). A session's projection is its context + growth x turns ahead, where
    turns ahead = projection_horizon_s / cycle   (cycle: learned time from one request of a session
                                                  to its next = service + tool gap; so agents with
                                                  long tool gaps project fewer turns per horizon)
                = projection_turns                (no horizon set, or no cycle observed yet).
A running session counts its whole projection. An idle session under lease counts
    full        its whole projection (its KV is held), or
    duty_cycle  its projection x service / (service + remaining gap), remaining gap = the
                predictor's median time to its return given how long it has been out.
Why duty_cycle: leased KV of an agent that is out for 5 s is needed only ~1/5 of the time; counting
it in full filled the gate with agents in tool gaps while the engine idled (simulator: 203 s vs
LRU's 163 s at 5 s gaps). The gate then keeps the *running* working set within the pool; idle
leased KV fills the rest and the plugin's ``max_leased_fraction`` bound and pressure valve give it
up when running requests need the room (a recompute on that agent's return). An agent expected
back within a fraction of a turn still counts ~in full, so short-gap workloads gate as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from sidecar.engine.capacity import EngineCapacity
from sidecar.policy.admission import AdmissionGate, AdmissionTicket
from sidecar.policy.base import LeaseRequest, TurnEnd
from sidecar.policy.final_answers import ENDS_BELOW, FinalAnswerStats, with_chance_of_return
from sidecar.policy.lifecycle import ClosedSessions, SessionRecord, SessionRecords
from sidecar.policy.metrics import PolicyMetrics
from sidecar.policy.placement import WorkerRoom, choose_worker
from sidecar.policy.predictor import NO_TOOL, ReturnTimePredictor, tool_keys
from sidecar.policy.settings import AdmissionSettings, PolicySettings
from sidecar.policy.ttl import LeaseTtlRule

GROWTH_LEARNING_RATE = 0.1  # also the rate of the service-time and turn-cycle averages


class LeasePolicy:
    def __init__(
        self,
        policy: PolicySettings,
        admission: AdmissionSettings,
        capacity: EngineCapacity,
        *,
        max_sessions: int = 10_000,
        idle_grace_s: float = 60.0,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        worker: str = "",
    ):
        self.settings = policy
        self.admission_settings = admission
        # each worker's capacity, by name (its URL); the ones new sessions may be placed on
        self.capacities: dict[str, EngineCapacity] = {worker: capacity}
        self.placeable: set[str] = {worker}
        self.clock = clock
        self.predictor = ReturnTimePredictor(policy)
        self.ttl_rule = LeaseTtlRule(policy)
        self.final_answers = FinalAnswerStats(self.predictor.decay)
        self.idle_grace_s = idle_grace_s
        self.closed = ClosedSessions(max_sessions)
        self.sessions: SessionRecords | None = None  # the session store, once it binds itself
        self.metrics = PolicyMetrics(registry if registry is not None else CollectorRegistry())
        self.growth_tokens = float(admission.expected_growth_tokens)
        # learned over all sessions: seconds from a request to its reply's end, and from one
        # request of a session to its next (service + tool gap); None until observed
        self.service_s: float | None = None
        self.cycle_s: float | None = None
        self.gate = AdmissionGate(
            admission,
            placement=self,
            grant=self._start_request,
            ungrant=self.release_admission,
            clock=clock,
            metrics=self.metrics,
        )

    @property
    def capacity(self) -> EngineCapacity:
        """The first worker's capacity: with one worker, the engine's (the pressure term and the
        host-tier projection read it)."""
        return next(iter(self.capacities.values()))

    def bind(self, sessions: SessionRecords) -> None:
        """The records this policy decides on: the session store's (it calls this itself)."""
        self.sessions = sessions
        self.metrics.bind_state(
            queue_length=lambda: self.gate.queue_length,
            resident=lambda: self._resident_summary(self.clock()),
            sessions=lambda: len(sessions),
        )
        self.metrics.bind_workers(self.worker_state)

    def new_record(self, session_id: str) -> SessionRecord:
        """The record of a session the store is opening; a session closed earlier comes back with
        its open gap (so the predictor learns the true gap)."""
        now = self.clock()
        reopened = self.closed.reopen(session_id, now, self.predictor.grid.horizon_s)
        return reopened if reopened is not None else SessionRecord(session_id=session_id, last_active=now)

    def _record(self, session_id: str) -> SessionRecord:
        record = self.sessions.record(session_id)
        if record is None:
            raise KeyError(f"no session {session_id!r} in the store (open it there first)")
        return record

    # ------------------------------------------------------------------ admission
    async def admit(self, session_id: str, prompt_tokens: int, is_new_session: bool) -> None:
        """Wait until the request may start; AdmissionRejected when the queue is full."""
        await self.gate.until_granted(self.offer_admission(session_id, prompt_tokens, is_new_session))

    def offer_admission(
        self,
        session_id: str,
        prompt_tokens: int,
        is_new_session: bool,
        on_grant: Callable[[], None] | None = None,
    ) -> AdmissionTicket:
        """``admit`` without an event loop: the ticket is granted now or by a later pump (then
        ``on_grant`` runs); AdmissionRejected when the queue is full.

        Only a new session's first request is gated (and only with admission enabled).
        """
        record = self._record(session_id)
        if is_new_session and self.admission_settings.enabled:
            return self.gate.offer(session_id, prompt_tokens, prompt_tokens + self._projected_growth(), on_grant)
        if record.worker is None or record.worker not in self.capacities:  # not placed (admission off, re-homed)
            worker = self.choose(prompt_tokens + self._projected_growth(), force=True)
            if worker is not None:
                self.assign(session_id, worker)
        return self.gate.let_through(session_id, prompt_tokens, on_grant)

    def release_admission(self, session_id: str) -> None:
        """The request admitted by ``admit`` is over (finished, failed or aborted)."""
        state = self.sessions.record(session_id)
        if state is not None:
            state.running = max(0, state.running - 1)
            state.last_active = max(state.last_active, self.clock())
        self.gate.pump()

    def _start_request(self, session_id: str, prompt_tokens: int) -> None:
        now = self.clock()
        state = self._record(session_id)
        state.running += 1
        state.last_active = now
        if state.turn_ended_at is None:  # (else on_request settles the gap with the old size first)
            state.context_tokens = max(state.context_tokens, prompt_tokens)

    # ------------------------------------------------------------------ turns
    def on_request(self, session_id: str, context_tokens: int, now: float) -> None:
        """A request arrived: closes the open gap (learns it) and scores the lease that covered it."""
        state = self._record(session_id)
        if state.turn_ended_at is not None:
            if state.request_started_at is not None:
                self.cycle_s = _ewma(self.cycle_s, now - state.request_started_at)
            self._close_gap(state, now)
        state.request_started_at = now
        if (
            self.admission_settings.learn_growth
            and state.last_prompt_tokens is not None
            and context_tokens >= state.last_prompt_tokens
        ):
            growth = context_tokens - state.last_prompt_tokens
            self.growth_tokens += GROWTH_LEARNING_RATE * (growth - self.growth_tokens)
        state.last_prompt_tokens = context_tokens
        state.context_tokens = context_tokens
        state.last_active = max(state.last_active, now)

    def lease_request(self, session_id: str, context_tokens: int, now: float) -> LeaseRequest | None:
        """The lease to send with this request (None = no lease): how long SGLang keeps the KV after
        the turn, and when the session is expected back.

        The reply's tool calls are not known yet, so the prediction mixes the tools replies at
        this context size tend to call, stretched by this session's speed factor.
        """
        state = self._record(session_id)
        dist = None
        if self.settings.mode == "predictive":
            dist = self.predictor.next_reply_distribution(state.gap_stats, context_tokens)
        ttl = self.ttl_rule.ttl(dist, context_tokens, 0.0, self._resident_fraction(now, state.worker))
        state.pending_ttl = ttl
        if ttl is None:
            return None
        self.metrics.lease_granted(ttl)
        if dist is None:  # a fixed lease: the expectation still comes from what was learned
            dist = self.predictor.next_reply_distribution(state.gap_stats, context_tokens)
        return LeaseRequest(ttl, *expected_return(dist))

    def lease_ttl(self, session_id: str, context_tokens: int, now: float) -> float | None:
        """The TTL of :meth:`lease_request` alone (for callers that send no expectation)."""
        lease = self.lease_request(session_id, context_tokens, now)
        return lease.ttl_s if lease is not None else None

    def lease_expiry(self, session_id: str) -> float | None:
        """When the lease the sidecar asked for ends (the policy's clock); None = no lease."""
        state = self.sessions.record(session_id)
        return state.lease_expires_at if state is not None else None

    def on_turn_end(self, turn: TurnEnd) -> None:
        """The reply ended: the lease sent with the request starts, and so does the gap."""
        now = turn.finished_at
        state = self._record(turn.session_id)
        state.context_tokens = turn.context_tokens
        if state.request_started_at is not None and state.turn_ended_at is None:
            self.service_s = _ewma(self.service_s, max(0.0, now - state.request_started_at))
        state.turn_ended_at = now
        state.turn_tools = tool_keys(turn.tool_names)
        state.last_active = max(state.last_active, now)
        ttl, state.pending_ttl = state.pending_ttl, None
        state.lease_expires_at = now + ttl if ttl else None
        predicted = self.predictor.distribution(state.turn_tools, state.gap_stats).median()
        state.predicted_gap_s = min(predicted, self.predictor.grid.horizon_s)
        self.metrics.gap_predicted_at_turn_end(state.predicted_gap_s)
        self.gate.pump()

    def revised_lease_ttl(self, session_id: str, now: float) -> float | None:
        """Optional: a TTL counted from ``now``, now that the reply's tools are known, taken as the
        session's lease (for a lease channel that can update a lease between requests; call it
        right after ``on_turn_end`` and send the result). None = leave the lease as it is."""
        lease = self.after_turn(session_id, now)
        if lease is None:
            return None
        self.lease_revised(session_id, lease, now)
        return lease.ttl_s

    def after_turn(self, session_id: str, now: float) -> LeaseRequest | None:
        """The lease and expected return counted from ``now``, now that the reply's tool calls
        (or their absence: a final answer, see ``_ends_session``) are known; None = nothing to
        revise (not predictive).
        Nothing changes until the caller sends it and says so (``lease_revised``)."""
        state = self.sessions.record(session_id)
        if state is None or state.turn_ended_at is None or self.settings.mode != "predictive":
            return None
        back = dist = self.predictor.distribution(state.turn_tools, state.gap_stats)
        if self._is_final_answer(state):
            p = self.final_answers.p_return(state.gap_stats.returns_after_final, self.settings.session_shrinkage)
            if p < ENDS_BELOW:
                return LeaseRequest(self.settings.final_answer_ttl, None, None)
            dist = with_chance_of_return(back, p)  # the TTL weighs the chance that it ends here
        elapsed = max(0.0, now - state.turn_ended_at)
        ttl = self.ttl_rule.ttl(dist, state.context_tokens, elapsed, self._resident_fraction(now, state.worker))
        if ttl is None:
            return None
        return LeaseRequest(ttl, *expected_return(back, elapsed))  # when it is back, if it comes back

    def _is_final_answer(self, state: SessionRecord) -> bool:
        """The reply ended without tool calls (see ``sidecar.policy.final_answers``)."""
        return self.settings.final_answer_ttl > 0 and state.turn_tools == (NO_TOOL,)

    def lease_revised(self, session_id: str, lease: LeaseRequest, now: float) -> None:
        """``lease`` (from ``after_turn``) went to the engine: the session's lease runs from now."""
        state = self.sessions.record(session_id)
        if state is not None:
            state.lease_expires_at = now + lease.ttl_s
            self.metrics.lease_granted(lease.ttl_s)

    def set_capacity(self, capacity: EngineCapacity, worker: str | None = None) -> None:
        """A worker told us (again) what it holds (a new name: a worker that joined, placeable from
        now on): admission and the pressure term use it from now on."""
        worker = next(iter(self.capacities)) if worker is None else worker
        if worker not in self.capacities:
            self.placeable.add(worker)
        self.capacities[worker] = capacity
        self.gate.pump()

    # ------------------------------------------------------------------ placement (several workers)
    def set_placeable(self, worker: str, placeable: bool) -> None:
        """New sessions may (no longer) go to ``worker`` (it is down or was removed, or back)."""
        if placeable and worker in self.capacities:
            self.placeable.add(worker)
        else:
            self.placeable.discard(worker)
        self.gate.pump()

    def relocate(self, session_id: str, worker: str | None) -> None:
        """The session's KV is on ``worker`` now (a turn was served there); None: its worker is
        gone and its next request is placed afresh."""
        record = self.sessions.record(session_id)
        if record is not None:
            record.worker = worker

    def worker_of(self, session_id: str) -> str | None:
        record = self.sessions.record(session_id)
        return record.worker if record is not None else None

    def rooms(self) -> list[WorkerRoom]:
        now = self.clock()
        out = []
        for worker in self.capacities:
            if worker not in self.placeable:
                continue
            _, projected, sessions = self._resident_summary(now, worker)
            budget = self.admission_settings.headroom * self.capacities[worker].hierarchy_tokens
            out.append(WorkerRoom(worker, budget, projected, sessions))
        return out

    def choose(self, tokens: float, force: bool = False) -> str | None:
        """The placement the gate asks: the worker a session of ``tokens`` fits on, or None."""
        return choose_worker(self.rooms(), tokens, force)

    def assign(self, session_id: str, worker: str) -> None:
        record = self.sessions.record(session_id)
        if record is not None:
            record.worker = worker
            self.metrics.worker_admission(worker)

    def worker_state(self) -> dict[str, tuple[float, int, int]]:
        """Per worker: (resident tokens, leases, sessions placed there), for /metrics."""
        now = self.clock()
        state = {w: [0.0, 0, 0] for w in self.capacities}
        for r in self.sessions.records():
            if r.worker in state:
                entry = state[r.worker]
                entry[2] += 1
                if r.is_resident(now) or r.holds_kv():
                    entry[0] += r.context_tokens
                if r.lease_expires_at is not None and now < r.lease_expires_at:
                    entry[1] += 1
        return {w: (t, leases, n) for w, (t, leases, n) in state.items()}

    # ------------------------------------------------------------------ lifecycle
    def sessions_to_close(self, now: float) -> list[str]:
        """Sessions idle past their lease + the idle grace, to be forgotten now (the store does).

        Also lets waiting new sessions in as leases expire, so call it every second or so.
        """
        self.gate.pump()
        grace = self.idle_grace_s
        return [r.session_id for r in self.sessions.records() if r.due_for_close(now, grace)]

    def on_session_closed(self, record: SessionRecord, reason: str = "idle") -> None:
        """The store forgot this session (``reason``: idle, capacity, memory, client, failed): an open gap
        is learned as censored ("not back") until the session comes back."""
        self._forget(record, self.clock(), "table_full" if reason in ("capacity", "memory") else "idle")
        self.gate.pump()

    # ------------------------------------------------------------------ internals
    def _close_gap(self, state: SessionRecord, now: float) -> None:
        gap = max(0.0, now - state.turn_ended_at)
        reopened = state.censored is not None
        if reopened:  # closed as "not back", but it was: learn the true gap instead
            self.predictor.retract(state.censored)
            state.censored = None
        self.predictor.observe(
            state.turn_tools, gap, state.gap_stats, state.context_tokens, count_mix=not reopened
        )
        if state.turn_tools == (NO_TOOL,):
            self.final_answers.returned(retracted_end=reopened)
        self.metrics.gap_observed(gap, state.predicted_gap_s)
        expires = state.lease_expires_at
        if reopened:
            pass  # its lease was already counted as unused when it was closed
        elif expires is None:
            self.metrics.lease_outcome("unleased")
        else:
            held = state.context_tokens * max(0.0, min(now, expires) - state.turn_ended_at)
            self.metrics.lease_outcome("hit" if now <= expires else "miss", held)
        state.turn_ended_at = None
        # lease_expires_at stays: SGLang holds the lease while this request waits and, should the
        # request be aborted, it runs on to its expiry; the turn's end replaces it
        state.predicted_gap_s = None

    def _forget(self, state: SessionRecord, now: float, reason: str) -> None:
        if state.turn_ended_at is not None:
            if state.censored is None:
                state.censored = self.predictor.observe_censored(state.turn_tools, state.context_tokens)
                if state.turn_tools == (NO_TOOL,):
                    self.final_answers.ended()
            if state.lease_expires_at is not None:
                held = state.context_tokens * max(0.0, min(now, state.lease_expires_at) - state.turn_ended_at)
                self.metrics.lease_outcome("unused", held)
            self.closed.remember(state)
        self.metrics.session_closed(reason)

    def _resident_summary(self, now: float, worker: str | None = None) -> tuple[float, float, int]:
        """(tokens, projected tokens as the gate counts them, sessions) of the resident sessions.

        A session's projection is its context + ``_projected_growth()``. Without a host tier a
        session is resident while it runs or holds a lease, and with ``idle_weight = duty_cycle``
        an idle (leased) session's projection is scaled by ``_duty_cycle`` (running sessions
        always count in full). With a host tier every open session that holds KV is resident,
        in full: HiCache keeps its KV (on GPU or host) whether leased or not, until the host
        tier runs out, so what must fit is the whole set of open sessions, not the leased ones.
        """
        capacity = self.capacities.get(worker, self.capacity) if worker is not None else self.capacity
        hierarchy = capacity.host_tokens > 0
        records = self.sessions.records()
        if worker is not None and len(self.capacities) > 1:  # one worker's sessions only
            records = [s for s in records if s.worker == worker]
        resident = [s for s in records if s.is_resident(now) or (hierarchy and s.holds_kv())]
        growth = self._projected_growth()
        tokens = projected = 0.0
        for s in resident:
            tokens += s.context_tokens
            weight = 1.0 if s.running > 0 or hierarchy else self._duty_cycle(s, now)
            projected += weight * (s.context_tokens + growth)
        return tokens, projected, len(resident)

    def _turns_ahead(self) -> float:
        """Turns of growth the gate projects: ``projection_horizon_s`` / learned turn cycle, else
        (no horizon set, or no cycle observed yet) ``projection_turns``."""
        if self.capacity.host_tokens > 0:
            return self.admission_settings.host_tier_projection_turns
        horizon = self.admission_settings.projection_horizon_s
        if horizon > 0 and self.cycle_s:
            return horizon / self.cycle_s
        return self.admission_settings.projection_turns

    def _projected_growth(self) -> float:
        """Tokens a session is expected to add before admission is reconsidered."""
        return self.growth_tokens * self._turns_ahead()

    def _duty_cycle(self, state: SessionRecord, now: float) -> float:
        """Share of the time from now to the end of an idle session's next turn that it runs:
        service / (service + remaining gap), the remaining gap being the predictor's median time
        to its return given how long it has been out (it grows for a session that is overdue).

        1 with ``idle_weight = full``, or before a service time is known.
        """
        if self.admission_settings.idle_weight != "duty_cycle" or self.service_s is None:
            return 1.0
        if state.turn_ended_at is None:
            return 1.0
        dist = self.predictor.distribution(state.turn_tools, state.gap_stats)
        remaining = dist.median(max(0.0, now - state.turn_ended_at))
        if remaining == float("inf"):
            return 0.0
        total = self.service_s + remaining
        return self.service_s / total if total > 0 else 1.0

    def _resident_fraction(self, now: float, worker: str | None) -> float:
        """How full the session's worker is with resident sessions (the TTL's pressure term): its
        own sessions over its own hierarchy, with several workers; the one pool's otherwise."""
        several = len(self.capacities) > 1
        capacity = (self.capacities.get(worker, self.capacity) if several else self.capacity).hierarchy_tokens
        if capacity <= 0 or self.settings.kv_pressure_gain == 0 or self.settings.mode != "predictive":
            return 0.0
        # tokens only: the gate's duty-cycle projections (a predictor distribution per idle
        # session) are not needed for the pressure term, and this runs on every request
        records = self.sessions.records()
        if several:
            records = [s for s in records if s.worker == worker]
        tokens = sum(s.context_tokens for s in records if s.is_resident(now))
        return min(tokens / capacity, 1.0)


EARLY_RETURN_QUANTILE = 0.2  # the spread sent to the plugin reaches down to this quantile


def expected_return(dist, elapsed: float = 0.0) -> tuple[float | None, float | None]:
    """(median time to the session's next request, how much earlier it may come: median - 20th
    percentile), both from now; (None, None) when the session is not expected back."""
    median = dist.median(elapsed)
    if median == float("inf"):
        return None, None
    early = dist.quantile(EARLY_RETURN_QUANTILE, elapsed)
    return median, max(0.0, median - min(early, median))


def _ewma(mean: float | None, value: float) -> float:
    return value if mean is None else mean + GROWTH_LEARNING_RATE * (value - mean)
