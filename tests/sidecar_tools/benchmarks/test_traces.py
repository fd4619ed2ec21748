import json

import numpy as np
import pytest

from sidecar_tools.benchmarks.traces import (
    PRESETS, Round, Session, Trace, build_config, generate, load_jsonl, read_any, read_openai_jsonl,
    read_tracelab, save_jsonl,
)


def test_same_seed_same_trace_other_seed_other_trace():
    a = generate(build_config("default", seed=7, sessions=5))
    b = generate(build_config("default", seed=7, sessions=5))
    c = generate(build_config("default", seed=8, sessions=5))
    assert a == b
    assert a != c


def test_default_preset_follows_prior_art_statistics():
    trace = generate(build_config("default", seed=1, sessions=200))
    appends = [r.append_tokens for s in trace.sessions for r in s.rounds[1:]]
    outputs = [r.output_tokens for s in trace.sessions for r in s.rounds]
    gaps = [r.tool_wait_s for s in trace.sessions for r in s.rounds]
    turns = [len(s.rounds) for s in trace.sessions]
    assert 780 <= np.median(appends) <= 1000  # ~875
    assert 3000 <= np.percentile(appends, 90) <= 9000  # heavy tail: p90 4-8K
    assert 180 <= np.median(outputs) <= 225  # ~200
    assert 0.28 <= np.median(gaps) <= 0.45  # median 0.3-0.4 s
    assert np.percentile(gaps, 99) > 60  # a few long tool calls
    assert 25 <= np.median(turns) <= 36 and max(turns) <= 100
    assert trace.shared_prefix_tokens == 4000


def test_reference_preset_is_the_gpu_readme_workload():
    trace = generate(PRESETS["reference"])
    assert len(trace.sessions) == 24
    assert all(len(s.rounds) == 16 for s in trace.sessions)
    assert trace.shared_prefix_tokens == 3000
    assert all(s.rounds[0].append_tokens == 3500 for s in trace.sessions)
    later = [r.append_tokens for s in trace.sessions for r in s.rounds[1:]]
    outputs = [r.output_tokens for s in trace.sessions for r in s.rounds]
    assert max(later) <= 3000 and max(outputs) <= 600
    assert 500 <= np.median(later) <= 700 and 130 <= np.median(outputs) <= 170
    assert all(r.tool_wait_s == 0.5 for s in trace.sessions for r in s.rounds)
    assert abs(trace.stats()["final_context_mean"] - 18200) < 100  # README: 18.2K


def test_reference_lognormal_parameters_hold_in_bulk():
    trace = generate(build_config("reference", seed=3, sessions=400))
    later = np.array([r.append_tokens for s in trace.sessions for r in s.rounds[1:]])
    outputs = np.array([r.output_tokens for s in trace.sessions for r in s.rounds])
    assert np.median(later) == pytest.approx(600, rel=0.06)
    assert np.median(outputs) == pytest.approx(150, rel=0.06)
    uncapped = np.log(later[later < 3000])
    assert np.std(np.log(outputs[outputs < 600])) == pytest.approx(0.6, abs=0.05)
    assert np.std(uncapped) == pytest.approx(0.9, abs=0.1)  # truncated at the cap: a bit below


def test_max_context_ends_sessions_early():
    trace = generate(build_config("default", seed=0, sessions=20, max_context=32000))
    assert all(s.final_context_tokens() <= 32000 or len(s.rounds) == 1 for s in trace.sessions)


def test_tool_wait_override_and_head():
    trace = generate(build_config("reference", sessions=3)).with_tool_wait(5.0).head(2, 4)
    assert len(trace.sessions) == 2 and all(len(s.rounds) == 4 for s in trace.sessions)
    assert {r.tool_wait_s for s in trace.sessions for r in s.rounds} == {5.0}


def test_jsonl_round_trip(tmp_path):
    trace = generate(build_config("reference", sessions=3))
    save_jsonl(trace, tmp_path / "t.jsonl")
    assert load_jsonl(tmp_path / "t.jsonl") == trace
    assert read_any(tmp_path / "t.jsonl") == trace


TRACELAB_CSV = """session_id,round_idx,prefix_len,input_len,output_len,tool_wait_after_ms
b,1,1200,300,50,0
a,0,0,1000,80,250
b,0,400,800,40,1500
a,1,1080,200,60,0
"""


def test_tracelab_csv(tmp_path):
    path = tmp_path / "rounds.csv"
    path.write_text(TRACELAB_CSV)
    trace = read_tracelab(path)
    assert [s.session_id for s in trace.sessions] == ["b", "a"]  # first appearance
    b = trace.sessions[0]
    assert [r.append_tokens for r in b.rounds] == [1200, 300]  # round-0 prefix folded in
    assert [r.prefix_len for r in b.rounds] == [400, 1200]
    assert b.rounds[0].tool_wait_s == 1.5 and b.rounds[0].output_tokens == 40
    assert read_any(path) == trace


def test_tracelab_jsonl(tmp_path):
    path = tmp_path / "rounds.jsonl"
    rows = [{"session_id": "x", "round_idx": i, "prefix_len": 0, "input_len": 10 * (i + 1),
             "output_len": 5, "tool_wait_after_ms": 300} for i in range(3)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    trace = read_any(path)
    assert [r.append_tokens for r in trace.sessions[0].rounds] == [10, 20, 30]
    assert trace.sessions[0].rounds[0].tool_wait_s == pytest.approx(0.3)


def test_tracelab_missing_column_is_an_error(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("session_id,round_idx,input_len\ns,0,5\n")
    with pytest.raises(ValueError, match="lacks"):
        read_tracelab(path)


def test_openai_jsonl_rounds_and_timestamps(tmp_path):
    conv = {"session_id": "c1", "messages": [
        {"role": "system", "content": "sys " * 40},
        {"role": "user", "content": "fix the bug", "timestamp": 100.0},
        {"role": "assistant", "content": "", "timestamp": 101.0,
         "tool_calls": [{"id": "t1", "function": {"name": "execute_bash", "arguments": "{\"command\": \"ls\"}"}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "a.py b.py", "timestamp": 101.4},
        {"role": "assistant", "content": "done", "timestamp": 103.0},
    ]}
    other = [{"role": "system", "content": "sys " * 40}, {"role": "user", "content": "hi"},
             {"role": "assistant", "content": "hello"}]
    path = tmp_path / "conv.jsonl"
    path.write_text(json.dumps(conv) + "\n" + json.dumps(other) + "\n")
    trace = read_openai_jsonl(path, count_tokens=lambda t: len(t.split()))
    s = trace.sessions[0]
    assert s.session_id == "c1" and len(s.rounds) == 2
    assert s.rounds[0].append_tokens == 40 + 3
    assert s.rounds[0].tool_wait_s == pytest.approx(0.4)
    assert s.rounds[1].messages[0]["role"] == "tool" and s.rounds[1].tool_wait_s == 0.0
    assert s.rounds[0].reply["tool_calls"][0]["id"] == "t1"
    assert trace.shared_prefix_tokens == 40
    assert trace.sessions[1].rounds[0].tool_wait_s == 0.0
    assert read_any(path, count_tokens=lambda t: len(t.split())) == trace


def test_openai_jsonl_without_timestamps_uses_default_gap(tmp_path):
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps(msgs) + "\n")
    trace = read_openai_jsonl(path, default_tool_wait_s=2.0)
    assert [r.tool_wait_s for r in trace.sessions[0].rounds] == [2.0, 0.0]


def test_model_validates():
    with pytest.raises(ValueError):
        Round(append_tokens=-1, output_tokens=3)
    t = Trace(name="x", sessions=[Session(session_id="s", rounds=[Round(append_tokens=5, output_tokens=2)])])
    assert t.stats()["final_context_max"] == 7
