"""Closed-loop trace replay against the simulated engine, in virtual time.

The same loop as ``sidecar_tools.benchmarks.replay`` (every session sends its whole conversation, waits for the
reply, sleeps its tool gap, appends reply + next tool result), with the same content
(``sidecar_tools.benchmarks.clients.GenerateClient`` ids), the same records (``sidecar_tools.benchmarks.records.TurnRecord``)
and the same run JSON / per-turn CSV (``summarize`` / ``save_run``), so ``sidecar_tools.benchmarks.report``
reads simulated and GPU runs alike. Nothing sleeps: client events and engine steps are ordered
on one virtual clock.

With a sidecar policy (``SidecarLoop``) the product's own ``sidecar.policy`` object, on the
product's session store, sits in front of the engine exactly as in ``sidecar/turn/core.py``:
admission of new sessions (the policy's synchronous ``offer_admission`` on the real
``AdmissionGate``, pumped in virtual time by the policy's own calls and the gate's poll interval),
``on_request``/``lease_request`` (the TTL and the expected return travel to the plugin in
``custom_params``), the after-turn revision through the engine's ``/set_internal_state``, ``on_turn_end``, ``release_admission`` and the
once-a-second ``close_due`` pass of the store.

``VirtualReplay(expected_back_oracle=True)`` sends the trace's own next gap as the expected return
instead of the policy's prediction - an upper bound for what-if runs, not a prediction.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sidecar_tools.benchmarks.clients import ClientOptions, GenerateClient, IdsConversation
from sidecar_tools.benchmarks.records import TurnRecord, summarize
from sidecar_tools.benchmarks.textgen import token_ids
from sidecar_tools.benchmarks.traces import Session, Trace
from sidecar_tools.simulator.engine import SimEngine, SimRequest
from sglang_ext.wire import EXPECTED_BACK_PARAM, EXPECTED_SPREAD_PARAM, lease_params

from sidecar.engine.generate import after_turn_body
from sidecar.turn.core import worth_revising


# --------------------------------------------------------------------------------------------
# The sidecar's policy, in process


class SidecarLoop:
    """``sidecar.policy.build_policy`` on a session store, driven by virtual time (what
    ``sidecar/turn/core.py`` calls)."""

    def __init__(self, settings: Any, kv_tokens: int, clock: Callable[[], float], host_tokens: int = 0):
        from sidecar.conversation.store import SessionStore
        from sidecar.policy import EngineCapacity, build_policy

        self.settings = settings
        capacity = EngineCapacity(max_total_num_tokens=kv_tokens, host_tokens=host_tokens)
        self.policy = build_policy(settings, capacity, clock=clock)
        self.sessions = SessionStore(self.policy, settings.server.max_sessions)
        self.clock = clock
        self.rejected = 0
        self.sent: dict[str, Any] = {}  # session -> the lease its running request asked for
        # the engine's /set_internal_state, where the session_ttl plugin runs (as the turn core
        # sends the after-turn revision only to a worker with the plugin)
        self.revise: Callable[[dict[str, float]], Any] | None = None

    @property
    def gate(self) -> Any:
        return self.policy.gate

    def admit(self, session_id: str, prompt_tokens: int, is_new_session: bool, proceed: Callable[[], None]) -> bool:
        """``await policy.admit(...)`` without a loop: proceed() now or when the gate lets the
        session through; False when the queue is full (the sidecar answers 429)."""
        from sidecar.policy import AdmissionRejected

        session, _ = self.sessions.open(session_id)
        session.inflight += 1  # from here on, as in the turn core: a waiting session is in use
        try:
            self.policy.offer_admission(session_id, prompt_tokens, is_new_session, on_grant=proceed)
        except AdmissionRejected:
            session.inflight -= 1
            self.rejected += 1
            return False
        return True

    def waiting(self) -> int:
        return self.gate.queue_length

    def poll_interval(self) -> float:
        return self.gate.settings.poll_interval

    def start_turn(self, session_id: str, prompt_tokens: int) -> dict[str, float] | None:
        """on_request + lease_request; the custom_params to send (None = no lease)."""
        now = self.clock()
        self.policy.on_request(session_id, prompt_tokens, now)
        lease = self.sent[session_id] = self.policy.lease_request(session_id, prompt_tokens, now)
        return lease_params(lease.ttl_s, lease.expected_back_s, lease.spread_s) if lease is not None else None

    def end_turn(self, session_id: str, context_tokens: int, tool_names: list[str], ok: bool) -> None:
        from sidecar.policy import TurnEnd

        if ok:
            now = self.clock()
            self.policy.on_turn_end(TurnEnd(session_id, context_tokens, tool_names, now))
            revised = self.policy.after_turn(session_id, now)
            if revised is not None and self.revise is not None and worth_revising(self.sent.get(session_id), revised):
                self.revise(after_turn_body(session_id, revised)["server_args"])  # the plugin's channel
                self.policy.lease_revised(session_id, revised, now)
        self.sessions.get(session_id).inflight -= 1
        self.policy.release_admission(session_id)

    def due_closes(self) -> list[str]:
        """The store's close_due: sessions the policy closes now (not those in flight)."""
        return self.sessions.close_due(self.clock())

    def client_close(self, session_id: str) -> None:
        """DELETE /v1/sessions/{id} or /close_session to the sidecar."""
        session = self.sessions.get(session_id)
        if session is not None:
            self.sessions.forget(session, "client")


# --------------------------------------------------------------------------------------------
# The replay


@dataclass
class _SessionState:
    session: Session
    conv: IdsConversation
    client_wait_s: float = 0.0
    k: int = 0
    done: bool = False


@dataclass(order=True)
class _Event:
    t: float
    seq: int
    fn: Callable[[float], None] = field(compare=False)


class VirtualReplay:
    def __init__(self, trace: Trace, engine: SimEngine, opts: ClientOptions, *,
                 max_concurrent_sessions: int | None = None, time_limit_s: float | None = None,
                 sidecar: SidecarLoop | None = None, stop_on_error: bool = False,
                 on_turn: Callable[[TurnRecord], None] | None = None, expected_back_oracle: bool = False):
        """``on_turn`` hears of every turn that ended (a progress bar)."""
        self.trace, self.engine, self.opts = trace, engine, opts
        self.on_turn = on_turn
        self.client = GenerateClient(None, "", trace, opts)  # only its content/ids logic is used
        self.max_concurrent = max_concurrent_sessions
        self.time_limit_s = time_limit_s
        self.sidecar = sidecar
        if sidecar is not None and engine.mgr is not None:
            sidecar.revise = engine.set_internal_state
        self.stop_on_error = stop_on_error
        self.expected_back_oracle = expected_back_oracle
        self.records: list[TurnRecord] = []
        self._events: list[_Event] = []
        self._seq = itertools.count()
        self._active = 0
        self._queued: list[_SessionState] = []
        self._states = [_SessionState(s, self.client.start(s)) for s in trace.sessions]
        self._unfinished = len(self._states)
        self._rid = itertools.count()
        self.clock_now = 0.0
        self._lifecycle_scheduled = False
        self._poll_scheduled = False

    # ------------------------------------------------------------------ events
    def _at(self, t: float, fn: Callable[[float], None]) -> None:
        heapq.heappush(self._events, _Event(t, next(self._seq), fn))

    def now(self) -> float:
        return self.clock_now

    def run(self) -> tuple[dict[str, Any], list[TurnRecord]]:
        wall0 = time.monotonic()
        engine = self.engine
        for st in self._states:  # a session arrives at its start_s and waits there for a client slot
            self._at(st.session.start_s, lambda t, st=st: self._arrive(st, t))
        if self.sidecar is not None:
            self._schedule_lifecycle(0.0)
        timed_out = False
        while True:
            t_ev = self._events[0].t if self._events else None
            if self.time_limit_s is not None and min(x for x in (engine.now, t_ev) if x is not None) >= self.time_limit_s:
                timed_out = self._unfinished > 0
                break
            if t_ev is not None and t_ev <= engine.now:
                ev = heapq.heappop(self._events)
                self.clock_now = ev.t
                ev.fn(ev.t)
                continue
            if self._unfinished == 0 and engine.idle():
                break
            if engine.busy:
                horizon = t_ev
                if self.time_limit_s is not None:
                    horizon = self.time_limit_s if horizon is None else min(horizon, self.time_limit_s)
                engine.step(horizon=horizon)
                continue
            wake = engine.next_wakeup()
            nxt = [x for x in (t_ev, wake) if x is not None]
            if not nxt:
                break  # nothing will ever happen again
            engine.advance_idle(min(nxt))
        makespan = max(engine.now, self.clock_now) if not timed_out else float(self.time_limit_s)
        if self._unfinished == 0:
            makespan = self._last_end
        for rec in self.records:
            if rec.end_s is None:
                rec.error = rec.error or "cancelled: time limit"
        wall_s = time.monotonic() - wall0
        return self._run_dict(makespan, timed_out, wall_s), sorted(self.records, key=lambda r: (r.send_s, r.session, r.turn))

    _last_end = 0.0

    # ------------------------------------------------------------------ client side
    def _arrive(self, st: _SessionState, t: float) -> None:
        if self.max_concurrent and self._active >= self.max_concurrent:
            self._queued.append(st)
            return
        self._active += 1
        self._send(st, t)

    def _send(self, st: _SessionState, t: float) -> None:
        session, k = st.session, st.k
        rnd = session.rounds[k]
        last = k == len(session.rounds) - 1
        sid = self.client.session_id(session)
        rec = TurnRecord(session=sid, turn=k, client_wait_s=st.client_wait_s if k == 0 else 0.0,
                         history_tokens=self.client.history_tokens(st.conv), tool_wait_s=0.0 if last else rnd.tool_wait_s)
        rec.send_s = t
        self.records.append(rec)
        ids = st.conv.ids + self.client.new_ids(st.conv, k, rnd)
        if self.sidecar is None:
            self._submit(st, rec, ids, lease_params(self.opts.lease_ttl_s) if self.opts.lease_ttl_s is not None else None)
            return
        ok = self.sidecar.admit(sid, len(ids), k == 0,
                                proceed=lambda: self._submit(st, rec, ids, self.sidecar.start_turn(sid, len(ids))))
        if not ok:
            rec.error = "http 429: admission queue full"
            rec.end_s = self.clock_now
            self._complete(st, rec, ids, [], ok=False)
        elif self.sidecar.waiting():
            self._schedule_poll()

    def _submit(self, st: _SessionState, rec: TurnRecord, ids: list[int], custom: dict[str, float] | None) -> None:
        session, k = st.session, st.k
        rnd = session.rounds[k]
        sid = self.client.session_id(session)
        if custom is not None and self.expected_back_oracle:
            custom = {**custom, **self._oracle_return(st)}
        sim = SimRequest(
            rid=f"sim-{next(self._rid)}", input_ids=ids, max_new_tokens=rnd.output_tokens,
            session_id=sid if self.opts.send_session_id else None, ignore_eos=True, custom_params=custom,
            output_source=lambda n, key=f"{sid}/o{k}": token_ids(key, n),
            on_update=lambda s: self._on_reply(st, rec, ids, s),
        )
        try:
            self.engine.submit(sim)
        except ValueError as exc:
            rec.error = f"http 400: {exc}"[:300]
            rec.end_s = self.clock_now
            self._complete(st, rec, ids, [], ok=False)
            return
        self.engine.notify()

    def _oracle_return(self, st: _SessionState) -> dict[str, float]:
        """The expected return the trace knows: its next gap, exactly (none after the last turn)."""
        if st.k == len(st.session.rounds) - 1:
            return {}
        return {EXPECTED_BACK_PARAM: st.session.rounds[st.k].tool_wait_s, EXPECTED_SPREAD_PARAM: 0.0}

    def _on_reply(self, st: _SessionState, rec: TurnRecord, ids: list[int], sim: SimRequest) -> None:
        if not sim.finished:
            return
        self.clock_now = sim.finish_s
        ok = sim.finish_reason.get("type") != "abort"
        if sim.first_token_s is not None:
            rec.ttft_s = sim.first_token_s - rec.send_s
        rec.end_s = sim.finish_s
        rec.prompt_tokens = len(ids)
        rec.cached_tokens = sim.cached_tokens
        rec.completion_tokens = len(sim.output_ids)
        if not ok:
            rec.error = f"aborted: {sim.finish_reason.get('message')}"
        rec.ok = ok
        self._complete(st, rec, ids, sim.output_ids, ok)

    def _complete(self, st: _SessionState, rec: TurnRecord, ids: list[int], output: list[int], ok: bool) -> None:
        session, k = st.session, st.k
        rnd = session.rounds[k]
        sid = self.client.session_id(session)
        if not ok:  # keep the planned shape (sidecar_tools.benchmarks.clients.GenerateClient)
            output = output + token_ids(f"{sid}/o{k}", rnd.output_tokens)[len(output):]
        st.conv.ids = ids + list(output)
        now = self.clock_now
        if self.sidecar is not None and rec.error != "http 429: admission queue full":
            self.sidecar.end_turn(sid, len(st.conv.ids), [n for n in rnd.called_tools() or [] if n], ok)
        self._last_end = max(self._last_end, now)
        if self.on_turn is not None:
            self.on_turn(rec)
        last = k == len(session.rounds) - 1
        if last or (not ok and self.stop_on_error):
            self._finish_session(st, now)
            return
        st.k += 1
        self._at(now + rnd.tool_wait_s, lambda t: self._send(st, t))

    def _finish_session(self, st: _SessionState, now: float) -> None:
        st.done = True
        self._unfinished -= 1
        sid = self.client.session_id(st.session)
        if self.opts.close_sessions:
            if self.sidecar is not None:
                self.sidecar.client_close(sid)
            self.engine.close_session(sid)
            self.engine.notify()
        self._active -= 1
        if self._queued:
            nxt = self._queued.pop(0)
            nxt.client_wait_s = now - nxt.session.start_s
            self._active += 1
            self._at(now, lambda t, st=nxt: self._send(st, t))

    # ------------------------------------------------------------------ sidecar housekeeping
    def _schedule_lifecycle(self, t: float) -> None:
        def tick(t_now: float) -> None:
            for sid in self.sidecar.due_closes():
                self.engine.close_session(sid)
                self.engine.notify()
            if self._unfinished:
                self._at(t_now + 1.0, tick)

        self._at(t + 1.0, tick)

    def _schedule_poll(self) -> None:
        if self._poll_scheduled:
            return
        self._poll_scheduled = True

        def poll(t_now: float) -> None:
            self._poll_scheduled = False
            self.sidecar.gate.pump()
            if self.sidecar.waiting():
                self._schedule_poll()

        wake = self.clock_now + self.sidecar.poll_interval()
        deadline = self.sidecar.gate.next_deadline()  # the head's max_wait: exactly then, not at the next poll
        self._at(wake if deadline is None else max(self.clock_now, min(wake, deadline)), poll)

    # ------------------------------------------------------------------ report
    def _run_dict(self, makespan: float, timed_out: bool, wall_s: float) -> dict[str, Any]:
        engine = self.engine
        planned = sum(len(s.rounds) for s in self.trace.sessions)
        summary = summarize(self.records, makespan, planned)
        summary["timed_out"] = timed_out
        summary["sessions"] = len(self.trace.sessions)
        summary["sessions_unfinished"] = self._unfinished
        counters = {k: round(v, 6) for k, v in engine.counters.items() if v}
        sim_info: dict[str, Any] = {
            "wall_s": round(wall_s, 3),
            "engine_busy_s": {k: round(v, 3) for k, v in engine.busy_s.items()},
            "lease_metrics": engine.lease_metrics(),
        }
        if self.sidecar is not None:
            sim_info["admission_rejected"] = self.sidecar.rejected
        return {
            "summary": summary,
            "config": {"mode": "simulate", "lease_ttl_s": self.opts.lease_ttl_s,
                       "close_sessions": self.opts.close_sessions, "send_session_id": self.opts.send_session_id,
                       "max_concurrent_sessions": self.max_concurrent, "time_limit_s": self.time_limit_s,
                       "salt": self.opts.salt},
            "trace": {"name": self.trace.name, "stats": self.trace.stats(), "meta": self.trace.meta},
            "metrics": {"engine": {"counters": counters, "gauges_after": engine.gauges()}},
            "simulator": sim_info,
        }
