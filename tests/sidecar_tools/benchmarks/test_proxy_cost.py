"""The cost benchmark's proxies and its report: the agents' /generate goes through the bare relay
and smg as through the engine itself (every turn answered, the sessions' idle companions opened
first and not counted), each proxy's CPU per turn is measured, and the report's ratios and targets
come from the medians of the repetitions."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from sidecar_tools.benchmarks.load_benchmark import LoadConfig, run_load
from sidecar_tools.benchmarks.proxy_cost import markdown, table, targets

SMALL = dict(sessions=6, duration=2.0, drain=5.0, ramp=0.3, token_delay=0.005, think=0.05, turns=3,
             system_tokens=100, tool_tokens=20, pin=False, idle_sessions=5)


@pytest.mark.parametrize("mode", ["bare", pytest.param("smg", marks=pytest.mark.skipif(shutil.which("smg") is None, reason="no smg"))])
async def test_agents_reach_the_engine_through_the_proxy_and_its_cpu_is_counted(mode, qwen3_tokenizer_dir):
    cfg = LoadConfig(**SMALL)
    result = await asyncio.wait_for(run_load(cfg, str(qwen3_tokenizer_dir), modes=(mode,), log=lambda _: None), 120)
    s = result["phases"][mode]["summary"]
    assert s["errors"] == 0 and s["unfinished_at_stop"] == 0 and s["turns_ok"] >= cfg.sessions * 2
    assert s["idle_sessions_opened"] == cfg.idle_sessions
    assert s["outside_engine_ttft_ms"]["n"] == s["turns_ok"]  # each timed turn matched its engine request
    assert s["proxy"] == mode and s["cpu_ms_per_turn"][mode] > 0


def _run(scenario, proxy, rep, cpu, p99):
    return {"scenario": scenario, "proxy": proxy, "rep": rep,
            "summary": {"cpu_ms_per_turn": {proxy: cpu}, "outside_engine_ttft_ms": {"p50": 1.0, "p99": p99},
                        "requests_per_s": 10.0, "errors": 0}}


def test_the_report_takes_medians_and_judges_the_targets_on_them():
    runs = []
    for rep, (side, bare) in enumerate([(4.0, 2.0), (9.0, 2.1), (3.8, 1.9)], 1):  # one noisy sidecar repetition
        runs += [_run("long-256", "sidecar", rep, side, 12.0), _run("long-256", "bare", rep, bare, 10.0)]
    runs += [_run("open-50", "sidecar", 1, 4.0, 1.0), _run("open-2000", "sidecar", 1, 4.8, 1.0)]
    t = table({"runs": runs})
    assert t["long-256"]["sidecar"]["cpu_median"] == 4.0 and t["long-256"]["bare"]["cpu_median"] == 2.0
    got = targets(t)
    assert got["long-256: sidecar CPU/turn <= 2.0x bare relay"] == {"ratio": 2.0, "met": True}
    assert got["sidecar CPU/turn at 2000 open sessions <= 1.15x that at 50"] == {"ratio": 1.2, "met": False}
    assert got["long-256: sidecar outside-engine TTFT p99 <= 1.3x bare relay"] == {"ratio": 1.2, "met": True}
    assert got["agents-500: sidecar CPU/turn <= 2.0x bare relay"]["ratio"] is None  # not run: not judged met
    text = markdown({"runs": runs, "command": "x", "machine": {}, "load_before": [0, 0, 0]})
    assert "| long-256 | sidecar | **4.0** (4.00, 9.00, 3.80)" in text and "agents-500: sidecar CPU/turn <= 2.0x bare relay: not run" in text


def test_a_sidecar_of_another_checkout_is_reported_beside_this_one():
    """``--before``: its phases run the load test's sidecar mode (their CPU is the sidecar's), and
    the report compares this sidecar with it."""
    runs = [_run("long-256", "sidecar", 1, 4.0, 12.0), _run("long-256", "bare", 1, 2.0, 10.0)]
    before = _run("long-256", "before", 1, 5.0, 24.0)
    before["summary"] = {**before["summary"], "proxy": "sidecar", "cpu_ms_per_turn": {"sidecar": 5.0}}
    t = table({"runs": runs + [before]})
    assert t["long-256"]["before"]["cpu_median"] == 5.0
    text = markdown({"runs": runs + [before], "command": "x", "machine": {}, "load_before": [0, 0, 0],
                     "before": {"path": "/tmp/sidecar-before", "commit": "abc1234"}})
    assert "| long-256 | sidecar / before | 0.8x | p99 0.5x before, before 2.4x bare |" in text
    assert "`/tmp/sidecar-before` at `abc1234`" in text
