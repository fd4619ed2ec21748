"""The open-loop capacity benchmark: Poisson arrivals, the steady window, the SLO verdict, the
search for the largest rate meeting it, and the capacity JSON (simulator and URL drivers)."""

from __future__ import annotations

import json
import time
import math

import numpy as np
import pytest
from click.testing import CliRunner

from sidecar_tools.benchmarks.capacity import CONFIGS, capacity, engine_flags, sidecar_flags, simulate_flags
from sidecar_tools.benchmarks.capacity_report import find_results, table
from sidecar_tools.benchmarks.capacity_slo import (
    SLO, Window, capacity_from_points, judge, percentile, search_capacity,
)
from sidecar_tools.benchmarks.open_loop import RecordedPool, first_arrivals, open_loop_trace, poisson_arrivals
from sidecar_tools.benchmarks.records import TurnRecord
from sidecar_tools.benchmarks.traces import PRESETS, Round, Session, Trace, generate, load_jsonl, save_jsonl

# ------------------------------------------------------------------------------- arrivals


def test_arrivals_are_a_poisson_process_of_the_asked_rate():
    rate, window = 30.0, 600.0  # 300 expected arrivals per run
    counts, gaps = [], []
    for seed in range(200):
        t = poisson_arrivals(rate, window, seed)
        assert all(0 <= a < window for a in t) and t == sorted(t)
        counts.append(len(t))
        gaps.extend(np.diff([0.0, *t]))
    expected = rate * window / 60
    counts = np.array(counts)
    assert abs(counts.mean() - expected) < 3 * math.sqrt(expected / len(counts))  # mean of the counts: 300 +- 3.7
    assert 0.8 < counts.var() / counts.mean() < 1.25  # Poisson counts: variance = mean
    gaps = np.array(gaps)
    assert gaps.mean() == pytest.approx(60 / rate, rel=0.02)  # exponential gaps, mean 2 s
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.03)  # coefficient of variation 1
    assert np.mean(gaps > gaps.mean()) == pytest.approx(math.exp(-1), abs=0.01)  # memoryless tail


def test_the_same_seed_gives_the_same_arrivals_and_rates_share_them():
    assert poisson_arrivals(10, 300, 4) == poisson_arrivals(10, 300, 4)
    assert poisson_arrivals(10, 300, 4) != poisson_arrivals(10, 300, 5)
    slow, fast = poisson_arrivals(10, 300, 4), poisson_arrivals(20, 150, 4)
    assert fast == pytest.approx([t / 2 for t in slow], abs=1e-3)  # twice the rate: the same points, twice as dense
    assert first_arrivals(10, len(slow), 4) == slow  # a run of n arrivals: the process's first n points
    assert first_arrivals(20, 700, 4)[:len(fast)] == fast  # past the first block of drawn gaps too


@pytest.mark.parametrize("rate,window", [(0, 60), (-1, 60), (10, 0)])
def test_a_rate_or_window_that_is_not_positive_is_refused(rate, window):
    with pytest.raises(ValueError):
        poisson_arrivals(rate, window, 0)
    with pytest.raises(ValueError):
        first_arrivals(rate if rate <= 0 else 10, 0 if rate > 0 else 5, 0)


def test_reference_sessions_arrive_at_the_poisson_times_and_are_the_presets_own():
    trace = open_loop_trace("reference", 30, 40, seed=2)
    assert [s.start_s for s in trace.sessions] == first_arrivals(30, 40, 2)
    assert len(trace.sessions) == 40
    preset = generate(PRESETS["reference"])  # seed 2: arrival i < 24 is the preset's session i
    assert [s.rounds for s in trace.sessions[:24]] == [s.rounds for s in preset.sessions]
    assert trace.shared_prefix_tokens == 3000
    assert trace.meta["open_loop"]["rate_per_min"] == 30


def _tiny_trace(path, name, sessions, rounds=2, gap=0.01, output=4):
    trace = Trace(name=name, sessions=[
        Session(session_id=f"{name}{i}", rounds=[Round(append_tokens=20 + i, output_tokens=output, tool_wait_s=gap)
                                                 for _ in range(rounds)]) for i in range(sessions)])
    save_jsonl(trace, path)
    return path


def test_recorded_sessions_are_sampled_with_replacement_by_source_weight(tmp_path):
    a = _tiny_trace(tmp_path / "a.jsonl", "a", 2)
    b = _tiny_trace(tmp_path / "b.jsonl", "b", 10, rounds=3)
    pool = RecordedPool(((str(a), 1.0), (str(b), 3.0)))
    trace = open_loop_trace("traces", 120, 1200, seed=1, pool=pool)
    n = len(trace.sessions)
    from_a = [s for s in trace.sessions if "-a-" in s.session_id]
    assert len(from_a) / n == pytest.approx(0.25, abs=0.04)
    assert len({s.session_id for s in trace.sessions}) == n  # every arrival its own session (own prompts)
    originals = {s.session_id: s.rounds for s in load_jsonl(a).sessions + load_jsonl(b).sessions}
    assert all(s.rounds == originals[s.session_id.split("-", 2)[2]] for s in trace.sessions)  # recorded gaps kept
    picked = [s.session_id.split("-", 2)[2] for s in trace.sessions]
    assert len(set(picked)) == 12 and max(picked.count(x) for x in set(picked)) > 1  # with replacement


def test_the_default_pool_is_the_committed_real_traces_each_session_equally_likely():
    trace = open_loop_trace("traces", 60, 2200, seed=2)
    sources = {s["trace"]: s["weight"] for s in trace.meta["open_loop"]["drawn_from"]["sources"]}
    assert sources == {"tracelab-examples": 2, "lmcache-miniswe": 20}  # weight = sessions in the file
    tracelab = sum("-tracelab-examples-" in s.session_id for s in trace.sessions)
    assert tracelab / len(trace.sessions) == pytest.approx(2 / 22, abs=0.02)
    assert trace.shared_prefix_tokens == 0


# ------------------------------------------------------------------------------- window and SLO


def _records(session, ttfts, ok=True):
    return [TurnRecord(session=session, turn=k, ttft_s=t, ok=ok) for k, t in enumerate(ttfts)]


WINDOW = Window(warmup=2, measure=3, cooldown=2, drain_s=30)


def test_the_window_counts_only_sessions_arriving_in_the_steady_part():
    assert WINDOW.sessions == 7 and WINDOW.time_limit_s(100.0) == 130.0
    assert [WINDOW.measured(i) for i in range(7)] == [False, False, True, True, True, False, False]
    arrivals = {"warm": 0, "m1": 2, "m2": 4, "cool": 5}
    planned = dict.fromkeys(arrivals, 3)
    records = (_records("warm", [50, 50, 50]) + _records("m1", [0.5, 0.1, 0.2]) + _records("m2", [0.4, 0.3, 0.1])
               + _records("cool", [50, 50, 50]))
    point = judge(records, arrivals, planned, 6.0, WINDOW, SLO())
    assert point.meets_slo  # the slow warm-up and cool-down sessions do not count
    assert (point.sessions_arrived, point.sessions_measured, point.turns_measured, point.turns_missing) == (4, 2, 6, 0)
    assert point.first_turn_ttft_p99_s == pytest.approx(np.percentile([0.5, 0.4], 99))
    assert point.later_turn_ttft_p99_s == pytest.approx(np.percentile([0.1, 0.2, 0.3, 0.1], 99))
    with pytest.raises(ValueError):
        Window(warmup=1, measure=0)


@pytest.mark.parametrize("later,first,meets", [
    (2.0, 10.0, True),     # at the limits
    (2.05, 1.0, False),    # later turns too slow
    (0.5, 10.5, False),    # first turn (door wait included in its TTFT) too slow
])
def test_the_slo_has_a_later_turn_and_a_first_turn_limit(later, first, meets):
    arrivals = {f"s{i}": 2 + i for i in range(3)}
    records = [r for i in range(3) for r in _records(f"s{i}", [first, later, later])]
    point = judge(records, arrivals, dict.fromkeys(arrivals, 3), 6.0, WINDOW, SLO(2.0, 10.0))
    assert point.meets_slo is meets


def test_a_measured_turn_that_never_got_a_first_token_misses_the_slo():
    window = Window(warmup=0, measure=10, cooldown=0)
    arrivals = {f"s{i}": i for i in range(10)}
    planned = dict.fromkeys(arrivals, 11)
    records = [r for i in range(10) for r in _records(f"s{i}", [0.1] * 11)]
    assert judge(records, arrivals, planned, 6.0, window, SLO()).meets_slo
    failed = [r for r in records if not (r.session == "s0" and r.turn == 5)]
    failed.append(TurnRecord(session="s0", turn=5, ttft_s=None, ok=False, error="http 429: admission queue full"))
    cut = [r for r in records if not (r.session == "s1" and r.turn >= 9)]  # cut at the time limit: never sent
    for recs, missing in ((failed, 1), (cut, 2)):
        point = judge(recs, arrivals, planned, 6.0, window, SLO())
        assert point.turns_missing == missing
        assert point.later_turn_ttft_p99_s == math.inf and not point.meets_slo
        assert point.to_dict()["later_turn_ttft_p99_s"] is None  # JSON has no infinity


def test_no_measured_session_is_no_verdict_of_success():
    point = judge(_records("a", [0.1, 0.1]), {"a": 0}, {"a": 2}, 6.0, WINDOW, SLO())
    assert point.sessions_measured == 0 and not point.meets_slo


def test_percentile_is_numpys_and_infinite_where_it_reaches_a_missing_value():
    xs = list(np.random.default_rng(0).exponential(1.0, 57))
    for p in (50, 90, 99):
        assert percentile(xs, p) == pytest.approx(np.percentile(xs, p))
    assert percentile([1.0] * 200 + [math.inf], 99) == 1.0  # 1 missing of 201 stays under p99
    assert percentile([1.0] * 50 + [math.inf], 99) == math.inf
    assert percentile([]) is None


# ------------------------------------------------------------------------------- the search


def _p99(rate):  # a synthetic monotone p99(λ): 0.1 s at rest, 2 s at λ* = 10 ln 20 ≈ 29.96/min
    return 0.1 * math.exp(rate / 10)


KNEE = 10 * math.log(20)


@pytest.mark.parametrize("start", [3.0, 12.0, 29.0, 31.0, 100.0])
def test_bisection_finds_the_largest_rate_meeting_the_slo(start):
    asked = []

    def evaluate(rate):
        asked.append(rate)
        return _p99(rate) <= 2.0

    found = search_capacity(evaluate, start, tolerance=0.05)
    lo, hi = found["bracket"]["passing_per_min"], found["bracket"]["failing_per_min"]
    assert lo <= KNEE < hi and hi / lo - 1 <= 0.05 and found["bounded"]
    assert found["capacity_per_min"] == lo
    assert len(asked) == len(set(asked)) == len(found["rates_tried"]) <= 10  # each rate simulated once


def test_the_search_reports_bounds_it_could_not_close():
    never = search_capacity(lambda r: True, 10, max_rate=50)
    assert never["capacity_per_min"] == 50 and not never["bounded"] and never["bracket"]["failing_per_min"] is None
    always = search_capacity(lambda r: False, 10, min_rate=1)
    assert always["capacity_per_min"] == 0.0 and not always["bounded"] and always["bracket"]["failing_per_min"] == 1
    budget = search_capacity(lambda r: _p99(r) <= 2.0, 1, tolerance=0.001, max_points=4)
    assert budget["budget_exhausted"] and len(budget["rates_tried"]) == 4
    with pytest.raises(ValueError):
        search_capacity(lambda r: True, 0)


def test_a_pass_above_a_failure_is_not_capacity():
    pts = [{"rate_per_min": r, "meets_slo": ok} for r, ok in ((10, True), (14, False), (17, True), (20, False))]
    assert capacity_from_points(pts) == {"capacity_per_min": 10, "bounded": True,
                                         "bracket": {"passing_per_min": 10, "failing_per_min": 14}}


# ------------------------------------------------------------------------------- configurations


def test_configurations_translate_to_the_simulators_flags():
    product = simulate_flags(engine_flags("product", 1, "traces"), sidecar_flags("product"))
    assert product[:6] == ["--kv-tokens", "173200", "--enable-hierarchical-cache", "--hicache-ratio", "1", "--policy"]
    assert "session_ttl" in product and "--sidecar-config" in product and product[-3:] == \
        ["--context-length", "65536", "--sidecar-config", "configs/coding-agent.toml"][-3:]
    hicache = simulate_flags(engine_flags("hicache", 3, "reference"), sidecar_flags("hicache"))
    assert hicache == ["--kv-tokens", "173200", "--enable-hierarchical-cache", "--hicache-ratio", "3", "--policy", "lru",
                       "--sidecar-set", "policy.mode=off", "--sidecar-set", "admission.enabled=false"]
    assert simulate_flags([], ["--port", "8000", "--admission-max-wait", "60", "--config", "x.toml"]) == \
        ["--sidecar-set", "admission.max_wait=60", "--sidecar-config", "x.toml"]  # [server] flags mean nothing in a replay
    with pytest.raises(ValueError, match="--tp-size"):
        simulate_flags(["--tp-size", "2"], [])
    with pytest.raises(ValueError, match="--no-such"):
        simulate_flags([], ["--no-such-flag"])
    assert set(CONFIGS) == {"hicache", "product"}


def test_the_flags_command_prints_what_the_gpu_script_starts():
    out = CliRunner().invoke(capacity, ["flags", "--config", "product", "--hicache-ratio", "3", "--dist", "reference",
                                        "--part", "engine"])
    assert out.exit_code == 0, out.output
    assert out.output.strip() == ("--max-total-tokens 173200 --enable-hierarchical-cache --hicache-ratio 3 "
                                  "--radix-eviction-policy session_ttl --radix-eviction-policy-config "
                                  "'{\"max_leased_fraction\": 0.8}'")


# ------------------------------------------------------------------------------- end to end

TINY = ["--warmup", "1", "--measure", "3", "--cooldown", "1", "--drain", "20"]


def _check_shape(result, source):
    assert set(result) >= {"capacity_per_min", "slo", "points", "bracket", "bounded", "config", "distribution",
                           "hicache_ratio", "source", "seed", "deployment", "command"}
    assert result["source"] == source
    assert result["slo"]["later_turn_ttft_p99_s"] == 2.0 and result["slo"]["first_turn_ttft_p99_s"] == 10.0
    assert result["slo"]["window"] == {"warmup": 1, "measure": 3, "cooldown": 1, "drain_s": 20.0, "sessions": 5,
                                       "unit": "arrivals, in arrival order", "time_limit": "the last arrival + drain_s"}
    for p in result["points"]:
        assert {"rate_per_min", "meets_slo", "later_turn_ttft_p99_s", "first_turn_ttft_p99_s", "sessions_measured",
                "sessions_arrived", "turns_missing", "engine"} <= set(p)
        assert p["engine"] == source and p["sessions_arrived"] == 5 and p["sessions_measured"] == 3


def test_search_in_the_simulator_writes_the_capacity_json(tmp_path):
    pool = _tiny_trace(tmp_path / "pool.jsonl", "p", 3, rounds=3, gap=0.2, output=8)
    out = tmp_path / "out"
    res = CliRunner().invoke(capacity, ["search", "--config", "hicache", "--dist", "traces", "--hicache-ratio", "3",
                                        "--trace-file", str(pool), *TINY, "--start", "30", "--max-points", "2",
                                        "--max-rate", "60", "--out", str(out)])
    assert res.exit_code == 0, res.output
    result = json.loads((out / "capacity-hicache-traces-r3.json").read_text())
    _check_shape(result, "simulator")
    assert [p["rate_per_min"] for p in result["points"]] == [30, 60]
    assert all(p["meets_slo"] and p["turns_missing"] == 0 for p in result["points"])  # tiny sessions: never loaded
    assert result["capacity_per_min"] == 60 and not result["bounded"]
    assert result["deployment"]["simulate_flags"][-4:] == ["--sidecar-set", "policy.mode=off",
                                                           "--sidecar-set", "admission.enabled=false"]
    assert result["command"].startswith("sglang-sidecar capacity search --config hicache")
    assert "later-turn TTFT p99" in table(find_results([str(out)]))


def test_run_against_a_url_uses_the_same_driver_and_merges_points(tmp_path, sglang_double_thread):
    pool = _tiny_trace(tmp_path / "pool.jsonl", "p", 3, rounds=2, gap=0.05)
    out = tmp_path / "out"
    args = ["run", "--config", "product", "--dist", "traces", "--hicache-ratio", "1", "--trace-file", str(pool), *TINY,
            "--url", sglang_double_thread.url, "--mode", "generate", "--out", str(out)]
    for rate in ("40", "90"):
        res = CliRunner().invoke(capacity, [*args, "--rate", rate])
        assert res.exit_code == 0, res.output
    result = json.loads((out / "capacity-product-traces-r1.json").read_text())
    _check_shape(result, "gpu")
    assert [p["rate_per_min"] for p in result["points"]] == [40, 90]
    assert all(p["meets_slo"] and p["sessions_measured"] > 0 for p in result["points"])
    run = json.loads((out / "capacity-product-traces-r1-at-40.json").read_text())
    sent = {r["session_id"] for r in sglang_double_thread.requests}
    assert run["capacity_point"]["sessions_arrived"] == run["summary"]["sessions"] and len(sent) == \
        sum(json.loads((out / f"capacity-product-traces-r1-at-{r}.json").read_text())["summary"]["sessions"]
            for r in ("40", "90"))  # every arrival its own session at the engine, salted per run
    res = CliRunner().invoke(capacity, [*args, "--rate", "40", "--seed", "3"])
    assert res.exit_code != 0 and "another SLO, window, seed or source" in res.output


def test_a_rate_that_could_outlast_the_lent_machine_is_skipped_not_cut(tmp_path, sglang_double_thread):
    """--not-after (the GPU session's end): a rate whose run could end after it is not started, so no
    point cut short reads as a missed SLO; the ones that fit run and merge as usual."""
    pool = _tiny_trace(tmp_path / "pool.jsonl", "p", 3, rounds=2, gap=0.05)
    out = tmp_path / "out"
    args = ["run", "--config", "product", "--dist", "traces", "--hicache-ratio", "1", "--trace-file", str(pool), *TINY,
            "--url", sglang_double_thread.url, "--mode", "generate", "--out", str(out), "--rate", "40"]
    res = CliRunner().invoke(capacity, [*args, "--not-after", str(time.time() + 1)])
    assert res.exit_code == 0, res.output
    assert "λ 40/min skipped" in res.output and "no rate run" in res.output
    assert not out.exists() and sglang_double_thread.requests == []
    res = CliRunner().invoke(capacity, [*args, "--not-after", str(time.time() + 3600)])
    assert res.exit_code == 0, res.output
    result = json.loads((out / "capacity-product-traces-r1.json").read_text())
    assert [p["rate_per_min"] for p in result["points"]] == [40]
