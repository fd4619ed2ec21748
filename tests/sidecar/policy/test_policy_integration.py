"""The policy end to end as the turn core drives it (on a session store), and the metrics it exposes."""

from policy_helpers import FakeClock, admit, lease_ttl, on_store, revised_ttl
from prometheus_client import CollectorRegistry, generate_latest

from sidecar.policy import EngineCapacity, TurnEnd, build_policy
from sidecar.settings import load_settings


def value(registry, name, **labels):
    return registry.get_sample_value(name, labels or None) or 0.0


async def run_turn(policy, clock, sid, prompt, new, tools, think_s=0.5):
    await admit(policy, sid, prompt, new)
    policy.on_request(sid, prompt, clock.now)
    ttl = lease_ttl(policy, sid, prompt, clock.now)
    clock.advance(think_s)
    policy.on_turn_end(TurnEnd(sid, prompt + 100, tools, clock.now))
    policy.release_admission(sid)
    return ttl


async def test_build_policy_from_settings_learns_and_reports():
    settings = load_settings(overrides={"policy": {"mode": "predictive"}, "admission": {"enabled": True}})
    registry, clock = CollectorRegistry(), FakeClock()
    policy = on_store(build_policy(settings, EngineCapacity(200_000), registry=registry, clock=clock))
    prompt = 20_000
    for i in range(40):
        ttl = await run_turn(policy, clock, "agent", prompt, i == 0, ["edit"])
        assert ttl is not None and ttl > 0
        clock.advance(0.3)  # tool gap
        prompt += 500
    assert policy.predictor.distribution(["edit"]).median() < 1.0
    assert value(registry, "sidecar_lease_outcomes_total", outcome="hit") == 39
    assert value(registry, "sidecar_gap_actual_seconds_count") == 39
    assert value(registry, "sidecar_gap_prediction_error_log2_count") == 39
    assert value(registry, "sidecar_admission_decisions_total", decision="immediate") == 1
    assert value(registry, "sidecar_resident_sessions") == 1  # in its gap, under lease
    assert value(registry, "sidecar_resident_tokens") == prompt - 500 + 100
    assert policy.projection.growth_tokens < 1500  # learned 500/turn from the 1500 prior
    text = generate_latest(registry).decode()
    for name in (
        "sidecar_gap_predicted_seconds",
        "sidecar_leased_token_seconds_total",
        "sidecar_admission_queue_length",
        "sidecar_admission_wait_seconds",
        "sidecar_resident_projected_tokens",
        "sidecar_lease_ttl_seconds",
    ):
        assert name in text


async def test_a_return_after_the_lease_is_a_miss():
    settings = load_settings(overrides={"policy": {"mode": "fixed", "fixed_ttl": 2.0}})
    registry, clock = CollectorRegistry(), FakeClock()
    policy = on_store(build_policy(settings, EngineCapacity(100_000), registry=registry, clock=clock))
    await run_turn(policy, clock, "s", 1_000, True, ["bash"])
    clock.advance(5.0)
    await run_turn(policy, clock, "s", 1_200, False, [])
    assert value(registry, "sidecar_lease_outcomes_total", outcome="miss") == 1
    # held 1_100 tokens for the 2 s lease
    assert value(registry, "sidecar_leased_token_seconds_total") == 2_200


async def test_off_mode_sends_no_lease_but_still_closes_idle_sessions():
    settings = load_settings(overrides={"server": {"session_idle_grace": 10.0}})
    clock = FakeClock()
    policy = on_store(build_policy(settings, EngineCapacity(100_000), clock=clock))
    assert await run_turn(policy, clock, "s", 1_000, True, []) is None
    clock.advance(11)
    assert policy.sessions_to_close(clock.now) == ["s"]


async def test_revised_lease_uses_the_known_tools():
    settings = load_settings(overrides={"policy": {"mode": "predictive"}})
    clock = FakeClock()
    policy = on_store(build_policy(settings, EngineCapacity(0), clock=clock))
    for i in range(100):  # builds take 20 s, finishes never return
        policy.predictor.observe(["build"], 20.0, context_tokens=50_000)
        policy.predictor.observe_censored(["finish"], context_tokens=50_000)
    await run_turn(policy, clock, "s", 50_000, True, ["finish"])
    assert revised_ttl(policy, "s", clock.now) == settings.policy.min_ttl
    await run_turn(policy, clock, "t", 50_000, True, ["build"])
    assert 20.0 < revised_ttl(policy, "t", clock.now) < 40.0


async def test_with_several_workers_the_lease_shortens_only_for_a_full_worker():
    """The TTL's pressure term is the session's own worker's: eight running sessions filling
    worker a shorten a lease there, not the same session's lease on an empty worker b."""
    settings = load_settings(overrides={"policy": {"mode": "predictive", "kv_pressure_gain": 2.0}})
    clock = FakeClock()
    policy = on_store(build_policy(settings, EngineCapacity(100_000), clock=clock, worker="a"))
    policy.set_capacity(EngineCapacity(100_000), "b")
    for i in range(8):
        await admit(policy, f"busy-{i}", 10_000)
        policy.relocate(f"busy-{i}", "a")
        policy.on_request(f"busy-{i}", 10_000, clock.now)  # running: resident on a
    ttls = {}
    for worker in ("a", "b"):
        sid = f"probe-{worker}"
        await admit(policy, sid, 5_000)
        policy.relocate(sid, worker)
        policy.on_request(sid, 5_000, clock.now)
        ttls[worker] = lease_ttl(policy, sid, 5_000, clock.now)
    assert ttls["a"] is not None and ttls["b"] is not None
    assert ttls["a"] < ttls["b"]
