"""Admission with a host tier by measured residency (issue 24, point 3).

What a user relies on (the rule: ``sidecar.policy.admission``'s docstring):
  * ``host_tier_projection = peak``: a session near its end does not keep a new one out because
    their final sizes, added up, would not fit: it is gone before the new one grows;
  * ``host_tier_capacity = distinct``: under write-through (SGLang's default) the host tier holds
    the GPU's pages too, so GPU + host count once; under write_back twice;
  * ``learn_session_turns``: agents that were seen to end after a few turns are projected that many;
  * ``host_tier_recompute_share``: a new agent goes past the budget when the KV it pushes out
    belongs to agents far from their return, not when they are about to come back; before any turn
    has ended (a wave of agents starting together) the same price comes from the priors, so a
    first turn does not wait for an overshoot whose recompute costs less than its wait.
"""

from __future__ import annotations

import asyncio

import pytest
from policy_helpers import FakeClock, admit, lease_ttl, make_policy

from sidecar.engine.capacity import EngineCapacity
from sidecar.policy import TurnEnd


def gated(clock, gpu, host, write_policy="write_through", policy=None, **admission):
    settings = {"enabled": True, "headroom": 1.0, "expected_growth_tokens": 0, "learn_growth": False,
                "max_wait": 0, "poll_interval": 0.01, **admission}
    p = make_policy(clock=clock, capacity=gpu, admission=settings,
                    policy=policy or {"mode": "fixed", "fixed_ttl": 1.0})
    p.set_capacity(EngineCapacity(gpu, host_tokens=host, host_write_policy=write_policy))
    return p


async def admitted_now(policy, sid, tokens) -> bool:
    task = asyncio.create_task(admit(policy, sid, tokens, is_new_session=True))
    for _ in range(5):
        await asyncio.sleep(0)
    done = task.done()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return done


def run_turn(policy, clock, sid, prompt, service_s=1.0, gap_s=0.0, growth=0, tools=("pytest",), first=False):
    """One turn of ``sid`` (``service_s`` long, its reply adds ``growth`` tokens), then ``gap_s`` idle."""
    if not first:
        policy._start_request(sid, prompt)  # what admit() does for a continuing session
    policy.on_request(sid, prompt, clock.now)
    lease_ttl(policy, sid, prompt, clock.now)
    clock.advance(service_s)
    policy.on_turn_end(TurnEnd(sid, prompt + growth, list(tools), clock.now))
    policy.release_admission(sid)
    clock.advance(gap_s)
    return prompt + growth


@pytest.mark.parametrize("projection, admitted", [("remaining", False), ("peak", True)])
async def test_a_session_near_its_end_leaves_room_for_the_next(projection, admitted):
    clock = FakeClock()
    # 20K tokens (host of a write-back pool); each turn adds 1K; sessions take 10 turns
    policy = gated(clock, 10_000, 10_000, "write_back", expected_growth_tokens=1_000,
                   host_tier_projection_turns=10, host_tier_projection=projection)
    await admit(policy, "a", 1_000, True)
    context = 1_000
    for k in range(8):  # 8 turns done: 9K held, 2 turns (2K) to go
        context = run_turn(policy, clock, "a", context, first=k == 0) + 1_000
    # the new one: 2K now, 12K after its 10 turns. Added at their ends: 11K + 12K > 20K; but when
    # a ends (11K) the new one holds 4K: 15K at most
    assert await admitted_now(policy, "b", 2_000) is admitted


@pytest.mark.parametrize("write_policy, capacity, admitted", [
    ("write_through", "distinct", False),  # GPU pages are on host too: 10K distinct
    ("write_back", "distinct", True),  # host holds only what the GPU gave up: 20K
    ("write_through", "sum", True),  # the old count: 20K
])
async def test_write_through_counts_gpu_and_host_once(write_policy, capacity, admitted):
    clock = FakeClock()
    policy = gated(clock, 10_000, 10_000, write_policy, host_tier_capacity=capacity)
    await admit(policy, "a", 6_000, True)
    run_turn(policy, clock, "a", 6_000, first=True)
    assert await admitted_now(policy, "b", 6_000) is admitted


def test_the_write_policy_comes_from_server_info():
    info = {"max_total_num_tokens": 10_000, "enable_hierarchical_cache": True, "hicache_ratio": 1.0}
    assert EngineCapacity.from_server_info(info).distinct_hierarchy_tokens == 10_001
    info["hicache_write_policy"] = "write_back"
    assert EngineCapacity.from_server_info(info).distinct_hierarchy_tokens == 20_001
    assert EngineCapacity(10_000).distinct_hierarchy_tokens == 10_000  # no host tier


@pytest.mark.parametrize("learn, admitted", [(False, False), (True, True)])
async def test_agents_seen_to_end_after_few_turns_are_projected_that_many(learn, admitted):
    clock = FakeClock()
    policy = gated(clock, 10_000, 10_000, "write_back", expected_growth_tokens=1_000,
                   host_tier_projection_turns=16, host_tier_projection="peak", learn_session_turns=learn)
    for i in range(6):  # agents of 3 turns come and go
        await admit(policy, f"old{i}", 1_000, True)
        context = 1_000
        for k in range(3):
            context = run_turn(policy, clock, f"old{i}", context, first=k == 0) + 1_000
        policy.sessions.forget(policy.sessions.get(f"old{i}"), "client")
    await admit(policy, "a", 8_000, True)
    run_turn(policy, clock, "a", 8_000, first=True)
    # 16 turns ahead: a holds 8K + 15K; learned (~4 turns): 8K + ~3K, and the new one 2K + ~4K
    assert await admitted_now(policy, "b", 2_000) is admitted


@pytest.mark.parametrize("gap_s, admitted", [(0.5, False), (60.0, True)])
async def test_past_the_budget_only_when_the_kv_pushed_out_returns_late(gap_s, admitted):
    clock = FakeClock()
    policy = gated(clock, 10_000, 10_000, policy={"mode": "fixed", "fixed_ttl": 0.1, "prior_median_s": gap_s,
                                                  "prior_sigma": 0.3},
                   host_tier_capacity="distinct", host_tier_recompute_share=0.2)
    await admit(policy, "a", 8_000, True)
    for k in range(4):  # a learns its gaps: it is out for gap_s after each 1 s turn
        run_turn(policy, clock, "a", 8_000, gap_s=gap_s, first=k == 0)
    run_turn(policy, clock, "a", 8_000)  # and has just ended a turn
    # a (8K) is between turns; the new one (9K) overflows the 10K by 7K. Recomputing a's 8K costs
    # ~0.45 s of engine time: once a minute is ~1 % of it, every 1.5 s ~30 %
    assert await admitted_now(policy, "b", 9_000) is admitted


async def test_without_a_host_tier_the_recompute_share_changes_nothing():
    clock = FakeClock()
    policy = make_policy(clock=clock, capacity=10_000,
                         admission={"enabled": True, "headroom": 1.0, "expected_growth_tokens": 0,
                                    "learn_growth": False, "max_wait": 0, "poll_interval": 0.01,
                                    "host_tier_recompute_share": 1.0},
                         policy={"mode": "fixed", "fixed_ttl": 600.0, "prior_median_s": 60.0})
    await admit(policy, "a", 8_000, True)
    run_turn(policy, clock, "a", 8_000, gap_s=60.0, first=True)
    assert await admitted_now(policy, "b", 9_000) is False


@pytest.mark.parametrize("last_prompt, admitted", [
    (13_000, True),  # 3K (1 %) past the 300K host tier: recomputing it costs ~9 % of the engine
    (60_000, False),  # 50K past: more than the 60 % of the engine the share allows
])
async def test_a_wave_starting_together_is_not_held_for_an_overshoot_that_costs_little(last_prompt, admitted):
    clock = FakeClock()
    # a host tier 3x the GPU's (write-through: 300K distinct); nothing measured yet (no turn ended);
    # the priors: a reply is followed by a gap of ~2 s, a token recomputes in 50 us
    policy = gated(clock, 100_000, 300_000, host_tier_capacity="distinct", host_tier_projection="peak",
                   host_tier_recompute_share=0.6, max_wait=60.0,
                   policy={"mode": "fixed", "fixed_ttl": 1.0, "prior_median_s": 2.0})
    for i in range(29):
        assert await admitted_now(policy, f"a{i}", 10_000)
    assert await admitted_now(policy, "last", last_prompt) is admitted


async def test_before_anything_is_measured_a_zero_share_keeps_the_budget_hard():
    clock = FakeClock()
    policy = gated(clock, 100_000, 300_000, host_tier_capacity="distinct", host_tier_projection="peak",
                   host_tier_recompute_share=0.0, max_wait=60.0)
    for i in range(29):
        assert await admitted_now(policy, f"a{i}", 10_000)
    assert await admitted_now(policy, "last", 13_000) is False
