import numpy as np
import pytest

from sidecar_tools.benchmarks.traces import (
    PRESETS, Round, Session, Trace, build_config, generate, load_jsonl, read_any, save_jsonl,
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


def test_model_validates():
    with pytest.raises(ValueError):
        Round(append_tokens=-1, output_tokens=3)
    t = Trace(name="x", sessions=[Session(session_id="s", rounds=[Round(append_tokens=5, output_tokens=2)])])
    assert t.stats()["final_context_max"] == 7


def test_called_tools_come_from_the_recorded_names_else_the_reply():
    assert Round(append_tokens=1, output_tokens=1, tool_names=["Bash"]).called_tools() == ["Bash"]
    reply = {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "run_tests", "arguments": "{}"}}]}
    assert Round(append_tokens=1, output_tokens=1, reply=reply).called_tools() == ["run_tests"]
    assert Round(append_tokens=1, output_tokens=1, reply={"role": "assistant", "content": "hi"}).called_tools() == []
    assert Round(append_tokens=1, output_tokens=1).called_tools() is None


def _two_sessions() -> Trace:
    rounds = [Round(append_tokens=100, output_tokens=10, tool_wait_s=1.0), Round(append_tokens=20, output_tokens=5)]
    return Trace(name="t", shared_prefix_tokens=50, sessions=[Session(session_id="a", start_s=0.0, rounds=rounds),
                                                              Session(session_id="b", start_s=40.0, rounds=rounds)])


def test_replicated_copies_start_offset_later_with_their_own_ids():
    trace = _two_sessions().replicated(3, 5.0)
    assert [s.session_id for s in trace.sessions] == ["a", "b", "a~r1", "b~r1", "a~r2", "b~r2"]
    assert [s.start_s for s in trace.sessions] == [0.0, 40.0, 5.0, 45.0, 10.0, 50.0]
    assert all(s.rounds == trace.sessions[0].rounds for s in trace.sessions)
    assert trace.shared_prefix_tokens == 50 and trace.meta["replicated"] == {"copies": 3, "offset_s": 5.0}
    assert sum(s.final_context_tokens() for s in trace.sessions) == 3 * 2 * 135
    assert _two_sessions().replicated(1, 9.0) == _two_sessions()
    with pytest.raises(ValueError):
        _two_sessions().replicated(0)
    with pytest.raises(ValueError):
        _two_sessions().replicated(2, -1.0)


def test_with_start_spacing_replaces_the_recorded_starts():
    trace = _two_sessions().with_start_spacing(2.0)
    assert [s.start_s for s in trace.sessions] == [0.0, 2.0] and trace.meta["start_spacing_override_s"] == 2.0
    assert [s.start_s for s in _two_sessions().with_start_spacing(0).replicated(2, 0.5).sessions] == [0, 0, 0.5, 0.5]


def test_template_tokens_make_the_raw_prompts_what_the_openai_path_rendered_on_the_gpu():
    """The H200 sitting of 2026-12-03 sent the reference trace through the sidecar's OpenAI door:
    every prompt there is the trace's + 259 in round 0 + 10 a later round, and the simulator's raw
    ids count the same once the template's tokens are added (the shared ones joining the prefix)."""
    import csv
    from pathlib import Path

    from sidecar_tools.benchmarks.clients import ClientOptions, GenerateClient
    from sidecar_tools.benchmarks.traces import TEMPLATE_TOKENS, _prompt_lengths

    raw = generate(build_config("reference", seed=None, sessions=None))
    trace = raw.with_template_tokens(*TEMPLATE_TOKENS["qwen3-openai"])
    gpu = Path(__file__).resolve().parents[3] / "benchmarks/results/h200-2026-12-03/hicache-5s-turns.csv"
    with gpu.open(newline="") as f:
        sent = {(t["session"].removesuffix("-hicache-5s"), int(t["turn"])): int(t["prompt_tokens"]) for t in csv.DictReader(f)}
    for session in trace.sessions:
        assert _prompt_lengths(session) == [sent[session.session_id, k] for k in range(len(session.rounds))]
    assert _prompt_lengths(raw.sessions[0])[0] == 3_500 and trace.shared_prefix_tokens == 3_254
    client = GenerateClient(None, "", trace, ClientOptions())
    a, b = (client.new_ids(client.start(s), 0, s.rounds[0]) for s in trace.sessions[:2])
    assert a[:3_254] == b[:3_254] and a[3_254] != b[3_254]
    assert trace.meta["template_tokens"] == {"shared": 254, "first": 5, "later": 10}
    with pytest.raises(ValueError):
        raw.with_template_tokens(-1, 0, 0)
