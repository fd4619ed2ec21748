"""Session lifecycle: which idle sessions are closed, the bounded store, learning across a close."""

from policy_helpers import FakeClock, admit, lease_ttl, make_policy

from sidecar.policy import TurnEnd


def turn(policy, clock, sid, tokens=1_000, tools=("bash",), ttl_mode=True):
    policy.on_request(sid, tokens, clock.now)
    ttl = lease_ttl(policy, sid, tokens, clock.now)
    policy.on_turn_end(TurnEnd(sid, tokens + 100, list(tools), clock.now))
    return ttl


async def test_idle_session_is_closed_after_lease_plus_grace():
    clock = FakeClock()
    policy = make_policy(clock=clock, policy={"mode": "fixed", "fixed_ttl": 10.0}, idle_grace_s=5.0)
    await admit(policy, "s", 1_000, True)
    turn(policy, clock, "s")
    policy.release_admission("s")
    clock.advance(14.9)
    assert policy.sessions_to_close(clock.now) == []
    clock.advance(0.2)
    assert policy.sessions_to_close(clock.now) == ["s"]
    assert policy.sessions.close_due(clock.now) == ["s"]  # the store forgets it
    assert policy.sessions.close_due(clock.now) == []  # closed once
    assert policy.sessions.get("s") is None and policy.sessions_to_close(clock.now) == []
    assert policy.metrics.sessions_closed.labels("idle")._value.get() == 1


async def test_unleased_session_is_closed_after_grace_from_last_activity():
    clock = FakeClock()
    policy = make_policy(clock=clock, policy={"mode": "off"}, idle_grace_s=5.0)
    await admit(policy, "s", 1_000, True)
    turn(policy, clock, "s")
    policy.release_admission("s")
    clock.advance(5.1)
    assert policy.sessions_to_close(clock.now) == ["s"]


async def test_running_session_is_never_closed():
    clock = FakeClock()
    policy = make_policy(clock=clock, policy={"mode": "off"}, idle_grace_s=1.0)
    await admit(policy, "busy", 1_000, True)
    clock.advance(1_000)
    assert policy.sessions_to_close(clock.now) == []


async def test_a_request_cancels_a_pending_close():
    clock = FakeClock()
    policy = make_policy(clock=clock, policy={"mode": "off"}, idle_grace_s=1.0)
    await admit(policy, "s", 1_000, True)
    turn(policy, clock, "s")
    policy.release_admission("s")
    clock.advance(2)
    assert policy.sessions_to_close(clock.now) == ["s"]
    await admit(policy, "s", 1_200, False)  # came back before the close went out
    policy.on_request("s", 1_200, clock.now)
    policy.release_admission("s")
    clock.advance(0.5)
    assert policy.sessions_to_close(clock.now) == []


async def test_store_is_bounded_and_the_policy_learns_of_dropped_sessions():
    clock = FakeClock()
    policy = make_policy(clock=clock, policy={"mode": "off"}, max_sessions=3, idle_grace_s=1e6)
    for i in range(5):
        await admit(policy, f"s{i}", 100, True)
        policy.release_admission(f"s{i}")
        clock.advance(1)
    assert len(policy.sessions) == 3
    assert [s.id for s in policy.sessions.all()] == ["s2", "s3", "s4"]  # the least recently used went
    assert policy.metrics.sessions_closed.labels("table_full")._value.get() == 2
    assert policy.sessions_to_close(clock.now) == []


async def test_closing_a_session_that_never_returns_teaches_never():
    clock = FakeClock()
    policy = make_policy(clock=clock, policy={"mode": "fixed", "fixed_ttl": 1.0}, idle_grace_s=1.0)
    for i in range(60):
        sid = f"s{i}"
        await admit(policy, sid, 1_000, True)
        turn(policy, clock, sid, tools=["finish"])
        policy.release_admission(sid)
        clock.advance(3)
        policy.sessions.close_due(clock.now)
    assert policy.predictor.distribution(["finish"]).p_back_ever < 0.3
    assert policy.metrics.lease_outcomes.labels("unused")._value.get() >= 59


async def test_session_back_after_its_close_teaches_the_true_gap():
    clock = FakeClock()
    policy = make_policy(clock=clock, policy={"mode": "fixed", "fixed_ttl": 1.0}, idle_grace_s=1.0)
    for i in range(60):
        sid = f"s{i}"
        await admit(policy, sid, 1_000, True)
        turn(policy, clock, sid, tools=["slow_build"])
        policy.release_admission(sid)
        clock.advance(3)
        assert policy.sessions.close_due(clock.now) == [sid]
        clock.advance(117)  # back 120 s after its reply, long after the close
        await admit(policy, sid, 1_200, True)
        policy.on_request(sid, 1_200, clock.now)
        policy.release_admission(sid)
        policy.sessions.forget(policy.sessions.get(sid), "client")
    dist = policy.predictor.distribution(["slow_build"])
    assert dist.p_back_ever > 0.9
    assert 80 < dist.median() < 160
