"""The offline gap-replay command and the gap-trace formats it reads."""

import json

import pytest
from click.testing import CliRunner

from sidecar.settings import load_settings
from sidecar.policy.ttl import LeaseTtlRule
from sidecar_tools.gaps.evaluate import ReplayedGap, oracle_ttls, score
from sidecar_tools.gaps.gap_replay import gap_replay
from sidecar_tools.gaps.gap_trace import (
    GapRecord,
    GapTraceError,
    read_gap_trace,
    write_gap_trace,
)
from sidecar_tools.gaps.synthetic_gaps import synthesize_gap_trace

POLICIES = ("off", "fixed 2s", "fixed 30s", "fixed 300s", "predictive (request)", "predictive (after turn)", "clairvoyant", "oracle (TTL = gap)")


def run(*args):
    result = CliRunner().invoke(gap_replay, list(args), catch_exceptions=False)
    return result


def test_synthetic_replay_prints_every_policy_against_the_oracle(tmp_path):
    out = tmp_path / "r.json"
    result = run("--synthetic", "coding-agent", "--sessions", "25", "--json-out", str(out))
    assert result.exit_code == 0, result.output
    for column in ("hit rate", "leased token-s", "x oracle", "recomputed tok"):
        assert column in result.output
    for name in POLICIES:
        assert name in result.output
    report = json.loads(out.read_text())
    by_name = {p["policy"]: p for p in report["policies"]}
    assert by_name["oracle (TTL = gap)"]["hit_rate"] == 1.0
    assert by_name["oracle (TTL = gap)"]["leased_vs_oracle"] == 1.0
    assert by_name["off"]["hit_rate"] == 0.0 and by_name["off"]["leased_token_s"] == 0
    assert by_name["predictive (request)"]["hit_rate"] > by_name["fixed 2s"]["hit_rate"]
    assert by_name["clairvoyant"]["cost_s"] <= min(p["cost_s"] for p in report["policies"])


def test_replays_a_gap_trace_file_and_custom_fixed_ttls(tmp_path):
    trace = tmp_path / "gaps.jsonl"
    write_gap_trace(synthesize_gap_trace("interactive-chat", sessions=20, seed=3), trace)
    result = run(str(trace), "--fixed-ttl", "7", "--set", "policy.max_ttl=120")
    assert result.exit_code == 0, result.output
    assert "fixed 7s" in result.output and "fixed 30s" not in result.output
    assert "ttl [0.5, 120] s" in result.output


def test_usage_errors():
    assert run().exit_code != 0
    assert run("--synthetic", "coding-agent", "--set", "policy.min_ttl=-1").exit_code != 0


def test_gap_jsonl_round_trip_and_made_up_timeline(tmp_path):
    path = tmp_path / "g.jsonl"
    path.write_text(
        '{"session_id": "a", "tool_names": ["bash"], "context_tokens": 100, "gap_s": 2.0}\n'
        '{"session_id": "b", "tool_names": [], "context_tokens": 50, "gap_s": null}\n'
        '{"session_id": "a", "tool_names": ["edit"], "context_tokens": 300, "gap_s": 0.5}\n'
    )
    records = read_gap_trace(path)
    assert [(r.session_id, r.t) for r in records] == [("a", 1.0), ("b", 2.0), ("a", 4.0)]
    assert records[1].gap_s is None
    write_gap_trace(records, tmp_path / "copy.jsonl")
    assert read_gap_trace(tmp_path / "copy.jsonl") == records


def test_tracelab_csv_rounds_become_gaps(tmp_path):
    path = tmp_path / "rounds.csv"
    path.write_text(
        "session_id,round_idx,prefix_len,input_len,output_len,tool_wait_after_ms\n"
        "s1,1,1000,200,50,5000\n"
        "s1,0,0,1000,40,300\n"
        "s1,2,1250,100,30,0\n"
    )
    records = read_gap_trace(path)
    assert [r.gap_s for r in records] == [0.3, 5.0, None]
    # a round's prompt is prefix_len + input_len (TraceLab's replayer); context = prompt + reply
    assert [r.context_tokens for r in records] == [1040, 1250, 1380]
    assert [r.tool_names for r in records] == [["(unknown)"]] * 3


def test_agent_trace_v1_sessions_become_gaps(tmp_path):
    path = tmp_path / "agent.jsonl"
    reply = {"role": "assistant", "tool_calls": [{"function": {"name": "execute_bash", "arguments": "{}"}}]}
    path.write_text(
        '{"format": "agent-trace-v1", "name": "t", "shared_prefix_tokens": 0, "meta": {}}\n'
        + json.dumps(
            {
                "session_id": "s",
                "start_s": 5.0,
                "rounds": [
                    {"append_tokens": 1000, "output_tokens": 50, "tool_wait_s": 0.4, "reply": reply},
                    {"append_tokens": 200, "output_tokens": 30, "tool_wait_s": 2.0},
                    {"append_tokens": 100, "output_tokens": 20, "tool_wait_s": 0.0},
                ],
            }
        )
        + "\n"
    )
    records = read_gap_trace(path)
    assert [r.gap_s for r in records] == [0.4, 2.0, None]
    assert [r.context_tokens for r in records] == [1050, 1280, 1400]
    assert records[0].tool_names == ["execute_bash"] and records[1].tool_names == ["(unknown)"]
    assert records[0].t == 6.0 and records[1].t == 7.4


def test_openai_conversations_become_gaps_through_the_trace_model(tmp_path):
    path = tmp_path / "chats.jsonl"
    call = {"id": "c1", "type": "function", "function": {"name": "run_tests", "arguments": "{}"}}
    messages = [
        {"role": "user", "content": "fix the bug", "timestamp": 0.0},
        {"role": "assistant", "content": "", "tool_calls": [call], "timestamp": 1.0},
        {"role": "tool", "tool_call_id": "c1", "content": "ok", "timestamp": 4.0},
        {"role": "assistant", "content": "done", "timestamp": 5.0},
    ]
    path.write_text(json.dumps({"messages": messages}) + "\n")
    records = read_gap_trace(path)
    assert [r.gap_s for r in records] == [3.0, None]
    assert records[0].tool_names == ["run_tests"]


def test_a_file_that_is_no_trace_is_a_clear_error(tmp_path):
    path = tmp_path / "notes.jsonl"
    path.write_text('{"hello": "world"}\n')
    with pytest.raises(GapTraceError, match="notes.jsonl"):
        read_gap_trace(path)


def test_bad_trace_lines_name_the_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"session_id": "a", "gap_s": 1}\n{"gap_s": 1}\n')
    with pytest.raises(GapTraceError, match=":2:"):
        read_gap_trace(path)


def test_synthetic_trace_has_per_tool_signal_and_a_regime_change():
    records = synthesize_gap_trace("coding-agent", sessions=80, seed=0, regime_change_at=0.5, slowdown=10)
    change_t = sorted({r.t for r in records})[len(records) // 2]
    bash_early = sorted(r.gap_s for r in records if r.tool_names == ["execute_bash"] and r.t < change_t * 0.8)
    edits = sorted(r.gap_s for r in records if r.tool_names == ["str_replace_editor"])
    assert edits[len(edits) // 2] < 0.3 < bash_early[len(bash_early) // 2]
    assert all(r.gap_s is None for r in records if r.tool_names == ["finish"])
    bash_late = sorted(r.gap_s for r in records if r.tool_names == ["execute_bash"] and r.t > change_t * 1.5)
    assert bash_late[len(bash_late) // 2] > 5 * bash_early[len(bash_early) // 2]
    assert synthesize_gap_trace("coding-agent", sessions=5, seed=1) == synthesize_gap_trace("coding-agent", sessions=5, seed=1)


def _gap_lines(path, gaps_by_session):
    path.write_text("".join(
        json.dumps({"session_id": sid, "tool_names": ["bash"], "context_tokens": 1000, "gap_s": gap}) + "\n"
        for sid, gaps in gaps_by_session.items() for gap in gaps))
    return path


def test_zero_second_gaps_are_hits_and_the_oracle_scores_full(tmp_path):
    trace = _gap_lines(tmp_path / "zero.jsonl", {"a": [0.0, 0.0, None], "b": [0.0, None]})
    out = tmp_path / "r.json"
    result = run(str(trace), "--json-out", str(out))
    assert result.exit_code == 0, result.output
    by_name = {p["policy"]: p for p in json.loads(out.read_text())["policies"]}
    for name in ("oracle (TTL = gap)", "clairvoyant", "off", "fixed 2s"):
        assert by_name[name]["hit_rate"] == 1.0 and by_name[name]["recomputed_tokens"] == 0
    assert by_name["oracle (TTL = gap)"]["leased_token_s"] == 0 and by_name["off"]["leased_vs_oracle"] is None
    oracle_row = next(line for line in result.output.splitlines() if line.startswith("oracle"))
    assert oracle_row.split()[-3] == "-"  # x oracle: no ratio to a zero
    assert "3 of 0 s" in result.output


def test_sessions_that_never_return_have_no_hit_rate(tmp_path):
    trace = _gap_lines(tmp_path / "gone.jsonl", {"a": [None], "b": [None]})
    out = tmp_path / "r.json"
    result = run(str(trace), "--fixed-ttl", "30", "--json-out", str(out))
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert all(p["hit_rate"] is None and p["recomputed_tokens"] == 0 for p in report["policies"])
    by_name = {p["policy"]: p for p in report["policies"]}
    assert by_name["fixed 30s"]["leased_token_s"] == 2 * 1000 * 30 and by_name["oracle (TTL = gap)"]["leased_token_s"] == 0
    assert "2 never came back, 0 of 0 s" in result.output
    assert next(line for line in result.output.splitlines() if line.startswith("fixed 30s")).split()[2] == "-"


def test_the_last_turn_is_leased_in_vain_and_the_oracle_holds_nothing_for_it():
    rule = LeaseTtlRule(load_settings(None).policy)
    gaps = [ReplayedGap(GapRecord("a", ["bash"], 100, 2.0, 1.0), 0, 0, 1.0),
            ReplayedGap(GapRecord("a", ["finish"], 200, None, 4.0), 0, 0, 1.0)]
    fixed = score("fixed 30s", gaps, [30.0, 30.0], rule)
    assert (fixed.returns, fixed.hits, fixed.leased_token_s) == (1, 1, 100 * 2.0 + 200 * 30.0)
    oracle = score("oracle", gaps, oracle_ttls(gaps), rule)
    assert (oracle.hits, oracle.leased_token_s, oracle.recomputed_tokens) == (1, 200.0, 0)
    off = score("off", gaps, [0.0, 0.0], rule)
    assert (off.hit_rate, off.recomputed_tokens) == (0.0, 100)


def test_a_trace_whose_last_round_records_a_gap_still_ends_there(tmp_path):
    path = tmp_path / "agent.jsonl"
    path.write_text(
        '{"format": "agent-trace-v1", "name": "t", "shared_prefix_tokens": 0, "meta": {}}\n'
        '{"session_id": "s", "start_s": 0, "rounds": [{"append_tokens": 10, "output_tokens": 5, "tool_wait_s": 1.0}, '
        '{"append_tokens": 10, "output_tokens": 5, "tool_wait_s": 7.0}]}\n'
    )
    assert [r.gap_s for r in read_gap_trace(path)] == [1.0, None]


def test_tracelab_round_trace_gaps_keep_the_recorded_timeline(tmp_path):
    def row(index, total, output, events, tools=()):
        return {"provider": "claude", "session_id": "claude:s", "round_index": index, "input_tokens_total": total,
                "prefix_tokens": 0, "newly_append_tokens": total, "output_tokens": output, "timing_events": events,
                "tools": [{"tool_index": i, "tool_name": n, "tool_wall_latency_ms": 1} for i, n in enumerate(tools)]}

    rows = [row(0, 1000, 100, [{"event_type": "user_message", "timestamp": "2026-01-01T00:00:50Z"},
                               {"event_type": "tool_call", "timestamp": "2026-01-01T00:00:54Z"}], ["Bash"]),
            row(1, 1500, 50, [{"event_type": "tool_result", "timestamp": "2026-01-01T00:01:00Z"},
                              {"event_type": "text", "timestamp": "2026-01-01T00:01:02Z"}])]
    path = tmp_path / "round_trace.expanded.json"
    path.write_text("# TraceLab-shaped sample\n\n" + "\n".join(
        f"===== round {i:04d} | provider claude =====\n{json.dumps(r, indent=2)}" for i, r in enumerate(rows, 1)))
    records = read_gap_trace(path)
    assert [(r.t, r.gap_s, r.tool_names, r.context_tokens) for r in records] == [
        (4.0, 6.0, ["Bash"], 1100), (12.0, None, [], 1550)]


def test_every_gap_reaches_the_progress_hook():
    from sidecar_tools.gaps.evaluate import evaluate

    records = synthesize_gap_trace("coding-agent", 5, 0)
    ticks = []
    evaluate(records, load_settings(), on_gap=lambda: ticks.append(1))
    assert len(ticks) == len(records)


def test_the_after_turn_lease_is_the_one_the_turn_leaves_in_force(monkeypatch):
    """The replay makes the turn's policy calls: the after-turn lease is sent only when it moved
    enough (``worth_revising``), else the request's lease stays in force and is what is scored."""
    from collections import defaultdict

    from sidecar.policy.lease_policy import LeasePolicy
    from sidecar.turn.policy_calls import worth_revising
    from sidecar_tools.gaps.evaluate import replay_predictive

    asked, revised = defaultdict(list), defaultdict(list)  # per session, in turn order
    for name, log in (("lease_request", asked), ("after_turn", revised)):
        def spy(self, session_id, *args, _real=getattr(LeasePolicy, name), _log=log):
            lease = _real(self, session_id, *args)
            _log[session_id].append(lease)
            return lease
        monkeypatch.setattr(LeasePolicy, name, spy)
    gaps = replay_predictive(synthesize_gap_trace("coding-agent", sessions=30, seed=3), load_settings(None))
    sent_counts = {True: 0, False: 0}
    for g in gaps:
        sent, after = asked[g.record.session_id].pop(0), revised[g.record.session_id].pop(0)
        assert g.ttl_request == (sent.ttl_s if sent is not None else 0.0)
        goes_out = after is not None and worth_revising(sent, after)
        assert g.ttl_after_turn == (after.ttl_s if goes_out else g.ttl_request)
        sent_counts[goes_out] += 1
    assert sent_counts[True] and sent_counts[False]  # both cases were replayed
