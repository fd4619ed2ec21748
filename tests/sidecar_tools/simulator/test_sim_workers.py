"""Several simulated workers: placement by the sidecar's own policy, sticky sessions, a lost worker's
sessions re-homed (recomputed, or read back from a shared L3 store), and when that store pays."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("sglang")

from click.testing import CliRunner

from sidecar.cli import main

PRODUCT = {"policy": "session_ttl", "policy_config": {"max_leased_fraction": 0.8},
           "sidecar": {"config": "configs/coding-agent.toml"}}
ROOMY = {"kv_tokens": 60_000}  # every session's KV stays on its worker: each turn hits its own history
LOSS = {**PRODUCT, "hicache_ratio": 1, "workers": 2, "lose_worker": ["0@6"]}


def _turns_by_session(records):
    out: dict[str, list] = {}
    for r in sorted(records, key=lambda r: (r.session, r.turn, r.send_s)):
        out.setdefault(r.session, []).append(r)
    return out


@pytest.mark.parametrize("workers", [2, 3])
def test_new_sessions_spread_over_the_workers(simulate, workers):
    summary, _, run = simulate(**PRODUCT, workers=workers)
    placed = [w["sessions_placed"] for w in run["workers"]]
    assert summary["turns_ok"] == 48 and sum(placed) == 8  # each session placed once, none moved
    assert min(placed) >= 1 and max(placed) < 8  # no worker gets them all
    assert sum(w["turns_served"] for w in run["workers"]) == 48
    # the per-worker load adds up to the run's own figures
    assert sum(w["prompt_tokens"] for w in run["workers"]) == summary["prompt_tokens"]
    assert sum(w["recomputed_tokens"] for w in run["workers"]) == summary["recomputed_tokens"]
    assert all(0 < w["busy_fraction"] <= 1 for w in run["workers"])
    assert all(0 < w["peak_used_kv_tokens"] <= w["peak_resident_kv_tokens"] <= 24_000 for w in run["workers"])


def test_baseline_without_sidecar_is_placed_too(simulate):
    _, _, run = simulate(policy="lru", workers=2)
    assert run["config"]["workers"]["placement"] == "placement-only"
    assert min(w["sessions_placed"] for w in run["workers"]) >= 1


@pytest.mark.parametrize("sidecar", [PRODUCT["sidecar"], None])
def test_every_turn_of_a_session_goes_to_its_worker(simulate, sidecar):
    spec = {**PRODUCT, **ROOMY, "workers": 3, "sidecar": sidecar}
    summary, records, _ = simulate(**spec)
    assert summary["turns_ok"] == 48
    for turns in _turns_by_session(records).values():
        for prev, turn in zip(turns, turns[1:], strict=False):
            # its whole history is cached: it lives only on the worker that served the turn before
            assert turn.cached_tokens == prev.prompt_tokens + prev.completion_tokens - 1


def test_one_worker_is_the_single_engine_replay(cost):
    """A list of one engine is the replay of that engine: same records, and no per-worker entries."""
    from sidecar_tools.benchmarks.clients import ClientOptions
    from sidecar_tools.simulator.calibrate import _trace
    from sidecar_tools.simulator.engine import SimEngine
    from sidecar_tools.simulator.virtual_replay import VirtualReplay

    def run(engines):
        trace = _trace({"preset": "reference", "sessions": 6, "turns": 4})
        return VirtualReplay(trace, engines, ClientOptions()).run()

    alone, alone_records = run(SimEngine(kv_tokens=16_000, cost=cost))
    listed, listed_records = run([SimEngine(kv_tokens=16_000, cost=cost)])
    assert [vars(r) for r in alone_records] == [vars(r) for r in listed_records]
    assert alone["summary"]["recomputed_tokens"] > 0  # under pressure: the comparison sees eviction too
    assert "workers" not in listed and "faults" not in listed


@pytest.fixture(scope="module")
def loss_runs(simulate):
    """The same 2-worker run, worker 0 lost at 6 s: recomputed, and with a fast and a slow shared L3."""
    return {"recompute": simulate(**LOSS), "fast": simulate(**LOSS, shared_l3_gbps=50.0),
            "slow": simulate(**LOSS, shared_l3_gbps=0.05)}


def test_a_lost_workers_sessions_are_rehomed_and_recomputed(loss_runs):
    summary, records, run = loss_runs["recompute"]
    faults, (lost, kept) = run["faults"], run["workers"]
    assert lost["lost_at_s"] == 6 and kept["lost_at_s"] is None
    assert summary["turns_ok"] == 48  # every turn served in the end: failed ones were resent
    assert summary["errors"].get("http 502", 0) == faults["failed_requests"] == summary["turns_failed"] > 0
    assert faults["rehomed_sessions"] >= 1
    assert kept["sessions_placed"] == 8 - lost["sessions_placed"] + faults["rehomed_sessions"]
    # nothing of a re-homed session's own history is on its new worker: recomputed, all but the shared prompt
    shared = 3000 * faults["rehomed_sessions"]
    assert faults["rehomed_recomputed_tokens"] >= faults["rehome_history_tokens"] - shared - faults["rehomed_sessions"]
    assert faults["rehomed_l3_read_tokens"] == 0
    for turns in _turns_by_session(records).values():  # a failed turn is followed by its retry
        for i, r in enumerate(turns):
            if not r.ok:
                assert turns[i + 1].turn == r.turn and turns[i + 1].send_s >= r.end_s


def test_a_shared_l3_store_reads_instead_of_recomputing(loss_runs):
    recompute, fast = loss_runs["recompute"][2]["faults"], loss_runs["fast"][2]["faults"]
    assert fast["rehomed_sessions"] == recompute["rehomed_sessions"]
    assert fast["rehomed_recomputed_tokens"] <= 0.05 * recompute["rehomed_recomputed_tokens"]
    assert fast["rehomed_l3_read_tokens"] >= 0.9 * recompute["rehomed_recomputed_tokens"]
    assert fast["l3"]["read_tokens"] == fast["rehomed_l3_read_tokens"]


def test_l3_pays_when_it_reads_faster_than_recompute_and_not_when_slow(loss_runs):
    ttft = {k: v[2]["faults"]["rehomed_ttft_mean_s"] for k, v in loss_runs.items()}
    assert ttft["fast"] < ttft["recompute"] < ttft["slow"]
    makespan = {k: v[0]["makespan_s"] for k, v in loss_runs.items()}
    assert makespan["fast"] <= 1.01 * makespan["recompute"] < makespan["slow"]


def test_cli_prints_the_per_worker_table_and_json(tmp_path):
    result = CliRunner().invoke(main, [
        "simulate", "--synthetic", "reference", "--sessions", "4", "--turns", "3", "--kv-tokens", "12000",
        "--hicache-ratio", "1", "--workers", "2", "--lose-worker", "1@2", "--shared-l3", "--json",
        "--name", "two", "--out", str(tmp_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "| worker | sessions | turns |" in result.output and "| w1 |" in result.output
    assert "worker loss:" in result.output
    shown = json.loads(result.output[result.output.index("\n{"):])
    assert [w["worker"] for w in shown["workers"]] == ["w0", "w1"] and "faults" in shown
    saved = json.loads((tmp_path / "two.json").read_text())
    assert saved["config"]["workers"]["losses"] == ["1@2"] and saved["config"]["workers"]["shared_l3"]["read_gbps"] == 1.5  # the default: the file backend as measured


@pytest.mark.parametrize("args, message", [
    (["--lose-worker", "0@5"], "needs --workers 2"),
    (["--workers", "2", "--lose-worker", "2@5"], "only 2 workers"),
    (["--workers", "2", "--lose-worker", "x"], "expected W@T"),
    (["--workers", "2", "--shared-l3"], "under its host tier"),
])
def test_cli_refuses_faults_that_cannot_happen(args, message):
    result = CliRunner().invoke(main, ["simulate", "--sessions", "2", "--turns", "2", *args])
    assert result.exit_code != 0 and message in result.output


def test_cli_one_explicit_worker_adds_its_table_not_other_figures():
    args = ["simulate", "--synthetic", "reference", "--sessions", "3", "--turns", "3", "--kv-tokens", "9000", "--name", "one"]
    plain = CliRunner().invoke(main, args, catch_exceptions=False)
    explicit = CliRunner().invoke(main, [*args, "--workers", "1"], catch_exceptions=False)
    summary = [line for line in plain.output.splitlines() if line.startswith("one: makespan")]
    assert summary and summary[0] in explicit.output.splitlines()
    assert "| worker |" not in plain.output and "| w0 | 3 | 9 |" in explicit.output
