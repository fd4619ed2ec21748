import pytest

from sidecar_tools.benchmarks import promtext
from sidecar_tools.benchmarks.records import TurnRecord, read_turns_csv, recomputed, summarize, write_turns_csv


@pytest.mark.parametrize("history,prompt,cached,expected", [
    (0, 3500, 0, 0),          # first turn: nothing to recompute
    (1000, 1600, 1000, 0),    # whole history cached
    (1000, 1600, 3000 // 10, 700),
    (1000, 1600, 1200, 0),    # cached beyond the history (new append matched elsewhere)
    (1000, 800, 0, 800),      # prompt shorter than history (truncated by a proxy): only what was sent
])
def test_recomputed(history, prompt, cached, expected):
    assert recomputed(history, prompt, cached) == expected


def _rec(session, turn, history, prompt, cached, ttft, ok=True, wait=0.0):
    return TurnRecord(session=session, turn=turn, send_s=turn, ttft_s=ttft, end_s=turn + 1,
                      client_wait_s=wait, prompt_tokens=prompt, cached_tokens=cached, completion_tokens=10,
                      history_tokens=history, ok=ok, error="" if ok else "http 500: boom")


def test_summary_share_and_percentiles():
    records = [_rec("a", 0, 0, 100, 0, 0.1, wait=2.0), _rec("a", 1, 110, 200, 60, 0.3),
               _rec("b", 0, 0, 100, 90, 0.2), _rec("b", 1, 110, 200, 110, 0.4),
               _rec("b", 2, 210, 300, 0, None, ok=False)]
    s = summarize(records, 12.5, planned_turns=5)
    assert s["history_tokens"] == 220 and s["recomputed_tokens"] == 50
    assert s["recomputed_share"] == pytest.approx(50 / 220, abs=1e-4)
    assert s["turns_ok"] == 4 and s["turns_failed"] == 1 and s["errors"] == {"http 500": 1}
    assert s["ttft_p50_s"] == pytest.approx(0.25)
    assert s["ttft_with_client_wait_p99_s"] > 2.0
    assert s["makespan_s"] == 12.5


def test_turns_csv_round_trip(tmp_path):
    records = [_rec("a", 0, 0, 100, 0, 0.1), _rec("a", 1, 110, 200, 60, None, ok=False)]
    write_turns_csv(records, tmp_path / "t.csv")
    assert read_turns_csv(tmp_path / "t.csv") == records
    assert "recomputed_tokens" in (tmp_path / "t.csv").read_text().splitlines()[0]


METRICS_BEFORE = """# HELP sglang:prompt_tokens_total x
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="m"} 100.0
sglang:cached_tokens_total{cache_source="total",model_name="m"} 40.0
sglang:num_running_reqs{model_name="m"} 3.0
sglang:ttft_seconds_bucket{le="0.1"} 4.0
"""
METRICS_AFTER = METRICS_BEFORE.replace("100.0", "350.0").replace("40.0", "90.0").replace(" 3.0", " 0.0")


def test_prometheus_parse_and_delta():
    before, after = promtext.parse(METRICS_BEFORE), promtext.parse(METRICS_AFTER)
    assert before['sglang:prompt_tokens_total{model_name="m"}'] == 100.0
    d = promtext.delta(before, after)
    assert d["counters"] == {'sglang:prompt_tokens_total{model_name="m"}': 250.0,
                             'sglang:cached_tokens_total{cache_source="total",model_name="m"}': 50.0}
    assert d["gauges_after"] == {'sglang:num_running_reqs{model_name="m"}': 0.0}
    assert promtext.parse(METRICS_BEFORE, prefix="nope") == {}
