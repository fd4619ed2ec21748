"""Session lifecycle: which idle sessions are closed, bounded table, learning across a close."""

from policy_helpers import FakeClock, make_policy

from sidecar.policy import TurnEnd


def turn(policy, clock, sid, tokens=1_000, tools=("bash",), ttl_mode=True):
    policy.on_request(sid, tokens, clock.now)
    ttl = policy.lease_ttl(sid, tokens, clock.now)
    policy.on_turn_end(TurnEnd(sid, tokens + 100, list(tools), clock.now))
    return ttl


async def test_idle_session_is_closed_after_lease_plus_grace():
    clock = FakeClock()
    policy = make_policy(clock=clock, policy={"mode": "fixed", "fixed_ttl": 10.0}, idle_grace_s=5.0)
    await policy.admit("s", 1_000, True)
    turn(policy, clock, "s")
    policy.release_admission("s")
    clock.advance(14.9)
    assert policy.sessions_to_close(clock.now) == []
    clock.advance(0.2)
    assert policy.sessions_to_close(clock.now) == ["s"]
    assert policy.sessions_to_close(clock.now) == []  # reported once
    policy.on_session_closed("s")
    assert policy.table.get("s") is None
    assert policy.metrics.sessions_closed.labels("idle")._value.get() == 1


async def test_unleased_session_is_closed_after_grace_from_last_activity():
    clock = FakeClock()
    policy = make_policy(clock=clock, policy={"mode": "off"}, idle_grace_s=5.0)
    await policy.admit("s", 1_000, True)
    turn(policy, clock, "s")
    policy.release_admission("s")
    clock.advance(5.1)
    assert policy.sessions_to_close(clock.now) == ["s"]


async def test_running_session_is_never_closed():
    clock = FakeClock()
    policy = make_policy(clock=clock, policy={"mode": "off"}, idle_grace_s=1.0)
    await policy.admit("busy", 1_000, True)
    clock.advance(1_000)
    assert policy.sessions_to_close(clock.now) == []


async def test_a_request_cancels_a_pending_close():
    clock = FakeClock()
    policy = make_policy(clock=clock, policy={"mode": "off"}, idle_grace_s=1.0)
    await policy.admit("s", 1_000, True)
    turn(policy, clock, "s")
    policy.release_admission("s")
    clock.advance(2)
    assert policy.sessions_to_close(clock.now) == ["s"]
    await policy.admit("s", 1_200, False)  # came back before the close went out
    policy.on_request("s", 1_200, clock.now)
    policy.release_admission("s")
    clock.advance(0.5)
    assert policy.sessions_to_close(clock.now) == []


async def test_table_is_bounded_and_dropped_sessions_are_reported():
    clock = FakeClock()
    policy = make_policy(clock=clock, policy={"mode": "off"}, max_sessions=3, idle_grace_s=1e6)
    for i in range(5):
        await policy.admit(f"s{i}", 100, True)
        policy.release_admission(f"s{i}")
        clock.advance(1)
    assert len(policy.table) == 3
    assert policy.sessions_to_close(clock.now) == ["s0", "s1"]
    assert policy.metrics.sessions_closed.labels("table_full")._value.get() == 2


async def test_closing_a_session_that_never_returns_teaches_never():
    clock = FakeClock()
    policy = make_policy(clock=clock, policy={"mode": "fixed", "fixed_ttl": 1.0}, idle_grace_s=1.0)
    for i in range(60):
        sid = f"s{i}"
        await policy.admit(sid, 1_000, True)
        turn(policy, clock, sid, tools=["finish"])
        policy.release_admission(sid)
        clock.advance(3)
        for closed in policy.sessions_to_close(clock.now):
            policy.on_session_closed(closed)
    assert policy.predictor.distribution(["finish"]).p_back_ever < 0.3
    assert policy.metrics.lease_outcomes.labels("unused")._value.get() >= 59


async def test_session_back_after_its_close_teaches_the_true_gap():
    clock = FakeClock()
    policy = make_policy(clock=clock, policy={"mode": "fixed", "fixed_ttl": 1.0}, idle_grace_s=1.0)
    for i in range(60):
        sid = f"s{i}"
        await policy.admit(sid, 1_000, True)
        turn(policy, clock, sid, tools=["slow_build"])
        policy.release_admission(sid)
        clock.advance(3)
        assert policy.sessions_to_close(clock.now) == [sid]
        policy.on_session_closed(sid)
        clock.advance(117)  # back 120 s after its reply, long after the close
        await policy.admit(sid, 1_200, True)
        policy.on_request(sid, 1_200, clock.now)
        policy.release_admission(sid)
        policy.on_session_closed(sid)
    dist = policy.predictor.distribution(["slow_build"])
    assert dist.p_back_ever > 0.9
    assert 80 < dist.median() < 160
