"""The residency counters equal a full recount of the session records after any sequence of
turns, leases, placements, re-homes, closes and time passing (the gate, the pressure term and
/metrics read the counters instead of scanning every session)."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from policy_helpers import FakeClock, make_policy

from sidecar.engine.capacity import EngineCapacity
from sidecar.policy import TurnEnd

WORKERS = ("w0", "w1")
SESSIONS = ["s0", "s1", "s2"]
OPS = ("open", "admit_new", "admit_continuing", "request", "turn_end", "release", "relocate", "unplace",
       "close", "close_due", "advance")


# a revision that moves only a lease's expiry (earlier) must still end the lease then
REVISED_EXPIRY_ONLY = [("open", "s0", 0.0), ("open", "s1", 0.0), ("request", "s0", 0.5), ("turn_end", "s1", 0.0),
                       ("close", "s1", 0.0), ("turn_end", "s0", 12.0), ("advance", "s0", 12.0)]


def recount(policy, now: float, worker: str) -> dict[str, float]:  # noqa: C901
    """The definitions of ``sidecar.policy.residency``, counted over every record."""
    out = dict.fromkeys(("sessions", "leases", "running", "running_tokens", "resident", "resident_tokens",
                         "holding", "holding_tokens", "holding_turns_left"), 0)
    turns = policy.admission_settings.host_tier_projection_turns
    for r in policy.sessions.records():
        if r.worker != worker:
            continue
        running = r.running > 0
        leased = r.lease_expires_at is not None and now < r.lease_expires_at
        out["sessions"] += 1
        out["leases"] += leased
        if running:
            out["running"] += 1
            out["running_tokens"] += r.context_tokens
        if running or leased:
            out["resident"] += 1
            out["resident_tokens"] += r.context_tokens
        if running or leased or r.holds_kv():
            out["holding"] += 1
            out["holding_tokens"] += r.context_tokens
            taken = r.turns if policy.admission_settings.host_tier_projection != "full" else 0
            out["holding_turns_left"] += max(turns - taken, 1.0)
    return out


def apply(policy, clock, op: str, sid: str, x: float) -> None:
    store = policy.sessions
    record = store.record(sid)
    if op == "open":
        store.open(sid)
    elif record is None:
        return
    elif op == "admit_new":
        policy.offer_admission(sid, 1000 + int(x * 100), True)
    elif op == "admit_continuing":
        policy.offer_admission(sid, 1000 + int(x * 100), False)
    elif op == "request":
        policy.on_request(sid, record.context_tokens + int(x * 50), clock.now)
        policy.lease_request(sid, record.context_tokens, clock.now)
    elif op == "turn_end":
        policy.on_turn_end(TurnEnd(sid, record.context_tokens + 100, ["bash"], clock.now))
        revised = policy.after_turn(sid, clock.now)
        if revised is not None and x > 10:
            policy.lease_revised(sid, revised, clock.now)
    elif op == "release":
        policy.release_admission(sid)
    elif op == "relocate":
        policy.relocate(sid, WORKERS[int(x) % 2])
    elif op == "unplace":
        policy.relocate(sid, None)
    elif op == "close":
        store.forget(store.get(sid), "client")
    elif op == "close_due":
        store.close_due(clock.now)
    elif op == "advance":
        clock.advance(x)


@pytest.mark.parametrize("host_tokens", [0, 50_000])
@pytest.mark.parametrize("shrink", ["full", "remaining", "peak"])
@settings(max_examples=150, deadline=None)
@example(steps=REVISED_EXPIRY_ONLY)
@given(steps=st.lists(st.tuples(st.sampled_from(OPS), st.sampled_from(SESSIONS),
                                st.sampled_from([0.0, 0.5, 3.0, 12.0, 25.0])), min_size=20, max_size=80))
def test_counters_equal_a_full_recount(host_tokens, shrink, steps):
    clock = FakeClock()
    policy = make_policy(clock=clock, capacity=100_000, idle_grace_s=5.0,
                         policy={"mode": "predictive", "min_ttl": 1.0, "max_ttl": 20.0},
                         admission={"enabled": True, "max_wait": 10.0, "host_tier_projection": shrink}, worker="w0")
    policy.set_capacity(EngineCapacity(100_000, host_tokens=host_tokens), "w0")
    policy.set_capacity(EngineCapacity(100_000, host_tokens=host_tokens), "w1")
    assert set(policy.placement.capacities) == set(WORKERS)
    for op, sid, x in steps:
        apply(policy, clock, op, sid, x)
        for worker in (*WORKERS, None):
            load = policy.residency.load(worker, clock.now, alone=False)
            expected = recount(policy, clock.now, worker)
            counted = {k: getattr(load, k) for k in expected}
            assert counted == pytest.approx(expected), (op, sid, worker)
            idle = {r.session_id for r in policy.sessions.records() if r.worker == worker and r.running == 0
                    and r.lease_expires_at is not None and clock.now < r.lease_expires_at}
            assert set(load.idle_leased) == idle
            holding = {r.session_id for r in policy.sessions.records() if r.worker == worker and (
                r.running > 0 or r.holds_kv() or (r.lease_expires_at is not None and clock.now < r.lease_expires_at))}
            assert set(load.holding_records) == holding
