"""Admission with a time horizon and duty-cycle weighting of idle leased sessions.

Rule (sidecar.policy.lease_policy): growth is projected ``projection_horizon_s`` / learned turn
cycle turns ahead (``projection_turns`` until a cycle is seen); with ``idle_weight = duty_cycle`` an
idle leased session counts service / (service + predicted remaining gap) of its projection.
"""

import asyncio

import pytest
from policy_helpers import FakeClock, admit, lease_ttl, make_policy

from sidecar.policy import TurnEnd


def gated(clock, capacity, policy=None, **admission):
    settings = {"enabled": True, "headroom": 1.0, "expected_growth_tokens": 0, "learn_growth": False,
                "max_wait": 0, "poll_interval": 0.01, **admission}
    return make_policy(clock=clock, capacity=capacity, admission=settings,
                       policy=policy or {"mode": "fixed", "fixed_ttl": 600.0})


async def admitted_now(policy, sid, tokens) -> bool:
    task = asyncio.create_task(admit(policy, sid, tokens, is_new_session=True))
    for _ in range(5):
        await asyncio.sleep(0)
    done = task.done()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return done


def run_turn(policy, clock, sid, prompt, service_s, first=False):
    """One turn of ``sid`` taking ``service_s``; afterwards it is idle under its lease."""
    if not first:
        policy._start_request(sid, prompt)  # what admit() does for a continuing session
    policy.on_request(sid, prompt, clock.now)
    lease_ttl(policy, sid, prompt, clock.now)
    clock.advance(service_s)
    policy.on_turn_end(TurnEnd(sid, prompt + 100, ["pytest"], clock.now))
    policy.release_admission(sid)


@pytest.mark.parametrize("idle_weight, admitted", [("full", False), ("duty_cycle", True)])
async def test_agent_in_a_long_tool_gap_does_not_keep_a_new_one_out(idle_weight, admitted):
    clock = FakeClock()
    # gaps expected to last ~60 s, turns take 1 s: the idle agent runs ~2 % of the time
    policy = gated(clock, 10_000, policy={"mode": "fixed", "fixed_ttl": 600.0, "prior_median_s": 60.0},
                   idle_weight=idle_weight)
    await admit(policy, "a", 6_000, True)
    run_turn(policy, clock, "a", 6_000, service_s=1.0, first=True)
    assert policy.placement.summary(None, clock.now)[2] == 1  # still leased
    assert await admitted_now(policy, "b", 5_000) is admitted


async def test_agent_about_to_return_still_counts():
    clock = FakeClock()
    # gaps of ~0.2 s after 5 s turns: the leased KV is needed again almost at once
    policy = gated(clock, 10_000, policy={"mode": "fixed", "fixed_ttl": 600.0, "prior_median_s": 0.2,
                                          "prior_sigma": 0.3}, idle_weight="duty_cycle")
    await admit(policy, "a", 6_000, True)
    run_turn(policy, clock, "a", 6_000, service_s=5.0, first=True)
    assert not await admitted_now(policy, "b", 5_000)


async def test_running_sessions_count_in_full_whatever_their_gaps():
    clock = FakeClock()
    policy = gated(clock, 10_000, policy={"mode": "fixed", "fixed_ttl": 600.0, "prior_median_s": 60.0},
                   idle_weight="duty_cycle")
    await admit(policy, "a", 6_000, True)
    run_turn(policy, clock, "a", 6_000, service_s=1.0, first=True)
    clock.advance(60.0)
    policy._start_request("a", 6_100)  # back: running again
    policy.on_request("a", 6_100, clock.now)
    assert not await admitted_now(policy, "b", 5_000)


@pytest.mark.parametrize(
    "horizon_s, gap_s, admitted",
    [
        (20.0, 9.0, True),   # cycle 10 s: 2 turns of 1K ahead -> 4.1K + 4K fit in 15K
        (20.0, 1.5, False),  # cycle 2.5 s: 8 turns ahead -> 10.1K + 10K do not
        (0.0, 9.0, False),   # no horizon: projection_turns (8) whatever the cycle
    ],
)
async def test_time_horizon_projects_fewer_turns_for_agents_with_long_gaps(horizon_s, gap_s, admitted):
    clock = FakeClock()
    policy = gated(clock, 15_000, expected_growth_tokens=1_000, projection_turns=8.0,
                   projection_horizon_s=horizon_s)
    await admit(policy, "a", 2_000, True)
    run_turn(policy, clock, "a", 2_000, service_s=1.0, first=True)
    clock.advance(gap_s)
    policy._start_request("a", 2_100)
    policy.on_request("a", 2_100, clock.now)  # a is running; its cycle was 1 s + gap
    assert await admitted_now(policy, "b", 2_000) is admitted


async def test_before_any_cycle_is_seen_the_horizon_falls_back_to_turns():
    clock = FakeClock()
    policy = gated(clock, 15_000, expected_growth_tokens=1_000, projection_turns=8.0, projection_horizon_s=20.0)
    await admit(policy, "a", 2_000, True)  # running, nothing learned: 2K + 8 x 1K
    assert not await admitted_now(policy, "b", 2_000)
