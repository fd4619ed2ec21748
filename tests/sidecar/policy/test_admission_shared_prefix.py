"""With a host tier the door counts a prefix the open sessions share once (issue 24, point 3):
SGLang's radix tree and its host tier hold it once, however many agents start with it.

What a user relies on: agents of one deployment (one system prompt and tool list) are not held at
the door for a count of their common prompt per agent; agents that share nothing still count whole;
a prefix whose sessions all closed counts in full again for the next one."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from policy_helpers import FakeClock, admit, make_policy, on_store
from prometheus_client import CollectorRegistry

from sidecar.engine.capacity import EngineCapacity
from sidecar.policy.lease_policy import LeasePolicy
from sidecar.settings import load_settings

PRESET = Path(__file__).resolve().parents[3] / "configs" / "coding-agent.toml"
SYSTEM = list(range(1_000_000, 1_003_254))  # the reference agents' system prompt + tool definitions, as rendered


def prompt(agent: int, own: int = 505, system=SYSTEM) -> list[int]:
    """A first prompt: the common system block, then the agent's own task."""
    return list(system) + [agent * 10_000 + i for i in range(own)]


async def admitted_now(policy, sid, ids) -> bool:
    task = asyncio.create_task(admit(policy, sid, len(ids), True, prompt_ids=ids))
    for _ in range(5):
        await asyncio.sleep(0)
    done = task.done()
    if done:
        task.result()  # an admission that failed is not one
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return done


def preset_at_ratio(ratio: int, clock) -> LeasePolicy:
    """The shipped preset in front of the H200's pool (173,200 tokens) with a host tier ``ratio`` x it."""
    settings = load_settings(PRESET, {})
    gpu = 173_200
    policy = LeasePolicy(settings.policy, settings.admission,
                         EngineCapacity(gpu, host_tokens=ratio * gpu, host_write_policy="write_through"),
                         registry=CollectorRegistry(), clock=clock)
    return on_store(policy)


@pytest.mark.parametrize("agents", [24, 26])
async def test_a_wave_of_agents_with_one_system_prompt_is_not_held_for_counting_it_per_agent(agents):
    """The reference agents as the OpenAI path renders them on the GPU (3,759 tokens, 3,254 common),
    all arriving at once at ratio 3: per agent, 24 project to 512.6K, past the 502.3K budget and the
    ~9K the priors allow, and the 24th waited for a first turn (on the H200: 1.25 s against stock's
    0.56 s). Counted once, 26 project to ~475K."""
    clock = FakeClock()
    policy = preset_at_ratio(3, clock)
    for i in range(agents):
        assert await admitted_now(policy, f"a{i}", prompt(i)), f"agent {i} held at the door"


async def test_agents_that_share_nothing_still_count_whole():
    clock = FakeClock()
    policy = preset_at_ratio(3, clock)
    waits = [not await admitted_now(policy, f"a{i}", prompt(i, system=range(i * 5_000, i * 5_000 + 3_254)))
             for i in range(26)]
    assert waits[:23] == [False] * 23 and all(waits[24:])


async def test_the_prefix_counts_once_and_in_full_again_once_its_sessions_closed():
    clock = FakeClock()
    # 20K of hierarchy (write-back: GPU + host), no growth: only the prompts count
    policy = make_policy(clock=clock, capacity=10_000, policy={"mode": "fixed", "fixed_ttl": 1.0},
                         admission={"enabled": True, "headroom": 1.0, "expected_growth_tokens": 0,
                                    "learn_growth": False, "max_wait": 0, "poll_interval": 0.01,
                                    "host_tier_capacity": "distinct", "host_tier_projection": "peak"})
    policy.set_capacity(EngineCapacity(10_000, host_tokens=10_000, host_write_policy="write_back"))
    system = list(range(6_400))
    # 9K each, 6,400 of it common: three hold 6.4K + 3 x 2.6K = 14.2K (27K counted per session), four 16.8K
    for sid in ("a", "b", "c", "d"):
        assert await admitted_now(policy, sid, prompt(ord(sid), own=2_600, system=system))
    assert not await admitted_now(policy, "lone", prompt(1, own=4_000, system=[]))  # shares nothing: 20.8K
    for sid in ("a", "b", "c", "d", "lone"):
        policy.release_admission(sid)
        policy.sessions.forget(policy.sessions.get(sid), "client")
    assert await admitted_now(policy, "x", prompt(2, own=12_000, system=[]))
    # nobody holds the common prefix any more: the next one with it counts all its 9K (21K > 20K)
    assert not await admitted_now(policy, "e", prompt(5, own=2_600, system=system))
