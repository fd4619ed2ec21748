"""The sidecar's session policy: one object the turn core calls, delegating each question.

    admission   ``admission.AdmissionGate`` (the rule, in its docstring), on ``placement.Placement``
                over ``residency.Residency`` (per-worker counters) and ``projection.Projection``;
    leases      the predictor (``predictor``) and the TTL rule (``ttl``), final answers;
    lifecycle   when an idle session closes (``lifecycle``).

It keeps no session table: each session's record lives in the session store, which binds itself
(``bind``) and asks for a new session's record (``new_record``). Call order per request (see
``sidecar.policy.SessionPolicy``):
    admit -> on_request -> lease_request -> (engine turn) -> on_turn_end [-> after_turn] -> release_admission
and periodically the store's close_due(now): sessions_to_close(now) -> forget -> on_session_closed.
Every call that changes a record tells the residency (``_count``). All times are the injectable
clock's (time.monotonic by default), like TurnEnd.finished_at.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry

from sidecar.engine.capacity import EngineCapacity
from sidecar.policy.admission import AdmissionGate, AdmissionTicket
from sidecar.policy.base import LeaseRequest, TurnEnd
from sidecar.policy.final_answers import ENDS_BELOW, FinalAnswerStats, with_chance_of_return
from sidecar.policy.lifecycle import ClosedSessions, SessionRecord, SessionRecords
from sidecar.policy.metrics import PolicyMetrics
from sidecar.policy.placement import Placement
from sidecar.policy.predictor import NO_TOOL, ReturnTimePredictor, tool_keys
from sidecar.policy.projection import Projection
from sidecar.policy.residency import Residency
from sidecar.policy.settings import AdmissionSettings, PolicySettings
from sidecar.policy.shared_prefix import Share, SharedPrefixes
from sidecar.policy.ttl import LeaseTtlRule


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
        key_queue_share: float = 1.0,
    ):
        self.settings = policy
        self.admission_settings = admission
        self.clock = clock
        self.predictor = ReturnTimePredictor(policy)
        self.ttl_rule = LeaseTtlRule(policy)
        self.final_answers = FinalAnswerStats(self.predictor.decay)
        self.idle_grace_s = idle_grace_s
        self.closed = ClosedSessions(max_sessions)
        self.sessions: SessionRecords | None = None  # the session store, once it binds itself
        self.metrics = PolicyMetrics(registry if registry is not None else CollectorRegistry())
        self.residency = Residency(admission.host_tier_projection_turns, admission.host_tier_projection != "full")
        self.prefixes = SharedPrefixes()
        self.projection = Projection(admission, self.predictor, self.residency.turns_left)
        self.placement = Placement(capacity, worker, admission.headroom, self.residency, self.projection, clock,
                                   distinct=admission.host_tier_capacity == "distinct",
                                   recompute_share=admission.host_tier_recompute_share,
                                   recompute_cost=self.ttl_rule.recompute_cost_s,
                                   paced_hold_s=admission.paced_turn_max_wait)
        self.gate = AdmissionGate(
            admission,
            placement=self.placement,
            grant=self._start_request,
            ungrant=self.release_admission,
            clock=clock,
            metrics=self.metrics,
            key_share=key_queue_share,
            on_room=self._on_room,
        )

    @property
    def capacity(self) -> EngineCapacity:
        """The first worker's capacity: with one worker, the engine's."""
        return self.placement.first

    def bind(self, sessions: SessionRecords) -> None:
        """The records this policy decides on: the session store's (it calls this itself)."""
        self.sessions = sessions
        self.metrics.bind_state(
            queue_length=lambda: self.gate.queue_length,
            resident=lambda: self.placement.summary(None, self.clock()),
            sessions=lambda: len(sessions),
            paced_turns_waiting=lambda: self.gate.turns_waiting,
        )
        self.metrics.bind_workers(self.placement.worker_state)

    def new_record(self, session_id: str) -> SessionRecord:
        """The record of a session the store is opening; a session closed earlier comes back with
        its open gap (so the predictor learns the true gap)."""
        now = self.clock()
        reopened = self.closed.reopen(session_id, now, self.predictor.grid.horizon_s)
        record = reopened if reopened is not None else SessionRecord(session_id=session_id, last_active=now)
        self._count(record, now)
        return record

    def _record(self, session_id: str) -> SessionRecord:
        record = self.sessions.record(session_id)
        if record is None:
            raise KeyError(f"no session {session_id!r} in the store (open it there first)")
        return record

    def _count(self, record: SessionRecord, now: float | None = None) -> None:
        """The record changed: the residency counts it anew."""
        self.residency.update(record, self.clock() if now is None else now)

    # ------------------------------------------------------------------ admission
    async def admit(self, session_id: str, prompt_tokens: int, is_new_session: bool, scope: str = "",
                    prompt_ids: Sequence[int] | None = None) -> None:
        """Wait until the request may start; AdmissionRejected when the queue (or the key's share
        of it) is full, or another key's session took its place."""
        await self.gate.until_granted(self.offer_admission(session_id, prompt_tokens, is_new_session, scope=scope,
                                                           prompt_ids=prompt_ids))

    def offer_admission(
        self,
        session_id: str,
        prompt_tokens: int,
        is_new_session: bool,
        on_grant: Callable[[], None] | None = None,
        scope: str = "",
        prompt_ids: Sequence[int] | None = None,
    ) -> AdmissionTicket:
        """``admit`` without an event loop: the ticket is granted now or by a later pump (then
        ``on_grant`` runs); AdmissionRejected when the queue is full.

        Only a new session's first request is gated (and only with admission enabled). Its
        ``prompt_ids`` tell the prefix it shares with the open sessions, which counts once
        (``shared_prefix``); without them its whole prompt counts as its own.
        """
        record = self._record(session_id)
        if is_new_session and prompt_ids is not None:
            record.share = self.prefixes.open(session_id, prompt_ids, self._adopt_share)
        growth = self.projection.growth(self.placement.hierarchy())
        if is_new_session and self.admission_settings.enabled:
            return self.gate.offer(session_id, prompt_tokens, prompt_tokens + growth, on_grant, scope, record.share)
        if record.paced and self.admission_settings.enabled:
            return self.gate.offer_turn(session_id, record.worker, prompt_tokens, on_grant)
        if record.worker is None or record.worker not in self.placement.capacities:  # not placed (admission off, re-homed)
            worker = self.placement.choose(prompt_tokens + growth, force=True, share=record.share)
            if worker is not None:
                self.assign(session_id, worker)
        return self.gate.let_through(session_id, prompt_tokens, on_grant)

    def _adopt_share(self, session_id: str, share: Share) -> None:
        """An open session turned out to start with a new session's shared prefix: if it counted
        none yet (the first of its kind), it now counts that one, held once by them all."""
        record = self.sessions.record(session_id)
        if record is not None and record.share is None:
            record.share = share

    def _on_room(self, session_id: str, had_room: bool) -> None:
        """The gate let a request of the session through: one let in without room is paced from
        now on where pacing is on (a host tier and ``paced_turn_max_wait``), one with room no more."""
        record = self.sessions.record(session_id)
        if record is None:
            return
        paced = not had_room and self.admission_settings.paced_turn_max_wait > 0 and self.placement.hierarchy()
        if paced != record.paced:
            record.paced = paced
            self._count(record)

    def release_admission(self, session_id: str) -> None:
        """The request admitted by ``admit`` is over (finished, failed or aborted)."""
        state = self.sessions.record(session_id)
        if state is not None:
            state.running = max(0, state.running - 1)
            state.last_active = max(state.last_active, self.clock())
            self._count(state)
        self.gate.pump()

    def _start_request(self, session_id: str, prompt_tokens: int, worker: str | None = None) -> None:
        now = self.clock()
        state = self._record(session_id)
        if worker is not None:  # a gated session starts on the worker it fits (or was forced onto)
            state.worker = worker
            self.metrics.worker_admission(worker)
        state.running += 1
        state.last_active = now
        if state.turn_ended_at is None:  # (else on_request settles the gap with the old size first)
            state.context_tokens = max(state.context_tokens, prompt_tokens)
        self._count(state, now)

    # ------------------------------------------------------------------ turns
    def on_request(self, session_id: str, context_tokens: int, now: float) -> None:
        """A request arrived: closes the open gap (learns it) and scores the lease that covered it."""
        state = self._record(session_id)
        if state.turn_ended_at is not None:
            if state.request_started_at is not None:
                self.projection.learn_cycle(now - state.request_started_at)
            self._close_gap(state, now)
        state.request_started_at = now
        if state.last_prompt_tokens is not None and context_tokens >= state.last_prompt_tokens:
            self.projection.learn_growth(context_tokens - state.last_prompt_tokens)
        state.last_prompt_tokens = context_tokens
        state.context_tokens = context_tokens
        state.last_active = max(state.last_active, now)
        self._count(state, now)

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
        ttl = self.ttl_rule.ttl(dist, context_tokens, 0.0, self._pressure(state.worker, now))
        state.pending_ttl = ttl
        if ttl is None:
            return None
        self.metrics.lease_granted(ttl)
        if dist is None:  # a fixed lease: the expectation still comes from what was learned
            dist = self.predictor.next_reply_distribution(state.gap_stats, context_tokens)
        return LeaseRequest(ttl, *expected_return(dist))

    def on_turn_end(self, turn: TurnEnd) -> None:
        """The reply ended: the lease sent with the request starts, and so does the gap."""
        now = turn.finished_at
        state = self._record(turn.session_id)
        state.context_tokens = turn.context_tokens
        if state.request_started_at is not None and state.turn_ended_at is None:
            self.projection.learn_service(now - state.request_started_at)
            state.turns += 1
        state.turn_ended_at = now
        state.turn_tools = tool_keys(turn.tool_names)
        state.last_active = max(state.last_active, now)
        ttl, state.pending_ttl = state.pending_ttl, None
        state.lease_expires_at = now + ttl if ttl else None
        predicted = self.predictor.distribution(state.turn_tools, state.gap_stats).median()
        state.predicted_gap_s = min(predicted, self.predictor.grid.horizon_s)
        self.metrics.gap_predicted_at_turn_end(state.predicted_gap_s)
        self._count(state, now)
        self.gate.pump()

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
        ttl = self.ttl_rule.ttl(dist, state.context_tokens, elapsed, self._pressure(state.worker, now))
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
            self._count(state, now)

    def set_capacity(self, capacity: EngineCapacity, worker: str | None = None) -> None:
        """A worker told us (again) what it holds (a new name: a worker that joined, placeable from
        now on): admission and the pressure term use it from now on."""
        self.placement.set_capacity(capacity, worker)
        self.gate.pump()

    # ------------------------------------------------------------------ placement (several workers)
    def set_placeable(self, worker: str, placeable: bool) -> None:
        """New sessions may (no longer) go to ``worker`` (it is down or was removed, or back)."""
        self.placement.set_placeable(worker, placeable)
        self.gate.pump()

    def relocate(self, session_id: str, worker: str | None) -> None:
        """The session's KV is on ``worker`` now (a turn was served there); None: its worker is
        gone and its next request is placed afresh."""
        record = self.sessions.record(session_id)
        if record is not None:
            record.worker = worker
            self._count(record)

    def worker_of(self, session_id: str) -> str | None:
        record = self.sessions.record(session_id)
        return record.worker if record is not None else None

    def assign(self, session_id: str, worker: str) -> None:
        """Place a session the gate does not hold (admission off, or re-homed) on ``worker``."""
        record = self.sessions.record(session_id)
        if record is not None:
            record.worker = worker
            self.metrics.worker_admission(worker)
            self._count(record)

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
        self.residency.remove(record)
        self.prefixes.close(record.session_id)
        turns = self.projection.learn_session_turns(record.turns)
        if turns is not None:
            self.residency.projected_turns = turns
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

    def _pressure(self, worker: str | None, now: float) -> float:
        """The TTL's pressure term: how full the session's worker is with resident sessions."""
        if self.settings.kv_pressure_gain == 0 or self.settings.mode != "predictive":
            return 0.0
        return self.placement.resident_fraction(worker, now)


EARLY_RETURN_QUANTILE = 0.2  # the spread sent to the plugin reaches down to this quantile


def expected_return(dist, elapsed: float = 0.0) -> tuple[float | None, float | None]:
    """(median time to the session's next request, how much earlier it may come: median - 20th
    percentile), both from now; (None, None) when the session is not expected back."""
    median = dist.median(elapsed)
    if median == float("inf"):
        return None, None
    early = dist.quantile(EARLY_RETURN_QUANTILE, elapsed)
    return median, max(0.0, median - min(early, median))
