"""The readers of recorded traces, each on a small sample in its publisher's exact shape (our values)."""

import json

import pytest
from click.testing import CliRunner

from sidecar_tools.benchmarks.trace_formats import TraceFormatError, detect_format, read_trace, token_counter
from sidecar_tools.benchmarks.traces import _prompt_lengths, cli, load_jsonl, read_any

WORDS = lambda text: len(text.split())  # noqa: E731 - a token counter the samples are easy to check with


# ------------------------------------------------------------------------------------------------
# TraceLab normalized round trace (README "Normalized Rows"; example_sessions/derived/)


def _tool(index, name, emitted, result, wall_ms, internal_ms=None):
    return {"tool_index": index, "tool_name": name, "tool_call_id": f"call_{name}_{index}", "emitted_at": emitted,
            "input": {"command": "true"}, "input_chars": 12, "result_chars": 40, "tool_wall_latency_ms": wall_ms,
            "tool_internal_latency_ms": internal_ms, "is_error": False, "result_at": result}


def _event(kind, ts, **extra):
    return {"event_type": kind, "timestamp": ts, "source": f"sample.{kind}", **extra}


def _round(provider, sid, index, total, prefix, output, events, tools=(), reasoning=None):
    first_input = next((e["event_type"] for e in events if e["event_type"] in ("user_message", "tool_result")), None)
    return {
        "provider": provider, "project": "sample-project", "session_id": sid, "session_file": "sample/trace.json",
        "round_index": index, "round_id": f"msg_{sid}_{index}", "model": "sample-model",
        "input_tokens_total": total, "prefix_tokens": prefix, "newly_append_tokens": total - prefix,
        "claude_uncached_input_tokens": None, "claude_cache_creation_input_tokens": None,
        "claude_cache_read_input_tokens": None, "output_tokens": output, "reasoning_output_tokens": reasoning,
        "timing_events": events, "tools": list(tools), "current_input_event_count": 1,
        "current_user_message_count": 0, "current_tool_result_count": 1, "current_user_message_chars": 0,
        "current_tool_result_chars": 40, "current_input_chars": 40, "first_input_event_type": first_input,
        "home": "/home/user", "user": "user", "store": f".{provider}", "trace_key": f"{provider}:{sid}:{index}",
    }


def tracelab_rows():
    t = "2026-01-01T00:00:"
    a = [  # Claude-like: two parallel tools, then a reply without tools, then the user's next message
        _round("claude", "claude:a", 0, 1000, 0, 100, [
            _event("user_message", t + "00.000Z", content_chars=30), _event("reasoning", t + "02.000Z"),
            _event("text", t + "02.500Z"), _event("tool_call", t + "03.000Z", tool_name="Bash", tool_index=0),
            _event("tool_call", t + "04.000Z", tool_name="WebSearch", tool_index=1)],
            [_tool(0, "Bash", t + "03.000Z", t + "03.500Z", 500), _tool(1, "WebSearch", t + "04.000Z", t + "10.000Z", 6000)]),
        _round("claude", "claude:a", 1, 1500, 1100, 50, [
            _event("tool_result", t + "03.500Z", tool_index=0), _event("tool_result", t + "10.000Z", tool_index=1),
            _event("text", t + "12.000Z")]),
        _round("claude", "claude:a", 2, 1580, 1550, 20, [
            _event("user_message", t + "20.000Z", content_chars=10), _event("text", t + "21.000Z")]),
    ]
    t = "2026-01-01T00:01:"
    b = [  # Codex-like: usage_report ends a reply; the next prompt drops the reasoning (shorter than the history)
        _round("codex", "codex:b", 0, 2000, 1500, 80, [
            _event("user_message", t + "00.000Z"), _event("tool_call", t + "01.000Z", tool_name="exec_command"),
            _event("usage_report", t + "01.200Z")], [_tool(0, "exec_command", t + "01.000Z", t + "01.300Z", 300, 250)],
            reasoning=30),
        _round("codex", "codex:b", 1, 2050, 2048, 10, [
            _event("tool_result", t + "01.300Z"), _event("usage_report", t + "02.000Z")], reasoning=0),
    ]
    return [a[0], b[1], a[1], b[0], a[2]]  # sessions interleaved, codex rounds out of order


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_expanded(path, rows):
    blocks = [f"===== round {i + 1:04d} | provider {r['provider']} =====\n{json.dumps(r, indent=2)}\n"
              for i, r in enumerate(rows)]
    path.write_text("# Sample normalized round trace.\n# Each block is one LLM invocation.\n\n" + "\n".join(blocks))
    return path


def test_tracelab_round_trace_keeps_recorded_prompts_and_wall_clock_gaps(tmp_path):
    trace = read_trace(write_jsonl(tmp_path / "round_trace.jsonl", tracelab_rows()))
    a, b = trace.sessions
    assert [a.session_id, b.session_id] == ["claude:a", "codex:b"]
    assert _prompt_lengths(a) == [1000, 1500, 1580]  # input_tokens_total, the whole prompt
    assert [r.output_tokens for r in a.rounds] == [100, 50, 20]
    # parallel tools counted once (6 s, not 0.5 + 6); the user's 8 s after a reply without tools
    assert [r.tool_wait_s for r in a.rounds] == pytest.approx([6.0, 8.0, 0.0])
    assert [r.service_s for r in a.rounds] == pytest.approx([4.0, 2.0, 1.0])
    assert [r.tool_names for r in a.rounds] == [["Bash", "WebSearch"], [], []]
    assert [r.prefix_len for r in a.rounds] == [0, 1100, 1550]
    assert (a.start_s, b.start_s) == (0.0, pytest.approx(60.0))
    assert [r.append_tokens for r in b.rounds] == [2000, 0]  # 2050 < 2000 + 80: nothing appended
    assert b.rounds[0].tool_wait_s == pytest.approx(0.1) and b.rounds[0].tool_names == ["exec_command"]
    notes = trace.meta["notes"]
    assert notes["rounds_whose_recorded_prompt_is_shorter_than_the_history"] == 1
    assert notes["max_replayed_prompt_over_recorded"] == pytest.approx(30 / 2050, abs=1e-4)
    assert trace.meta["reader"] == "tracelab-rounds"


def test_tracelab_expanded_json_with_comments_reads_like_the_jsonl(tmp_path):
    rows = tracelab_rows()
    expanded = write_expanded(tmp_path / "round_trace.expanded.json", rows)
    assert detect_format(expanded) == "tracelab-rounds"
    assert read_any(expanded).sessions == read_any(write_jsonl(tmp_path / "round_trace.jsonl", rows)).sessions


def test_tracelab_sanitized_rows_without_tool_inputs_read_the_same(tmp_path):
    rows = tracelab_rows()
    for row in rows:
        for tool in row["tools"]:
            del tool["input"]
        for key in ("home", "user", "session_file"):
            del row[key]
    sanitized = read_trace(write_jsonl(tmp_path / "s.jsonl", rows))
    assert sanitized.sessions == read_trace(write_jsonl(tmp_path / "d.jsonl", tracelab_rows())).sessions


def test_a_compaction_starts_a_new_context_at_its_recorded_time(tmp_path):
    t = "2026-01-01T00:00:"
    rows = [_round("claude", "s", 0, 10_000, 0, 100, [_event("user_message", t + "00.000Z"), _event("text", t + "05.000Z")]),
            _round("claude", "s", 1, 3_000, 2_000, 50, [_event("user_message", t + "30.000Z"), _event("text", t + "31.000Z")]),
            _round("claude", "s", 2, 3_100, 3_000, 10, [_event("tool_result", t + "32.000Z"), _event("text", t + "33.000Z")])]
    trace = read_trace(write_jsonl(tmp_path / "c.jsonl", rows))
    old, new = trace.sessions
    assert (old.session_id, new.session_id) == ("s", "s.ctx2")
    assert [r.append_tokens for r in old.rounds] == [10_000] and old.rounds[-1].tool_wait_s == 0.0
    assert new.start_s == pytest.approx(30.0) and _prompt_lengths(new) == [3_000, 3_100]
    assert trace.meta["notes"]["context_resets"] == 1


def test_tracelab_round_trace_errors_name_the_format_and_the_field(tmp_path):
    rows = tracelab_rows()
    del rows[2]["input_tokens_total"], rows[2]["prefix_tokens"]
    with pytest.raises(TraceFormatError, match=r"r\.jsonl:3: TraceLab round trace .*'prefix_tokens'"):
        read_trace(write_jsonl(tmp_path / "r.jsonl", rows))
    rows = tracelab_rows()
    rows[1]["timing_events"] = []
    with pytest.raises(TraceFormatError, match=r":2: TraceLab round trace: .*'timing_events'"):
        read_trace(write_jsonl(tmp_path / "t.jsonl", rows))


# ------------------------------------------------------------------------------------------------
# TraceLab CSV export (artifacts/trace_facts/csv_export) and the replayer's CSV


CSV_EXPORT = """id,input_len,output_len,arrival_time,round_idx,tool_wait_after_ms,prefix_len
0,1000,100,0.000000,0,6500.000000,0
0,400,50,0.000000,1,0.000000,1100
0,30,20,0.000000,2,0.000000,1550
1,1200,10,1500.000000,1,0.000000,1000
1,500,80,1500.000000,0,300.000000,1500
"""


def test_tracelab_csv_export_prompt_is_prefix_plus_input(tmp_path):
    path = tmp_path / "coding_trace.csv"
    path.write_text(CSV_EXPORT)
    trace = read_trace(path)
    s0, s1 = trace.sessions
    assert _prompt_lengths(s0) == [1000, 1500, 1580]
    # the provider cached only 1,000 of round 1's prompt: input_len is not what the round appends
    assert _prompt_lengths(s1) == [2000, 2200] and [r.append_tokens for r in s1.rounds] == [2000, 120]
    assert s1.final_context_tokens() == 1000 + 1200 + 10
    assert s1.start_s == 1.5  # arrival_time, ms
    assert [r.tool_wait_s for r in s0.rounds] == [6.5, 0.0, 0.0]  # the export's summed tool latencies
    assert "summed tool latencies" in trace.meta["gaps"]
    assert all(r.tool_names is None and r.service_s is None for s in trace.sessions for r in s.rounds)


def test_a_csv_compaction_starts_a_new_context_after_the_recorded_gap(tmp_path):
    path = tmp_path / "compacted.csv"
    path.write_text("id,input_len,output_len,arrival_time,round_idx,tool_wait_after_ms,prefix_len\n"
                    "7,10000,100,4000.0,0,2000.0,0\n7,1500,50,4000.0,1,0.0,500\n")
    old, new = read_trace(path).sessions
    assert (old.session_id, new.session_id) == ("7", "7.ctx2") and old.rounds[0].tool_wait_s == 0.0
    # no timestamps in the export: the call is assumed to take 1 s, then the recorded 2 s gap
    assert (old.start_s, new.start_s) == (4.0, 7.0) and _prompt_lengths(new) == [2000]


def test_tracelab_replayer_csv_and_json_rows(tmp_path):
    csv_path = tmp_path / "session_workload.csv"
    csv_path.write_text("session_id,round_idx,prefix_len,input_len,output_len,tool_wait_after_ms\n"
                        "x,1,576,128,64,0\nx,0,0,512,64,100\n")
    trace = read_trace(csv_path)
    assert [r.append_tokens for r in trace.sessions[0].rounds] == [512, 128]
    assert trace.sessions[0].rounds[0].tool_wait_s == pytest.approx(0.1) and trace.sessions[0].start_s == 0.0
    rows = [{"session_id": "x", "round_idx": 0, "prefix_len": 0, "input_len": 512, "output_len": 64,
             "tool_wait_after_ms": 100},
            {"session_id": "x", "round_idx": 1, "prefix_len": 576, "input_len": 128, "output_len": 64,
             "tool_wait_after_ms": 0}]
    assert read_any(write_jsonl(tmp_path / "rows.jsonl", rows)).sessions == trace.sessions


def test_tracelab_csv_missing_column_is_named(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("id,round_idx,input_len\ns,0,5\n")
    with pytest.raises(TraceFormatError, match=r"bad\.csv:2: TraceLab CSV export: .*'prefix_len'"):
        read_trace(path)


# ------------------------------------------------------------------------------------------------
# LMCache agent traces (lmcache-agent-trace/miniswe/*.jsonl)


T0 = 1_760_000_000_000_000  # microseconds


def lmcache_rows():
    task = "task: fix bug"
    obs1 = task + " <output> a.py b.py </output>"
    rows = [
        {"timestamp": T0, "input": task, "output": "THOUGHT: look ```bash ls```", "session_id": "aa"},
        {"timestamp": T0 + 2_000_000, "input": obs1, "output": "THOUGHT: read a ```bash cat a.py```", "session_id": "aa"},
        {"timestamp": T0 + 3_500_000, "input": obs1 + " <output> print(1) </output>", "output": "done", "session_id": "aa"},
        {"timestamp": T0 + 10_000_000, "input": "other task", "output": "ok", "session_id": "bb"},
        {"timestamp": T0 + 11_000_000, "input": "other task ok more", "output": "fine", "session_id": "bb"},
        {"timestamp": T0 + 12_000_000, "input": "unrelated prompt", "output": "x", "session_id": "bb"},
    ]
    return [rows[i] for i in (4, 1, 0, 5, 3, 2)]  # one request per line, out of order


def test_lmcache_requests_group_by_session_in_time_order(tmp_path):
    trace = read_trace(write_jsonl(tmp_path / "miniswe.jsonl", lmcache_rows()), count_tokens=WORDS)
    aa, bb, bb2 = trace.sessions
    assert [s.session_id for s in trace.sessions] == ["aa", "bb", "bb.ctx2"]
    assert [r.append_tokens for r in aa.rounds] == [3, 4, 3]  # the task, then each observation
    assert [r.output_tokens for r in aa.rounds] == [4, 6, 1]
    assert [r.tool_wait_s for r in aa.rounds] == pytest.approx([2.0, 1.5, 0.0])  # request to request
    assert (aa.start_s, bb.start_s, bb2.start_s) == (0.0, pytest.approx(10.0), pytest.approx(12.0))
    # bb's second input holds the reply "ok" the replay resends itself; its third starts anew
    assert [r.append_tokens for r in bb.rounds] == [2, 1] and bb.rounds[-1].tool_wait_s == 0.0
    assert [r.append_tokens for r in bb2.rounds] == [2]
    assert trace.meta["notes"]["rows_out_of_timestamp_order"] > 0 and trace.meta["notes"]["context_resets"] == 1
    assert trace.meta["token_counter"] == "count_tokens"


def test_lmcache_reply_rate_takes_generation_out_of_the_gap(tmp_path):
    trace = read_trace(write_jsonl(tmp_path / "m.jsonl", lmcache_rows()), count_tokens=WORDS, reply_tokens_per_s=2.0)
    aa = trace.sessions[0]
    assert [r.service_s for r in aa.rounds] == pytest.approx([2.0, 3.0, 0.5])
    assert [r.tool_wait_s for r in aa.rounds] == pytest.approx([0.0, 0.0, 0.0])  # 2 - 4/2; 1.5 - 6/2 < 0
    assert trace.meta["notes"]["requests_sent_before_the_previous_reply_ended"] == 1


def test_lmcache_counts_text_with_the_given_tokenizer(tmp_path, qwen3_tokenizer_dir, qwen3_tokenizer):
    trace = read_trace(write_jsonl(tmp_path / "m.jsonl", lmcache_rows()), tokenizer=str(qwen3_tokenizer_dir))
    assert trace.meta["token_counter"].startswith("tokenizer:")
    first = trace.sessions[0].rounds[0]
    assert first.append_tokens == len(qwen3_tokenizer.encode("task: fix bug", add_special_tokens=False))
    assert token_counter("chars").count("x" * 9) == 3 and token_counter("chars").name == "chars/4"


def test_lmcache_row_without_session_is_named(tmp_path):
    rows = lmcache_rows()
    del rows[1]["session_id"]
    with pytest.raises(TraceFormatError, match=r":2: LMCache agent trace: .*'session_id'"):
        read_trace(write_jsonl(tmp_path / "m.jsonl", rows), count_tokens=WORDS)


# ------------------------------------------------------------------------------------------------
# OpenAI chat conversations


def test_openai_conversations_rounds_timestamps_and_starts(tmp_path):
    conv = {"session_id": "c1", "messages": [
        {"role": "system", "content": "sys " * 40},
        {"role": "user", "content": "fix the bug", "timestamp": 100.0},
        {"role": "assistant", "content": "", "timestamp": 101.0,
         "tool_calls": [{"id": "t1", "function": {"name": "execute_bash", "arguments": "{\"command\": \"ls\"}"}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "a.py b.py", "timestamp": 101.4},
        {"role": "assistant", "content": "done", "timestamp": 103.0},
    ]}
    later = {"messages": [{"role": "system", "content": "sys " * 40},
                          {"role": "user", "content": "hi", "timestamp": "1970-01-01T00:02:10Z"},
                          {"role": "assistant", "content": "hello", "timestamp": "1970-01-01T00:02:11Z"}]}
    path = tmp_path / "conv.jsonl"
    path.write_text(json.dumps(conv) + "\n" + json.dumps(later) + "\n")
    trace = read_trace(path, count_tokens=WORDS)
    s, t = trace.sessions
    assert s.session_id == "c1" and len(s.rounds) == 2
    assert s.rounds[0].append_tokens == 40 + 3
    assert s.rounds[0].tool_wait_s == pytest.approx(0.4) and s.rounds[1].tool_wait_s == 0.0
    assert s.rounds[1].messages[0]["role"] == "tool" and s.rounds[0].reply["tool_calls"][0]["id"] == "t1"
    assert s.rounds[0].tool_names == ["execute_bash"] and s.rounds[0].service_s == pytest.approx(1.0)
    assert (s.start_s, t.start_s) == (0.0, pytest.approx(30.0))  # first requests at 100 s and 130 s
    assert trace.shared_prefix_tokens == 40


def test_openai_conversations_without_timestamps_use_the_default_gap(tmp_path):
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(msgs) + "\n")
    trace = read_trace(path, count_tokens=WORDS, default_tool_wait_s=2.0)
    assert [r.tool_wait_s for r in trace.sessions[0].rounds] == [2.0, 0.0] and trace.sessions[0].start_s == 0.0


def test_openai_record_without_messages_is_named(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "a"}]}\n{"messages": "oops"}\n')
    with pytest.raises(TraceFormatError, match=r":2: OpenAI chat conversation: .*'messages'"):
        read_trace(path, count_tokens=WORDS)


# ------------------------------------------------------------------------------------------------
# Dispatch and the CLI


def test_an_unknown_record_names_its_keys_and_the_known_formats(tmp_path):
    path = tmp_path / "notes.jsonl"
    path.write_text('{"hello": "world"}\n')
    with pytest.raises(TraceFormatError, match=r"cannot tell the trace format .*hello.*LMCache agent trace"):
        read_trace(path)


def test_start_spacing_replaces_recorded_starts_in_their_order(tmp_path):
    rows = lmcache_rows()
    trace = read_trace(write_jsonl(tmp_path / "m.jsonl", rows), count_tokens=WORDS, start_spacing_s=5.0)
    assert [(s.session_id, s.start_s) for s in trace.sessions] == [("aa", 0.0), ("bb", 5.0), ("bb.ctx2", 7.0)]


def test_convert_cli_writes_our_format(tmp_path):
    src = write_expanded(tmp_path / "round_trace.expanded.json", tracelab_rows())
    out = tmp_path / "t.jsonl"
    result = CliRunner().invoke(cli, ["convert", str(src), "--out", str(out), "--start-spacing", "0",
                                                      "--name", "tracelab-sample"])
    assert result.exit_code == 0, result.output
    assert "as tracelab-rounds" in result.stderr and json.loads(result.stdout)["rounds"] == 5
    trace = load_jsonl(out)
    assert trace.name == "tracelab-sample" and [s.start_s for s in trace.sessions] == [0.0, 0.0]
    assert trace.sessions == read_trace(src, start_spacing_s=0).sessions
    bad = tmp_path / "notes.jsonl"
    bad.write_text('{"hello": "world"}\n')
    result = CliRunner().invoke(cli, ["convert", str(bad), "--out", str(out)])
    assert result.exit_code != 0 and "cannot tell the trace format" in result.stderr
