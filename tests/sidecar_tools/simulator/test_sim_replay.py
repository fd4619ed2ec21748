"""Virtual-time replays against SGLang's real UnifiedRadixCache (CPU): eviction policies, the
session_ttl plugin, the sidecar's policy in the loop, and the benchmark's report format."""

from __future__ import annotations

import csv
import json

import pytest

pytest.importorskip("sglang")

from click.testing import CliRunner

from sidecar_tools.benchmarks.records import CSV_FIELDS, summarize
from sidecar_tools.benchmarks.report import table
from sidecar.cli import main


def test_lru_under_pressure_recomputes_and_the_unconstrained_limit_does_not(simulate):
    lru, records, _ = simulate(policy="lru")
    free, _, _ = simulate(policy="lru", kv_tokens=400_000)
    assert lru["turns_ok"] == free["turns_ok"] == 48
    assert lru["recomputed_share"] > 0.15
    assert free["recomputed_share"] < 0.005  # SGLang never caches the last sampled token: 1 per turn
    assert lru["makespan_s"] > free["makespan_s"]
    # every turn after the first reuses at least the shared system prompt in the unconstrained run
    assert free["cache_hit_share"] > 0.8
    assert all(r.ok for r in records)


def test_session_ttl_leases_reduce_recompute(simulate):
    lru, _, _ = simulate(policy="lru")
    leased, _, run = simulate(policy="session_ttl", lease_ttl=30)
    assert leased["recomputed_share"] < lru["recomputed_share"] - 0.05
    lease = run["simulator"]["lease_metrics"]
    assert lease["grants"] == 48 and lease.get("releases[closed]", 0) == 8  # one per turn; closed at the end
    # the same leases on plain LRU do nothing: SGLang ignores them
    ignored, _, _ = simulate(policy="lru", lease_ttl=30)
    assert ignored["recomputed_share"] == pytest.approx(lru["recomputed_share"])


def test_tlru_is_a_real_sglang_strategy(simulate):
    tlru, _, run = simulate(policy="tlru", policy_config={"threshold": 4096, "next_prompt_estimate": 1024})
    assert tlru["turns_ok"] == 48 and tlru["recomputed_share"] > 0.05
    assert run["metrics"]["engine"]["counters"]["sglang:evicted_tokens_total"] > 0


def test_sidecar_policy_in_the_loop_leases_and_admits(simulate):
    plain, _, _ = simulate(policy="session_ttl")  # no lease sent: plain LRU order
    fixed, _, _ = simulate(policy="session_ttl", sidecar={"policy": {"mode": "fixed", "fixed_ttl": 30}})
    assert fixed["recomputed_share"] < plain["recomputed_share"] - 0.05
    gated, records, run = simulate(policy="session_ttl",
                                   sidecar={"policy": {"mode": "fixed", "fixed_ttl": 30},
                                            "admission": {"enabled": True}})
    assert gated["turns_ok"] == 48 and run["simulator"]["admission_rejected"] == 0
    # admission holds new sessions back until their KV fits: the first turns of late sessions wait
    first = sorted(r.ttft_s for r in records if r.turn == 0)
    assert first[-1] > 1.0 > first[0]
    assert gated["recomputed_share"] <= fixed["recomputed_share"]


def test_cli_writes_the_benchmark_report(tmp_path):
    out = tmp_path / "runs"
    result = CliRunner().invoke(main, [
        "simulate", "--synthetic", "reference", "--sessions", "3", "--turns", "3", "--kv-tokens", "12000",
        "--policy", "lru", "--name", "tiny", "--out", str(out), "--json", "--sidecar-policy", "fixed:5",
        "--sidecar-set", "admission.enabled=true", "--sidecar-set", "admission.projection_turns=2"],
        catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "tiny: makespan" in result.output and "recomputed history" in result.output
    run = json.loads((out / "tiny.json").read_text())
    expected = set(summarize([], 1.0, 1)) | {"timed_out", "sessions", "sessions_unfinished"}
    assert expected <= set(run["summary"])
    assert {"name", "started_at", "command", "config", "trace", "metrics", "simulator"} <= set(run)
    assert run["command"].startswith("sglang-sidecar simulate") and "--kv-tokens 12000" in run["command"]
    assert "--sidecar-set admission.enabled=true --sidecar-set admission.projection_turns=2" in run["command"]
    assert run["config"]["kv_tokens"] == 12000 and run["config"]["radix_eviction_policy"] == "lru"
    sidecar = run["config"]["sidecar"]
    assert sidecar["admission"]["enabled"] and sidecar["admission"]["projection_turns"] == 2
    assert sidecar["policy"] == {**sidecar["policy"], "mode": "fixed", "fixed_ttl": 5.0}
    assert run["summary"]["turns_ok"] == 9 and run["summary"]["makespan_s"] > 0
    with (out / "tiny-turns.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == CSV_FIELDS and len(rows) == 9
    assert "| tiny |" in table([run])


def test_calibration_fit_moves_toward_the_gpu(cost):
    from sidecar_tools.simulator.calibrate import fit, simulate_spec

    spec = {"preset": "reference", "sessions": 2, "turns": 2, "kv_tokens": 100_000}
    base, _, _ = simulate_spec(spec, cost)
    target = {"name": "tiny", "fit": True, "gpu": {"makespan_s": base["makespan_s"] * 1.3}, "sim": spec}
    model, info = fit([target], cost, ["step_s"], max_evals=8)
    after, _, _ = simulate_spec(spec, model)
    assert model.step_s > cost.step_s
    assert abs(after["makespan_s"] / target["gpu"]["makespan_s"] - 1) < 0.15
    assert info["fit_targets"] == ["tiny"]


def test_target_from_a_gpu_run_json(tmp_path):
    from sidecar_tools.simulator.calibrate import target_from_run

    run = {"name": "cap12-generate-0.5s", "summary": {"makespan_s": 82.1, "recomputed_share": 0.0},
           "config": {"mode": "generate", "max_concurrent_sessions": 12, "lease_ttl_s": None},
           "trace": {"meta": {"generator": {"name": "reference", "sessions": 24, "turns": 16}, "tool_wait_override_s": 0.5}}}
    path = tmp_path / "cap12-generate-0.5s.json"
    path.write_text(json.dumps(run))
    t = target_from_run(path)
    assert t["fit"] and t["gpu"]["makespan_s"] == 82.1
    assert t["sim"]["max_concurrent_sessions"] == 12 and t["sim"]["tool_wait"] == 0.5
    assert t["sim"]["policy"] == "lru" and t["sim"]["kv_tokens"] == 173_200


def test_target_from_a_gpu_turns_csv(tmp_path):
    from sidecar_tools.benchmarks.records import TurnRecord, write_turns_csv
    from sidecar_tools.simulator.calibrate import collect_targets

    recs = [TurnRecord(session="s", turn=k, send_s=k, ttft_s=0.1, end_s=k + 0.5, prompt_tokens=100, cached_tokens=50,
                       completion_tokens=10, history_tokens=60 if k else 0, tool_wait_s=5.0, ok=True) for k in range(3)]
    write_turns_csv(recs, tmp_path / "lru-generate-5s-turns.csv")
    (t,) = collect_targets([str(tmp_path)], None, 173_200)
    assert t["name"] == "lru-generate-5s" and t["sim"]["tool_wait"] == 5.0 and t["sim"]["policy"] == "lru"
    assert t["gpu"]["makespan_s"] == 2.5 and t["fit"]


def test_every_simulated_turn_reaches_the_progress_hook(cost):
    from sidecar_tools.benchmarks.clients import ClientOptions
    from sidecar_tools.benchmarks.traces import build_config, generate
    from sidecar_tools.simulator.engine import SimEngine
    from sidecar_tools.simulator.virtual_replay import VirtualReplay

    trace = generate(build_config("reference", sessions=3, turns=3))
    seen = []
    replay = VirtualReplay(trace, SimEngine(kv_tokens=40_000, policy="lru", cost=cost), ClientOptions(), on_turn=seen.append)
    run, records = replay.run()
    assert len(seen) == 9 == run["summary"]["turns_ok"] and sorted(map(id, seen)) == sorted(map(id, records))
