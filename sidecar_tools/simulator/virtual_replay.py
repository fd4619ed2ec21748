"""Closed-loop trace replay against the simulated engine, in virtual time.

The same loop as ``sidecar_tools.benchmarks.replay`` (every session sends its whole conversation, waits for the
reply, sleeps its tool gap, appends reply + next tool result), with the same content
(``sidecar_tools.benchmarks.clients.GenerateClient`` ids), the same records (``sidecar_tools.benchmarks.records.TurnRecord``)
and the same run JSON / per-turn CSV (``summarize`` / ``save_run``), so ``sidecar_tools.benchmarks.report``
reads simulated and GPU runs alike. Nothing sleeps: client events and engine steps are ordered
on one virtual clock.

With a sidecar policy (``SidecarLoop``) the product's own ``sidecar.policy`` object, on the
product's session store, sits in front of the engine making the turn core's own policy calls
(``sidecar.turn.policy_calls``, the sequence ``sidecar.turn.core.Turn`` makes):
admission of new sessions (the policy's synchronous ``offer_admission`` on the real
``AdmissionGate``, pumped in virtual time by the policy's own calls and the gate's poll interval),
``on_request``/``lease_request`` (the TTL and the expected return travel to the plugin in
``custom_params``), the after-turn revision through the engine's ``/set_internal_state``, ``on_turn_end``, ``release_admission`` and the
once-a-second ``close_due`` pass of the store.

``VirtualReplay(expected_back_oracle=True)`` sends the trace's own next gap as the expected return
instead of the policy's prediction - an upper bound for what-if runs, not a prediction.

Several workers (``VirtualReplay(trace, [engine, ...])``, ``workers.WorkerSet``): a new session is
placed by the policy's own placement (``LeasePolicy.choose`` through the admission gate, or forced
when admission is off), every later turn goes to its worker, and the engines advance on the one
virtual clock, the one furthest behind first, none stepping past another's clock (a finish on one
may send a request to another). Without a sidecar the replay places sessions with a policy of its
own that only places (``SidecarLoop.placement``: mode off, admission off: the roomiest worker by
projected footprint). ``worker_losses`` kill a worker at a virtual time: its in-flight requests
fail (the agent resends the turn after ``RETRY_AFTER_S``, as an OpenAI client retries a 502), its
sessions are re-homed on their next turn (``LeasePolicy.relocate(sid, None)``, as ``sidecar.engine.fleet.Fleet``
does) and recomputed there, unless a ``l3_store_model.SharedL3`` store holds their KV: then the first
turn on the new worker reads it back first.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sidecar_tools.benchmarks.clients import ClientOptions, GenerateClient, IdsConversation
from sidecar_tools.benchmarks.records import TurnRecord, summarize
from sidecar_tools.benchmarks.textgen import token_ids
from sidecar_tools.benchmarks.traces import Session, Trace
from sidecar_tools.simulator.engine import SimEngine, SimRequest
from sidecar_tools.simulator.l3_store_model import SharedL3, break_even_gbps
from sidecar_tools.simulator.workers import SimWorker, WorkerLoss, WorkerSet, check_losses, worker_names
from sglang_ext.wire import EXPECTED_BACK_PARAM, EXPECTED_SPREAD_PARAM, lease_params

from sidecar.engine.generate import after_turn_body
from sidecar.turn.policy_calls import turn_finished, turn_started


# --------------------------------------------------------------------------------------------
# The sidecar's policy, in process


class SidecarLoop:
    """``sidecar.policy.build_policy`` on a session store, driven by virtual time through the
    turn's own policy calls (``sidecar.turn.policy_calls``)."""

    def __init__(self, settings: Any, kv_tokens: int, clock: Callable[[], float], host_tokens: int = 0,
                 workers: int = 1, placement_only: bool = False, host_write_policy: str = "write_through"):
        """``workers`` identical workers of ``kv_tokens`` (+ ``host_tokens``) each, registered as
        ``build_core`` registers them (the first through ``build_policy``, the rest by ``set_capacity``)."""
        from sidecar.conversation.store import SessionStore
        from sidecar.policy import EngineCapacity, build_policy

        self.settings = settings
        capacity = EngineCapacity(max_total_num_tokens=kv_tokens, host_tokens=host_tokens,
                                  host_write_policy=host_write_policy)
        self.worker_names = worker_names(workers)
        first, *others = self.worker_names
        # registering a worker pumps the gate, before the replay (and its clock) exists: time 0 then
        self.clock: Callable[[], float] = lambda: 0.0
        self.policy = build_policy(settings, capacity, clock=lambda: self.clock(), worker=first)
        for name in others:
            self.policy.set_capacity(capacity, name)
        self.sessions = SessionStore(self.policy, settings.server.max_sessions)
        self.clock = clock
        # only placement (no leases, no closes sent): the replay's own placement without a sidecar
        self.placement_only = placement_only
        self.rejected = 0
        self.sent: dict[str, Any] = {}  # session -> the lease its running request asked for
        # (session id, server_args) -> the session's worker's /set_internal_state, where the
        # session_ttl plugin runs (as the turn core sends the after-turn revision only to a worker
        # with the plugin)
        self.revise: Callable[[str, dict[str, float]], Any] | None = None

    @classmethod
    def placement(cls, kv_tokens: int, clock: Callable[[], float], host_tokens: int, workers: int) -> SidecarLoop:
        """The policy's placement alone, for several workers without a sidecar in front: mode off
        (no leases), admission off (a new session goes to the roomiest worker at once)."""
        from sidecar.settings import load_settings

        settings = load_settings(None, {"policy": {"mode": "off"}, "admission": {"enabled": False}})
        return cls(settings, kv_tokens, clock, host_tokens, workers=workers, placement_only=True)

    @property
    def gate(self) -> Any:
        return self.policy.gate

    def admit(self, session_id: str, prompt_ids: list[int], is_new_session: bool, proceed: Callable[[], None]) -> bool:
        """``await policy.admit(...)`` without a loop: proceed() now or when the gate lets the
        session through; False when the queue is full (the sidecar answers 429)."""
        from sidecar.policy import AdmissionRejected

        session, _ = self.sessions.open(session_id)
        session.inflight += 1  # from here on, as in the turn core: a waiting session is in use
        try:
            self.policy.offer_admission(session_id, len(prompt_ids), is_new_session, on_grant=proceed, prompt_ids=prompt_ids)
        except AdmissionRejected:
            session.inflight -= 1
            self.rejected += 1
            return False
        return True

    def waiting(self) -> int:
        """Requests the gate holds: new sessions and paced sessions' later turns."""
        return self.gate.queue_length + self.gate.turns_waiting

    def worker_of(self, session_id: str) -> str | None:
        return self.policy.worker_of(session_id)

    def worker_lost(self, worker: str) -> None:
        """The sidecar saw the worker fail: no new sessions go there (``Fleet.watch``)."""
        self.policy.set_placeable(worker, False)

    def rehome(self, session_id: str) -> None:
        """The session's worker is gone: placement chooses again for its next request."""
        self.policy.relocate(session_id, None)

    def poll_interval(self) -> float:
        return self.gate.settings.poll_interval

    def start_turn(self, session_id: str, prompt_tokens: int) -> dict[str, float] | None:
        """on_request + lease_request; the custom_params to send (None = no lease)."""
        lease = self.sent[session_id] = turn_started(self.policy, session_id, prompt_tokens, self.clock())
        return lease_params(lease.ttl_s, lease.expected_back_s, lease.spread_s) if lease is not None else None

    def end_turn(self, session_id: str, context_tokens: int, tool_names: list[str], ok: bool) -> None:
        if ok:
            send = self.revise
            revise = (lambda lease: send(session_id, after_turn_body(session_id, lease)["server_args"])) if send else None
            turn_finished(self.policy, session_id, context_tokens, tool_names, self.sent.get(session_id), self.clock(), revise)
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


RETRY_AFTER_S = 0.5  # an OpenAI client's first retry of a 502/503 (openai-python: 0.5 s initial delay)
WORKER_LOST = "http 502: worker lost"


@dataclass
class _SessionState:
    session: Session
    conv: IdsConversation
    client_wait_s: float = 0.0
    k: int = 0
    done: bool = False
    worker: SimWorker | None = None  # where its last turn went
    rehomed: bool = False  # its worker was lost: the next turn starts on another (until one succeeds)
    stored_tokens: int = 0  # of its KV, written through to the shared L3 store


@dataclass(order=True)
class _Event:
    t: float
    seq: int
    fn: Callable[[float], None] = field(compare=False)


class VirtualReplay:
    def __init__(self, trace: Trace, engine: SimEngine | Sequence[SimEngine], opts: ClientOptions, *,
                 max_concurrent_sessions: int | None = None, time_limit_s: float | None = None,
                 sidecar: SidecarLoop | None = None, stop_on_error: bool = False,
                 on_turn: Callable[[TurnRecord], None] | None = None, expected_back_oracle: bool = False,
                 worker_losses: Sequence[WorkerLoss] = (), shared_l3: SharedL3 | None = None,
                 report_workers: bool | None = None):
        """``engine``: one SimEngine, or one per worker. ``on_turn`` hears of every turn that ended
        (a progress bar). ``report_workers``: the run JSON gets ``workers`` and ``faults`` entries
        (default: with several workers; a one-engine run keeps the JSON it always had)."""
        self.trace, self.opts = trace, opts
        self.workers = WorkerSet(engine)
        self.engine = self.workers[0].engine  # the first worker's (the only one, with one worker)
        check_losses(worker_losses, len(self.workers))
        self.worker_losses = list(worker_losses)
        self.l3 = shared_l3
        self.report_workers = len(self.workers) > 1 if report_workers is None else report_workers
        self.on_turn = on_turn
        self.client = GenerateClient(None, "", trace, opts)  # only its content/ids logic is used
        self.max_concurrent = max_concurrent_sessions
        self.time_limit_s = time_limit_s
        if sidecar is None and len(self.workers) > 1:
            sidecar = SidecarLoop.placement(self.engine.kv_tokens, lambda: self.clock_now,
                                            self.engine.host_pool_tokens() or 0, len(self.workers))
        if sidecar is not None and sidecar.worker_names != self.workers.names:
            raise ValueError(f"the sidecar knows workers {sidecar.worker_names}, the replay has {self.workers.names}")
        self.sidecar = sidecar
        if sidecar is not None and self.engine.mgr is not None:
            sidecar.revise = self._revise
        self.stop_on_error = stop_on_error
        self.expected_back_oracle = expected_back_oracle
        self.records: list[TurnRecord] = []
        self.rehomed_records: list[TurnRecord] = []  # the first turn of each re-homed session on its new worker
        self.rehomed_sessions = 0
        self.rehome_history_tokens = 0  # what the live sidecar counts (sidecar_rehomed_recompute_tokens_total)
        self._events: list[_Event] = []
        self._seq = itertools.count()
        self._active = 0
        self._queued: list[_SessionState] = []
        self._states = [_SessionState(s, self.client.start(s)) for s in trace.sessions]
        self._unfinished = len(self._states)
        self._by_sid = {self.client.session_id(st.session): st for st in self._states}
        # request id -> its turn and worker, in the order sent (a lost worker fails them in that order)
        self._inflight: dict[str, tuple[_SessionState, TurnRecord, SimWorker]] = {}
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
        for st in self._states:  # a session arrives at its start_s and waits there for a client slot
            self._at(st.session.start_s, lambda t, st=st: self._arrive(st, t))
        for loss in self.worker_losses:
            self._at(loss.at_s, lambda t, w=self.workers[loss.index]: self._lose(w, t))
        if self.sidecar is not None:
            self._schedule_lifecycle(0.0)
        timed_out = False
        while True:
            t_ev = self._events[0].t if self._events else None
            live = self.workers.live()
            if self.time_limit_s is not None and self._clock_floor(live, t_ev) >= self.time_limit_s:
                timed_out = self._unfinished > 0
                break
            if t_ev is not None and all(t_ev <= w.engine.now for w in live):
                ev = heapq.heappop(self._events)
                self.clock_now = ev.t
                ev.fn(ev.t)
                continue
            if self._unfinished == 0 and all(w.engine.idle() for w in live):
                break
            worker, until = self._next_to_act(live, t_ev)
            if worker is None:
                break  # nothing will ever happen again
            if worker.engine.busy:
                worker.engine.step(horizon=until)
                worker.sample()
            else:
                worker.engine.advance_idle(until)
        makespan = max(max(w.engine.now for w in self.workers), self.clock_now) if not timed_out \
            else float(self.time_limit_s)
        if self._unfinished == 0:
            makespan = self._last_end
        for rec in self.records:
            if rec.end_s is None:
                rec.error = rec.error or "cancelled: time limit"
        wall_s = time.monotonic() - wall0
        return self._run_dict(makespan, timed_out, wall_s), sorted(self.records, key=lambda r: (r.send_s, r.session, r.turn))

    _last_end = 0.0

    def _clock_floor(self, live: list[SimWorker], t_ev: float | None) -> float:
        """The earliest clock that can still move: the next event's, or a worker's that has work
        (a lone worker's counts whatever it does, as with one engine)."""
        moving = [w.engine.now for w in live if not w.dormant()] or [w.engine.now for w in live]
        return min(x for x in (*moving, t_ev) if x is not None)

    def _next_to_act(self, live: list[SimWorker], t_ev: float | None) -> tuple[SimWorker | None, float | None]:
        """The worker furthest behind that can act, and how far it may go: up to the next event,
        the time limit and the next action of every other worker (its clock if busy, its wake-up if
        idle: a finish there may send this one a request, so none runs past another). With one
        worker: the engine, up to the next event (or its wake-up), as ever."""
        nxt = {w: (w.engine.now if w.engine.busy else w.engine.next_wakeup()) for w in live} if len(live) > 1 else {}
        best: tuple[float, SimWorker, float | None] | None = None
        held: tuple[float, SimWorker, float | None] | None = None  # idle, waiting for the others
        for w in live:
            engine = w.engine
            bound = _earliest(*(t for o, t in nxt.items() if o is not w))
            if engine.busy:
                until = _earliest(t_ev, self.time_limit_s, bound)
            else:
                until = _earliest(t_ev, engine.next_wakeup())
                if until is None:
                    continue  # dormant, and no event to move it to
                if bound is not None and bound <= engine.now:
                    if held is None or engine.now < held[0]:
                        held = (engine.now, w, until)
                    continue  # another worker acts first at its clock
                until = _earliest(until, bound)
            if best is None or engine.now < best[0]:
                best = (engine.now, w, until)
        best = best or held  # only idle workers whose next moments coincide: any may go
        return (best[1], best[2]) if best is not None else (None, None)

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
        if self.sidecar is None:  # one worker, no placement
            if st.worker is None:
                st.worker = self.workers[0]
                st.worker.load.sessions_placed += 1
            self._submit(st, rec, ids, lease_params(self.opts.lease_ttl_s) if self.opts.lease_ttl_s is not None else None)
            return
        self._rehome_if_lost(st, sid)
        ok = self.sidecar.admit(sid, ids, k == 0, proceed=lambda: self._granted(st, rec, ids))
        if not ok:
            rec.error = "http 429: admission queue full"
            rec.end_s = self.clock_now
            self._complete(st, rec, ids, [], ok=False)
        elif self.sidecar.waiting():
            self._schedule_poll()

    def _rehome_if_lost(self, st: _SessionState, sid: str) -> None:
        """``Fleet.rehome_if_lost``: a session whose worker is lost is placed afresh, its whole
        history recomputed on the new worker (or read from the shared L3 store), and counted."""
        worker = self.workers.named(self.sidecar.worker_of(sid))
        if worker is None or worker.up:
            return
        self.sidecar.rehome(sid)
        st.rehomed = True
        self.rehomed_sessions += 1
        self.rehome_history_tokens += len(st.conv.ids)

    def _granted(self, st: _SessionState, rec: TurnRecord, ids: list[int]) -> None:
        """The gate let the turn through: it goes to the worker placement gave the session."""
        sid = self.client.session_id(st.session)
        worker = self.workers.named(self.sidecar.worker_of(sid)) or self.workers[0]
        if worker is not st.worker:
            worker.load.sessions_placed += 1
            st.worker = worker
        waited = self.clock_now - rec.send_s
        if st.k == 0 and waited > 0:
            worker.load.admission_waits += 1
            worker.load.admission_wait_s += waited
        if self.sidecar.placement_only:
            self.sidecar.start_turn(sid, len(ids))  # the records placement projects from
            custom = lease_params(self.opts.lease_ttl_s) if self.opts.lease_ttl_s is not None else None
        else:
            custom = self.sidecar.start_turn(sid, len(ids))
        self._submit(st, rec, ids, custom)

    def _submit(self, st: _SessionState, rec: TurnRecord, ids: list[int], custom: dict[str, float] | None) -> None:
        session, k = st.session, st.k
        rnd = session.rounds[k]
        sid = self.client.session_id(session)
        if custom is not None and self.expected_back_oracle:
            custom = {**custom, **self._oracle_return(st)}
        worker = st.worker
        sim = SimRequest(
            rid=f"sim-{next(self._rid)}", input_ids=ids, max_new_tokens=rnd.output_tokens,
            session_id=sid if self.opts.send_session_id else None, ignore_eos=True, custom_params=custom,
            output_source=lambda n, key=f"{sid}/o{k}": token_ids(key, n),
            on_update=lambda s: self._on_reply(st, rec, ids, s, worker),
        )
        delay = 0.0
        if st.rehomed:
            self.rehomed_records.append(rec)
            delay = self._read_from_l3(st, sid, ids, sim, worker)
        if delay > 0 or worker.engine.now < self.clock_now:  # it reaches the worker once its clock is there
            self._at(self.clock_now + delay, lambda t: self._deliver(st, rec, ids, sim, worker))
        else:
            self._deliver(st, rec, ids, sim, worker)

    def _read_from_l3(self, st: _SessionState, sid: str, ids: list[int], sim: SimRequest, worker: SimWorker) -> float:
        """A re-homed turn with a shared L3 store: the stored prefix beyond what the new worker
        holds already is read first (the request waits for it), then counted as cached there."""
        if self.l3 is None:
            return 0.0
        stored = min(self.l3.stored(sid, self.clock_now), len(ids))
        have = worker.engine.cached_prefix_len(ids[:stored]) if stored else 0
        if stored <= have:
            return 0.0
        sim.storage_range = (have, stored)
        return self.l3.read(stored - have)

    def _deliver(self, st: _SessionState, rec: TurnRecord, ids: list[int], sim: SimRequest, worker: SimWorker) -> None:
        if not worker.up:  # connection refused: a 502 the agent retries
            self._fail_and_retry(st, rec, self.clock_now)
            return
        try:
            worker.engine.submit(sim)
        except ValueError as exc:
            rec.error = f"http 400: {exc}"[:300]
            rec.end_s = self.clock_now
            self._complete(st, rec, ids, [], ok=False)
            return
        self._inflight[sim.rid] = (st, rec, worker)
        worker.engine.notify()

    def _revise(self, session_id: str, server_args: dict[str, float]) -> None:
        worker = self.workers.named(self.sidecar.worker_of(session_id))
        if worker is not None and worker.up:
            worker.engine.set_internal_state(server_args)

    def _oracle_return(self, st: _SessionState) -> dict[str, float]:
        """The expected return the trace knows: its next gap, exactly (none after the last turn)."""
        if st.k == len(st.session.rounds) - 1:
            return {}
        return {EXPECTED_BACK_PARAM: st.session.rounds[st.k].tool_wait_s, EXPECTED_SPREAD_PARAM: 0.0}

    def _on_reply(self, st: _SessionState, rec: TurnRecord, ids: list[int], sim: SimRequest, worker: SimWorker) -> None:
        if not sim.finished or not worker.up:
            return
        self._inflight.pop(sim.rid, None)
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
        if ok:
            self._count_turn(st, worker, rec, sim)
        self._complete(st, rec, ids, sim.output_ids, ok)

    def _count_turn(self, st: _SessionState, worker: SimWorker, rec: TurnRecord, sim: SimRequest) -> None:
        load = worker.load
        load.turns_served += 1
        load.prompt_tokens += rec.prompt_tokens
        load.cached_tokens += rec.cached_tokens
        load.recomputed_tokens += rec.recomputed_tokens
        load.storage_read_tokens += sim.cached_tokens_storage
        st.rehomed = False
        if self.l3 is not None:  # write-through: prompt + output, less the last sampled token (never cached)
            stored = rec.prompt_tokens + rec.completion_tokens - 1
            self.l3.write(rec.session, stored, stored - st.stored_tokens, rec.end_s)
            st.stored_tokens = stored

    def _complete(self, st: _SessionState, rec: TurnRecord, ids: list[int], output: list[int], ok: bool) -> None:
        session, k = st.session, st.k
        rnd = session.rounds[k]
        sid = self.client.session_id(session)
        if not ok:  # keep the planned shape (sidecar_tools.benchmarks.clients.GenerateClient)
            output = output + token_ids(f"{sid}/o{k}", rnd.output_tokens)[len(output):]
        st.conv.ids = ids + list(output)
        now = rec.end_s
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

    def _fail_and_retry(self, st: _SessionState, rec: TurnRecord, now: float) -> None:
        """The turn's worker was lost under it: the agent sees a 502 and resends the same turn."""
        rec.error, rec.end_s, rec.ok = WORKER_LOST, now, False
        if st.worker is not None:
            st.worker.load.failed_requests += 1
        if self.sidecar is not None:
            self.sidecar.end_turn(self.client.session_id(st.session), len(st.conv.ids), [], ok=False)
        if self.on_turn is not None:
            self.on_turn(rec)
        self._at(now + RETRY_AFTER_S, lambda t: self._send(st, t))

    def _lose(self, worker: SimWorker, t: float) -> None:
        """The worker's process dies at ``t``: what runs there fails, and placement stops using it."""
        worker.up = False
        worker.lost_at_s = t
        if self.sidecar is not None:
            self.sidecar.worker_lost(worker.name)
        failed = [rid for rid, (_, _, w) in self._inflight.items() if w is worker]
        for rid in failed:  # the dead engine is never stepped again; its clients hear a 502
            st, rec, _ = self._inflight.pop(rid)
            self._fail_and_retry(st, rec, t)

    def _finish_session(self, st: _SessionState, now: float) -> None:
        st.done = True
        self._unfinished -= 1
        sid = self.client.session_id(st.session)
        if self.opts.close_sessions:
            if self.sidecar is not None:
                self.sidecar.client_close(sid)
            if st.worker is not None and st.worker.up:
                st.worker.engine.close_session(sid)
                st.worker.engine.notify()
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
                st = self._by_sid.get(sid)
                worker = st.worker if st is not None else self.workers[0]
                if not self.sidecar.placement_only and worker is not None and worker.up:
                    worker.engine.close_session(sid)
                    worker.engine.notify()
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
        if self.sidecar is not None and not self.sidecar.placement_only:
            sim_info["admission_rejected"] = self.sidecar.rejected
        run = {
            "summary": summary,
            "config": {"mode": "simulate", "lease_ttl_s": self.opts.lease_ttl_s,
                       "close_sessions": self.opts.close_sessions, "send_session_id": self.opts.send_session_id,
                       "max_concurrent_sessions": self.max_concurrent, "time_limit_s": self.time_limit_s,
                       "salt": self.opts.salt},
            "trace": {"name": self.trace.name, "stats": self.trace.stats(), "meta": self.trace.meta},
            "metrics": {"engine": {"counters": counters, "gauges_after": engine.gauges()}},
            "simulator": sim_info,
        }
        if self.report_workers:
            run["workers"] = self.workers.report(makespan)
            run["faults"] = self._faults_report()
            placement = "none" if self.sidecar is None else "placement-only" if self.sidecar.placement_only else "sidecar"
            run["config"]["workers"] = {"count": len(self.workers), "placement": placement,
                                        "losses": [f"{x.index}@{x.at_s:g}" for x in self.worker_losses],
                                        "shared_l3": self.l3.report() if self.l3 is not None else None}
        return run

    def _faults_report(self) -> dict[str, Any]:
        """What the worker losses cost: re-homed sessions and their first turns on the new worker."""
        rehomed = [r for r in self.rehomed_records if r.ok]
        ttfts = sorted(r.ttft_s for r in rehomed if r.ttft_s is not None)
        return {
            "failed_requests": sum(w.load.failed_requests for w in self.workers),
            "rehomed_sessions": self.rehomed_sessions,
            "rehome_history_tokens": self.rehome_history_tokens,
            "rehomed_turns": len(rehomed),
            "rehomed_recomputed_tokens": sum(r.recomputed_tokens for r in rehomed),
            "rehomed_l3_read_tokens": sum(w.load.storage_read_tokens for w in self.workers),
            "rehomed_ttft_mean_s": round(sum(ttfts) / len(ttfts), 4) if ttfts else None,
            "rehomed_ttft_max_s": round(ttfts[-1], 4) if ttfts else None,
            "l3": self.l3.report() if self.l3 is not None else None,
            "l3_break_even_gbps": self._break_even(rehomed),
        }

    def _break_even(self, rehomed: list[TurnRecord]) -> float | None:
        """The L3 bandwidth at which reading a re-homed turn's history (its mean, past the shared
        prefix) costs what prefilling it does (``l3_store_model.break_even_gbps``)."""
        if not rehomed:
            return None
        own = sum(max(r.history_tokens - self.trace.shared_prefix_tokens, 0) for r in rehomed) / len(rehomed)
        return round(break_even_gbps(self.engine.cost, round(own), self.trace.shared_prefix_tokens), 2)


def _earliest(*times: float | None) -> float | None:
    known = [t for t in times if t is not None]
    return min(known) if known else None
