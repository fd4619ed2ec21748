"""The simulator with SGLang's host tier (HiCache on CPU, virtual-time copies): host hits instead of
recompute, load-back on the critical path, prefetch off it, results without the tier unchanged,
and the tier in ``--serve``'s /server_info and /metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("sglang")

import aiohttp

from sidecar_tools.simulator.engine import SimEngine, SimRequest
from sidecar_tools.simulator.hicache_cpu import HostTierArgs
from sidecar_tools.simulator.server import SimServer
from sglang_ext.wire import lease_params

REPO = Path(__file__).resolve().parents[3]
HISTORY, OUT = 6000, 10  # session A: a 6,000-token prompt, 10 output tokens
SLOW = 1e4  # host-to-GPU tokens/s: A's reload (6,009 tokens) takes ~0.6 s


def settle(engine: SimEngine) -> None:
    """Run the engine until every request is done (stepping, or waking as SGLang's loop would)."""
    for _ in range(100_000):
        if engine.idle():
            return
        if not (engine.busy and engine.step(None)):
            engine.advance_idle(engine.next_wakeup())
    raise AssertionError("engine did not settle")


def demoted_session(engine: SimEngine, done: list, **a_params):
    """A runs and finishes; B (another session) takes the GPU, so A's backed-up KV is demoted to
    host. Returns A's next prompt (its history + 100 new tokens)."""
    prompt = list(range(1000, 1000 + HISTORY))
    engine.submit(SimRequest(rid="a", input_ids=prompt, max_new_tokens=OUT, session_id="A",
                             on_update=done.append, **a_params))
    settle(engine)
    engine.submit(SimRequest(rid="b", input_ids=list(range(20_000, 28_000)), max_new_tokens=OUT, session_id="B",
                             on_update=done.append))
    engine.notify()
    settle(engine)
    return prompt + done[0].output_ids + list(range(9000, 9100))


def returning_turn(engine: SimEngine, done: list, prompt: list[int], at: float | None = None) -> SimRequest:
    if at is not None:
        engine.run_until(at)
    engine.submit(SimRequest(rid="a2", input_ids=prompt, max_new_tokens=5, session_id="A", on_update=done.append))
    engine.notify()
    settle(engine)
    return done[-1]


def ttft(sim: SimRequest) -> float:
    return sim.first_token_s - sim.arrival_s


def test_the_host_tier_turns_recompute_into_host_hits(simulate):
    plain, _, _ = simulate(policy="lru")
    tiered, records, run = simulate(policy="lru", hicache_ratio=2.0)
    assert plain["recomputed_share"] > 0.15
    assert tiered["recomputed_share"] < 0.005  # only SGLang's one uncached token per turn
    assert tiered["turns_ok"] == 48 and tiered["makespan_s"] < plain["makespan_s"]
    counters = run["metrics"]["engine"]["counters"]
    host = counters["sim:cached_tokens_host_total"]
    # what LRU recomputed is now served from host (about as much: the runs' timings differ)
    assert host == pytest.approx(plain["recomputed_tokens"], rel=0.2)
    assert tiered["cached_tokens"] == pytest.approx(plain["cached_tokens"] + plain["recomputed_tokens"], rel=0.02)
    assert counters["sglang:load_back_tokens_total"] == host  # every load was consumed by its request
    assert counters["sglang:hicache_backup_tokens_total"] > 0
    assert run["metrics"]["engine"]["gauges_after"]["sglang:hicache_host_total_tokens"] == 2 * 24_000 + 1


def test_load_back_lands_on_the_critical_path(cost):
    """A host hit is loaded at admission; its prefill waits for the copy (tokens / rate)."""
    seen = {}
    for rate in (SLOW, 1e8):
        engine = SimEngine(kv_tokens=10_000, cost=cost.replace(host_load_tokens_per_s=rate),
                           host_tier=HostTierArgs(size_tokens=40_000))
        done: list = []
        back = returning_turn(engine, done, demoted_session(engine, done))
        assert (back.cached_tokens, back.cached_tokens_host) == (HISTORY + OUT - 1, HISTORY + OUT - 1)
        seen[rate] = (ttft(back), engine.counters)
    slow, fast = seen[SLOW][0], seen[1e8][0]
    reload_s = (HISTORY + OUT - 1) / SLOW
    assert slow - fast == pytest.approx(reload_s, rel=0.03)
    assert seen[SLOW][1]["sim:load_wait_s_total"] == pytest.approx(reload_s, rel=0.03)
    # without the tier the same turn recomputes A's history instead
    engine = SimEngine(kv_tokens=10_000, cost=cost)
    done = []
    assert returning_turn(engine, done, demoted_session(engine, done)).cached_tokens == 0


def plugin_engine(cost, **config) -> SimEngine:
    return SimEngine(kv_tokens=10_000, policy="session_ttl", cost=cost.replace(host_load_tokens_per_s=SLOW),
                     policy_config={"host_load_tokens_per_s": SLOW, "max_leased_fraction": 0.9, **config},
                     host_tier=HostTierArgs(size_tokens=40_000))


@pytest.mark.parametrize("prefetch", [True, False])
def test_a_prefetch_that_lands_in_time_takes_the_load_off_the_critical_path(cost, prefetch):
    """The plugin loads A's KV back ahead of its expected return (3 s after its turn); the
    returning turn then hits the GPU and does not wait. Without prefetch it waits ~0.6 s."""
    engine = plugin_engine(cost, prefetch=prefetch)
    done: list = []
    prompt = demoted_session(engine, done, custom_params=lease_params(60.0, expected_back_s=3.0))
    back = returning_turn(engine, done, prompt, at=done[0].finish_s + 3.0)
    metrics = engine.lease_metrics()
    if prefetch:
        assert (back.cached_tokens, back.cached_tokens_host) == (HISTORY + OUT - 1, 0)
        assert ttft(back) < 0.05
        assert metrics["prefetches[issued]"] == metrics["prefetches[used]"] == 1
    else:
        assert back.cached_tokens_host == HISTORY + OUT - 1
        assert ttft(back) > (HISTORY + OUT - 1) / SLOW
        assert metrics.get("prefetches[issued]", 0) == 0


def test_a_turn_that_matches_a_landing_prefetch_waits_for_the_rest(cost):
    engine = plugin_engine(cost, prefetch=True)  # off by default (it cost stock HiCache's makespan on TraceLab)
    done: list = []
    prompt = demoted_session(engine, done, custom_params=lease_params(60.0, expected_back_s=3.0))
    early = done[0].finish_s + 3.0 - 0.3  # the prefetch (~0.6 s) is about half way
    engine.run_until(early)
    assert engine.lease_metrics()["prefetches[issued]"] == 1
    landing = engine.copies.busy_until("load")
    assert landing > engine.now
    back = returning_turn(engine, done, prompt)
    assert back.cached_tokens_host == 0  # matched on the GPU, while its copy was still landing
    assert ttft(back) == pytest.approx(landing - back.arrival_s, abs=0.02)


def test_without_the_host_tier_the_committed_reference_run_is_reproduced(cost):
    """The host tier is off by default and leaves everything else as it was: the LRU reference
    run of benchmarks/results/sim (run.sh) comes out the same, turn by turn."""
    from sidecar_tools.simulator.calibrate import simulate_spec

    committed = json.loads((REPO / "benchmarks/results/sim/lru-0.5s.json").read_text())
    summary, records, run = simulate_spec({"preset": "reference", "kv_tokens": 173_200, "policy": "lru"}, cost)
    assert {k: summary[k] for k in committed["summary"]} == committed["summary"]
    assert run["metrics"]["engine"]["counters"] == committed["metrics"]["engine"]["counters"]
    assert not any("host" in k for k in run["metrics"]["engine"]["gauges_after"])


async def test_serve_reports_the_host_tier_in_server_info_and_metrics(cost):
    engine = SimEngine(kv_tokens=10_000, cost=cost, host_tier=HostTierArgs(ratio=4.0))
    server = SimServer(engine, time_scale=50.0)
    url = await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            info = await (await http.get(f"{url}/server_info")).json()
            assert info["enable_hierarchical_cache"] is True and info["hicache_ratio"] == 4.0
            assert info["hicache_write_policy"] == "write_through" and info["hicache_size"] == 0
            assert info["hicache_host_memory_fraction"] is None  # an explicit ratio turns auto-sizing off
            assert info["hicache_object_layout"]["enabled"] is False
            assert info["simulated_host_pool_tokens"] == 40_001

            async def generate(ids):
                body = {"input_ids": ids, "sampling_params": {"max_new_tokens": OUT, "ignore_eos": True}}
                async with http.post(f"{url}/generate", json=body) as resp:
                    return await resp.json()

            a = list(range(1000, 1000 + HISTORY))
            first = await generate(a)
            await generate(list(range(20_000, 28_000)))  # demotes A's KV to host
            again = await generate(a + first["output_ids"] + list(range(9000, 9100)))
            details = again["meta_info"]["cached_tokens_details"]
            assert details == {"device": 0, "host": HISTORY + OUT - 1}
            text = await (await http.get(f"{url}/metrics")).text()
    finally:
        await server.stop()
    values = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    model = 'model_name="simulated-qwen3-8b"'
    assert values[f'sglang:cached_tokens_total{{{model},cache_source="host"}}'] == HISTORY + OUT - 1
    assert values[f"sglang:hicache_host_total_tokens{{{model}}}"] == 40_001
    assert values[f"sglang:hicache_host_used_tokens{{{model}}}"] > 0
    rank = 'cache_type="UnifiedRadixCache",dp_rank="0",pool="kv",pp_rank="0",tp_rank="0"'
    assert values[f"sglang:load_back_tokens_total{{{rank}}}"] == HISTORY + OUT - 1
    assert values[f"sglang:hicache_backup_tokens_total{{{rank}}}"] > 0
    evicted = [k for k in values if k.startswith("sglang:evicted_tokens_total")]
    assert evicted == ['sglang:evicted_tokens_total{cache_type="UnifiedRadixCache",dp_rank="0",pp_rank="0",tp_rank="0"}']
    assert values[evicted[0]] > 0
    assert any(k.startswith("sglang:load_back_duration_seconds_count") for k in values)


def test_cli_runs_with_the_host_tier_and_records_it(tmp_path):
    from click.testing import CliRunner

    from sidecar.cli import main

    result = CliRunner().invoke(main, [
        "simulate", "--synthetic", "reference", "--sessions", "3", "--turns", "3", "--kv-tokens", "12000",
        "--hicache-ratio", "2", "--hicache-write-policy", "write_through_selective", "--out", str(tmp_path),
        "--name", "tiered"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    run = json.loads((tmp_path / "tiered.json").read_text())
    tier = run["config"]["hicache"]
    assert tier["enable_hierarchical_cache"] and tier["hicache_ratio"] == 2.0
    assert tier["hicache_write_policy"] == "write_through_selective" and tier["host_pool_tokens"] == 24_001
    assert "--hicache-ratio 2.0" in run["command"]
    bad = CliRunner().invoke(main, ["simulate", "--hicache-ratio", "0"])
    assert bad.exit_code == 2 and "--hicache-ratio must be positive" in bad.output


def test_a_gpu_hicache_run_becomes_a_host_tier_target(tmp_path):
    """``simulate calibrate DIR`` on run_matrix.sh output: the host pool comes from SGLang's own
    gauge, and a stock HiCache run informs only the host-tier coefficients."""
    from sidecar_tools.simulator.calibrate import informs, target_from_run

    run = {"name": "hicache-0.5s", "summary": {"makespan_s": 70.0}, "config": {"mode": "openai"},
           "trace": {"meta": {"generator": {"name": "reference"}}},
           "metrics": {"engine": {"gauges_after": {'sglang:hicache_host_total_tokens{model_name="m"}': 519_601.0}}}}
    (tmp_path / "hicache-0.5s.json").write_text(json.dumps(run))
    target = target_from_run(tmp_path / "hicache-0.5s.json")
    assert target["sim"]["hicache_size_tokens"] == 519_600 and target["sim"]["policy"] == "lru"
    assert informs(target, ["host_load_tokens_per_s"]) and not informs(target, ["step_s"])
    lru = {"fit": True, "sim": {"policy": "lru"}}
    assert informs(lru, ["step_s"]) and not informs(lru, ["host_load_tokens_per_s"])
    overload = {**run, "name": "product-overload", "metrics": {}}
    (tmp_path / "product-overload.json").write_text(json.dumps(overload))
    spec = target_from_run(tmp_path / "product-overload.json")["sim"]
    assert spec["hicache_ratio"] == 1.0 and spec["policy"] == "session_ttl" and spec["sidecar"]
