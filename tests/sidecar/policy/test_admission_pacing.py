"""A session the door lets in at ``max_wait`` without room is paced (issue 24, ratio 1): each later
turn waits for room, before any new session, at most ``paced_turn_max_wait``.

What a user relies on: a new agent waits at the door at most ``max_wait``, and one let in then
does not thrash the agents that fit (on the 48-agent overload at ratio 1 the 20 agents let in at
60 s recomputed 41 % of the run's history); its later turns wait at most ``paced_turn_max_wait``
each; once it fits it runs like any other; where everyone fits (every ratio-3 run) nothing waits."""

from __future__ import annotations

import asyncio
import time

import pytest
from policy_helpers import FakeClock, admit, make_policy
from prometheus_client import CollectorRegistry

from sidecar.engine.capacity import EngineCapacity
from sidecar.policy import TurnEnd
from sidecar.policy.placement import WorkerRoom

ADMISSION = {"enabled": True, "headroom": 1.0, "expected_growth_tokens": 0, "learn_growth": False,
             "host_tier_projection": "peak", "host_tier_capacity": "distinct", "max_wait": 5.0,
             "paced_turn_max_wait": 2.0, "poll_interval": 0.5}


def policy_with_host_tier(clock, host=True, registry=None, **admission):
    """10,000 GPU tokens, write-through to as many on host (10,000 distinct) or none; no growth:
    a session counts at its context."""
    policy = make_policy(clock=clock, capacity=10_000, policy={"mode": "fixed", "fixed_ttl": 1.0},
                         admission={**ADMISSION, **admission}, registry=registry)
    if host:
        policy.set_capacity(EngineCapacity(10_000, host_tokens=10_000, host_write_policy="write_through"))
    return policy


def request(policy, sid, tokens, new):
    """A request of ``sid`` at the gate; returns its ticket."""
    policy.sessions.open(sid)
    return policy.offer_admission(sid, tokens, new)


def turn(policy, clock, sid, prompt, reply=100):
    """A granted request runs its turn and ends (the gap starts)."""
    policy.on_request(sid, prompt, clock())
    policy.on_turn_end(TurnEnd(sid, prompt + reply, ["bash"], clock()))
    policy.release_admission(sid)


def late_session_let_in(policy, clock):
    """``big`` fills the pool; ``late`` waits the door's ``max_wait`` (5 s), goes in without room and
    takes its first turn."""
    request(policy, "big", 9_000, True)
    turn(policy, clock, "big", 9_000)
    request(policy, "late", 3_000, True)
    clock.advance(5.0)
    policy.gate.pump()
    turn(policy, clock, "late", 3_000)


def paced(policy, sid) -> bool:
    return policy.sessions.record(sid).paced


def test_a_session_let_in_without_room_waits_at_each_later_turn_at_most_the_limit():
    clock = FakeClock()
    policy = policy_with_host_tier(clock)
    assert request(policy, "big", 9_000, True).granted
    turn(policy, clock, "big", 9_000)
    late = request(policy, "late", 3_000, True)
    assert late.waiting
    clock.advance(5.0)
    policy.gate.pump()
    assert late.granted and paced(policy, "late")  # let in at max_wait, without room
    turn(policy, clock, "late", 3_000)
    second = request(policy, "late", 3_200, False)
    assert second.waiting and policy.gate.turns_waiting == 1
    assert policy.gate.next_deadline() == pytest.approx(clock() + 2.0)
    clock.advance(1.9)
    policy.gate.pump()
    assert second.waiting
    clock.advance(0.1)
    policy.gate.pump()
    assert second.granted and paced(policy, "late")  # ran at the limit, still without room
    assert request(policy, "big", 9_200, False).granted  # the admitted session never waits


def test_a_paced_session_runs_like_any_other_once_it_fits_and_goes_before_new_sessions():
    clock = FakeClock()
    policy = policy_with_host_tier(clock)
    late_session_let_in(policy, clock)
    policy.sessions.close("big")  # room for both: but the paced session goes first
    newcomer = request(policy, "new", 1_000, True)
    assert newcomer.waiting
    assert request(policy, "late", 3_200, False).granted and not paced(policy, "late")
    assert newcomer.granted


def test_a_paced_session_away_longer_than_the_limit_holds_no_new_session_back():
    """An agent paced during a rush that then runs a long tool call (or leaves without closing) must
    not make every new agent wait the door's max_wait for it once the pool has room."""
    clock = FakeClock()
    policy = policy_with_host_tier(clock)
    late_session_let_in(policy, clock)
    policy.sessions.close("big")
    clock.advance(2.5)  # paced_turn_max_wait is 2 s: late is in a long tool call
    assert paced(policy, "late")
    assert request(policy, "new", 1_000, True).granted


def test_a_new_session_that_fits_waits_behind_a_paced_turn_waiting_for_room():
    clock = FakeClock()
    policy = policy_with_host_tier(clock)
    late_session_let_in(policy, clock)
    clock.advance(2.5)
    waiting_turn = request(policy, "late", 9_500, False)  # no room beside big's 9,000
    assert waiting_turn.waiting
    newcomer = request(policy, "new", 500, True)  # 500 would fit beside big, but late's turn goes first
    assert newcomer.waiting
    clock.advance(2.0)
    policy.gate.pump()
    assert waiting_turn.granted and newcomer.waiting


@pytest.mark.parametrize("projection", ["peak", "remaining"])
def test_a_paced_turn_asks_room_for_the_growth_it_still_adds(projection):
    """Resuming, a paced session counts its remaining turns' growth under either projection: room for
    its context alone would let it back into the thrash it was paced out of."""
    clock = FakeClock()
    policy = policy_with_host_tier(clock, expected_growth_tokens=500, host_tier_projection_turns=4,
                                   host_tier_projection=projection)
    assert request(policy, "big", 4_000, True).granted
    turn(policy, clock, "big", 4_000)
    assert request(policy, "late", 3_000, True).waiting  # 4,100 + 3 x 500 beside 3,000 + 4 x 500 passes the 10,000
    clock.advance(5.0)
    policy.gate.pump()
    turn(policy, clock, "late", 3_000)
    assert paced(policy, "late")
    # its context alone would fit (5,600 + 3,100), with its growth it does not (+ 1,500 = 10,200)
    assert request(policy, "late", 3_200, False).waiting


def test_paced_turns_are_counted_for_the_dashboard():
    """An operator sees how many later turns wait for room and how they went (dashboard: Admission)."""
    registry, clock = CollectorRegistry(), FakeClock()
    policy = policy_with_host_tier(clock, registry=registry)
    late_session_let_in(policy, clock)
    waiting = request(policy, "late", 3_200, False)
    assert registry.get_sample_value("sidecar_admission_paced_turns_waiting") == 1
    clock.advance(2.0)
    policy.gate.pump()  # ran at its limit without room
    turn(policy, clock, "late", 3_200)
    policy.sessions.close("big")
    assert waiting.granted and request(policy, "late", 3_400, False).granted  # room now
    assert registry.get_sample_value("sidecar_admission_paced_turns_total", {"outcome": "timeout"}) == 1
    assert registry.get_sample_value("sidecar_admission_paced_turns_total", {"outcome": "room"}) == 1
    assert registry.get_sample_value("sidecar_admission_paced_turn_wait_seconds_sum") == pytest.approx(2.0)
    assert registry.get_sample_value("sidecar_admission_paced_turns_waiting") == 0


def test_resuming_takes_the_budget_not_the_overflow():
    room = WorkerRoom("w", budget_tokens=10_000, projected_tokens=10_500, sessions=2, overflow_tokens=1_000)
    assert room.fits(0.0)  # a new session may take the overflow...
    assert not WorkerRoom("w", 10_000, 9_000, 2, 1_000, paced=1).fits(500)  # ...not while a paced one waits


@pytest.mark.parametrize("host, limit", [(False, 2.0), (True, 0.0)])
def test_without_a_host_tier_or_with_pacing_off_later_turns_go_at_once(host, limit):
    clock = FakeClock()
    policy = policy_with_host_tier(clock, host=host, paced_turn_max_wait=limit)
    late_session_let_in(policy, clock)
    assert not paced(policy, "late")
    assert request(policy, "late", 3_200, False).granted


def test_sessions_that_fit_are_never_paced():
    clock = FakeClock()
    policy = policy_with_host_tier(clock)
    for i in range(3):
        assert request(policy, f"a{i}", 3_000, True).granted
        turn(policy, clock, f"a{i}", 3_000)
    for i in range(3):
        assert not paced(policy, f"a{i}") and request(policy, f"a{i}", 3_200, False).granted


def test_a_paced_turn_that_gives_up_leaves_the_queue():
    clock = FakeClock()
    policy = policy_with_host_tier(clock)
    late_session_let_in(policy, clock)
    waiting = request(policy, "late", 3_200, False)
    policy.gate.cancel(waiting)
    assert waiting.state == "cancelled" and policy.gate.turns_waiting == 0 and policy.gate.next_deadline() is None


async def test_the_server_path_waits_out_a_paced_turn_on_the_event_loop():
    """``admit`` (the turn core's call) returns for a paced later turn once its limit passed."""
    policy = policy_with_host_tier(time.monotonic, max_wait=0.05, paced_turn_max_wait=0.2, poll_interval=0.05)
    request(policy, "big", 9_000, True)
    turn(policy, time.monotonic, "big", 9_000)
    await admit(policy, "late", 3_000)
    assert paced(policy, "late")
    turn(policy, time.monotonic, "late", 3_000)
    started = time.monotonic()
    await asyncio.wait_for(admit(policy, "late", 3_200, is_new_session=False), 2.0)
    assert 0.19 <= time.monotonic() - started < 1.0 and policy.gate.turns_waiting == 0
