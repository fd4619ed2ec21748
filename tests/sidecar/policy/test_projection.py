"""Admission projects resident sessions several turns ahead, so admitted sessions keep fitting."""

from __future__ import annotations

import asyncio

import pytest

from policy_helpers import admit, on_store

from sidecar.policy import EngineCapacity, build_policy
from sidecar.settings import load_settings


def _policy(projection_turns: float):
    settings = load_settings(
        overrides={
            "policy": {"mode": "fixed", "fixed_ttl": 60.0},
            "admission": {
                "enabled": True,
                "headroom": 1.0,
                "expected_growth_tokens": 1000,
                "learn_growth": False,
                "projection_turns": projection_turns,
                "max_wait": 0,
                "poll_interval": 0.01,
            },
        }
    )
    return on_store(build_policy(settings, EngineCapacity(max_total_num_tokens=20_000)))


async def _admitted_count(policy, sessions: int) -> int:
    started = []

    async def start(i):
        await admit(policy, f"s{i}", 1000, True)
        started.append(i)

    tasks = [asyncio.ensure_future(start(i)) for i in range(sessions)]
    await asyncio.sleep(0.1)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return len(started)


@pytest.mark.parametrize("turns, expected", [(1, 10), (4, 4), (9, 2)])
async def test_more_projected_turns_admit_fewer_sessions(turns, expected):
    # 20K tokens; each session holds 1K now and grows 1K per turn.
    assert await _admitted_count(_policy(turns), 12) == expected
