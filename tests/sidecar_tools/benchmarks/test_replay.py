"""The replay client against the SGLang stand-in (/generate) and the sidecar in front of it (OpenAI)."""

import asyncio
import json

import pytest

from sidecar_tools.benchmarks.clients import ClientOptions
from sidecar_tools.benchmarks.replay import main as replay_cli
from sidecar_tools.benchmarks.replay import replay
from sidecar_tools.benchmarks.traces import Round, Session, Trace, build_config, generate
from sidecar_tools.simulator.replies import scripted_responder


def small_trace(sessions=3, turns=4, gap=0.01):
    return generate(build_config("reference", sessions=sessions, turns=turns, tool_wait=gap))


def continued_turns(records) -> int:
    return sum(1 for r in records if r.ok and r.turn > 0)


async def test_generate_mode_grows_exact_ids_and_sends_lease(sglang_double):
    engine = sglang_double
    trace = small_trace()
    run, records = await replay(trace, url=engine.url, mode="generate",
                                opts=ClientOptions(lease_ttl_s=30.0, close_sessions=True))
    s = run["summary"]
    assert s["turns_ok"] == 12 and s["turns_failed"] == 0 and not s["timed_out"]
    by_session: dict[str, list[dict]] = {}
    for body in engine.requests:
        by_session.setdefault(body["session_id"], []).append(body)
        assert body["sampling_params"]["custom_params"] == {"session_lease_ttl_s": 30.0}
        assert body["sampling_params"]["ignore_eos"] is True and body["stream"] is True
    assert sorted(c["session_id"] for c in engine.closed_sessions) == sorted(by_session)
    shared = [b[0]["input_ids"][:3000] for b in by_session.values()]
    assert all(x == shared[0] for x in shared)  # one system prompt for all sessions
    for session, bodies in zip(trace.sessions, by_session.values()):
        for k in range(1, len(bodies)):
            prev = bodies[k - 1]
            n_out = prev["sampling_params"]["max_new_tokens"]
            grown = bodies[k]["input_ids"]
            assert grown[: len(prev["input_ids"])] == prev["input_ids"]
            assert len(grown) == len(prev["input_ids"]) + n_out + session.rounds[k].append_tokens
    # Nothing is evicted in a big cache: the whole history is reused but the last sampled token,
    # whose KV SGLang never computed.
    assert s["recomputed_tokens"] == continued_turns(records) == 9 and s["history_tokens"] > 0
    counters = run["metrics"]["endpoint"]["counters"]
    assert counters[f'sglang:prompt_tokens_total{{model_name="{engine.served_model_name}"}}'] == s["prompt_tokens"]
    assert all(r.ttft_s is not None and r.ttft_s >= 0 for r in records)


async def test_small_cache_recomputes_history(make_sglang_double):
    engine = await make_sglang_double(max_total_num_tokens=12000)
    run, records = await replay(small_trace(sessions=6, turns=5), url=engine.url, mode="generate", opts=ClientOptions())
    assert run["summary"]["turns_ok"] == 30, run["summary"]["errors"]
    assert run["summary"]["recomputed_share"] > 0.05
    assert all(r.history_tokens == 0 for r in records if r.turn == 0)


async def test_failures_are_recorded_and_sessions_go_on(sglang_double):
    engine = sglang_double
    engine.faults.fail_next, engine.faults.fail_status = 3, 500
    run, records = await replay(small_trace(), url=engine.url, mode="generate", opts=ClientOptions())
    s = run["summary"]
    assert s["turns_failed"] == 3 and s["turns_ok"] == 9 and s["errors"] == {"http 500": 3}
    assert len(engine.requests) == 12


async def test_stop_on_error(sglang_double):
    engine = sglang_double
    engine.faults.fail_next, engine.faults.fail_status = 100, 500
    run, _ = await replay(small_trace(), url=engine.url, mode="generate", opts=ClientOptions(), stop_on_error=True)
    assert run["summary"]["turns_failed"] == 3 and len(engine.requests) == 3


async def test_unreachable_engine_does_not_hang():
    trace = small_trace(sessions=2, turns=2)
    run, _ = await asyncio.wait_for(
        replay(trace, url="http://127.0.0.1:9", mode="generate", opts=ClientOptions(request_timeout_s=2)), 20)
    assert run["summary"]["turns_failed"] == 4 and run["metrics"]["endpoint"] is None


async def test_time_limit_cancels_the_run(make_sglang_double):
    engine = await make_sglang_double(token_delay=0.05)
    trace = small_trace(sessions=2, turns=10, gap=0.5)
    run, records = await asyncio.wait_for(
        replay(trace, url=engine.url, mode="generate", opts=ClientOptions(), time_limit_s=1.0), 10)
    s = run["summary"]
    assert s["timed_out"] and s["makespan_s"] < 2 and s["turns_ok"] < 20


async def test_client_side_session_cap(make_sglang_double):
    engine = await make_sglang_double(token_delay=0.002)  # a step per token: ~0.3 s a turn
    run, records = await replay(small_trace(sessions=4, turns=2), url=engine.url, mode="generate",
                                opts=ClientOptions(), max_concurrent_sessions=2)
    waits = sorted(r.client_wait_s for r in records if r.turn == 0)
    assert waits[1] < 0.01 < waits[2]
    assert run["summary"]["ttft_with_client_wait_p99_s"] > run["summary"]["ttft_p99_s"]


async def test_openai_mode_messages_headers_usage(sglang_double, make_sidecar_front):
    url, received = await make_sidecar_front(sglang_double)
    trace = small_trace(sessions=2, turns=3)
    run, records = await replay(trace, url=url, mode="openai", opts=ClientOptions(body_session_id=True))
    assert run["summary"]["turns_ok"] == 6, run["summary"]["errors"]
    assert run["config"]["model"] == sglang_double.served_model_name  # the sidecar's /v1/models
    bodies = [b for b in received if b["headers"]["X-Session-Id"] == records[0].session]
    assert [m["role"] for m in bodies[0]["messages"]] == ["system", "user"]
    assert [m["role"] for m in bodies[2]["messages"]] == ["system", "user", "assistant", "user", "assistant", "user"]
    first = bodies[0]
    assert first["stream_options"] == {"include_usage": True} and first["ignore_eos"] is True
    assert first["max_tokens"] == trace.sessions[0].rounds[0].output_tokens
    assert first["tools"][0]["function"]["name"] == "execute_bash" and first["session_id"] == records[0].session
    # Without a tokenizer the client's text is words: the system text is the shared prefix size.
    assert len(first["messages"][0]["content"].split()) == 3000
    # The sidecar continues each session token-exactly: all history is reused but the last token.
    assert run["summary"]["recomputed_tokens"] == continued_turns(records) == 4 and run["summary"]["cached_tokens"] > 0


async def test_openai_tool_calls_become_tool_messages(sglang_double, make_sidecar_front, qwen3_tokenizer):
    call = qwen3_tokenizer.encode('<tool_call>\n{"name": "execute_bash", "arguments": {"command": "ls"}}\n</tool_call>',
                                  add_special_tokens=False)
    sglang_double.responder = scripted_responder(call)  # every reply is this call (ignore_eos: no EOS needed)
    url, received = await make_sidecar_front(sglang_double)
    trace = Trace(name="t", sessions=[Session(session_id="s", rounds=[
        Round(append_tokens=5, output_tokens=len(call)), Round(append_tokens=7, output_tokens=len(call))])])
    run, records = await replay(trace, url=url, mode="openai", opts=ClientOptions())
    assert run["summary"]["turns_ok"] == 2, run["summary"]["errors"]
    msgs = received[-1]["messages"]
    call_id = msgs[-2]["tool_calls"][0]["id"]
    assert msgs[-2]["tool_calls"][0]["function"]["name"] == "execute_bash"
    assert msgs[-1] == {"role": "tool", "tool_call_id": call_id, "content": msgs[-1]["content"]}
    assert len(msgs[-1]["content"].split()) == 7
    assert records[1].history_tokens == records[0].prompt_tokens + records[0].completion_tokens > 0
    # Without tools the client declares none, and the reply stays text (no tool message follows).
    run, _ = await replay(trace, url=url, mode="openai", opts=ClientOptions(tools=False, salt="plain"))
    assert run["summary"]["turns_ok"] == 2, run["summary"]["errors"]
    assert "tools" not in received[-1] and received[-1]["messages"][-1]["role"] == "user"


def test_cli_writes_json_and_csv(tmp_path, sglang_double_thread):
    """The CLI runs its own event loop, so the stand-in is served from a thread."""
    from click.testing import CliRunner

    url = sglang_double_thread.url
    result = CliRunner().invoke(replay_cli, [
        "--url", url, "--sessions", "2", "--turns", "2", "--tool-wait", "0",
        "--lease-ttl", "5", "--close-sessions", "--name", "cli", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    run = json.loads((tmp_path / "cli.json").read_text())
    assert run["name"] == "cli" and run["summary"]["turns_ok"] == 4
    assert run["command"] == (f"python -m sidecar_tools.benchmarks.replay --url {url} --sessions 2 "
                              "--turns 2 --tool-wait 0.0 --lease-ttl 5.0 --close-sessions --name cli --out " + str(tmp_path))
    assert run["config"]["lease_ttl_s"] == 5.0 and run["trace"]["name"] == "reference"
    assert (tmp_path / "cli-turns.csv").read_text().count("\n") == 5
    assert len(sglang_double_thread.closed_sessions) == 2


async def test_sessions_start_at_their_offsets_and_then_wait_for_a_slot(make_sglang_double):
    engine = await make_sglang_double(token_delay=0.01)
    rounds = [Round(append_tokens=20, output_tokens=10, tool_wait_s=0.05), Round(append_tokens=5, output_tokens=10)]
    trace = Trace(name="t", sessions=[Session(session_id="a", rounds=rounds),
                                      Session(session_id="b", start_s=1.0, rounds=rounds),
                                      Session(session_id="c", start_s=1.05, rounds=rounds)])
    run, records = await replay(trace, url=engine.url, mode="generate", opts=ClientOptions(), max_concurrent_sessions=1)
    first = {r.session: r for r in records if r.turn == 0}
    assert first["a"].send_s < 0.5
    assert first["b"].send_s >= 1.0 and first["b"].client_wait_s < 0.5  # the wait counts from its start, a is done
    assert first["c"].send_s >= first["b"].end_s and first["c"].client_wait_s > 0  # arrived while b held the slot
    assert run["summary"]["turns_ok"] == 6


def test_cli_names_a_trace_it_cannot_read(tmp_path):
    from click.testing import CliRunner

    bad = tmp_path / "round_trace.jsonl"
    bad.write_text('{"session_id": "s", "round_index": 0, "output_tokens": 5}\n')
    result = CliRunner().invoke(replay_cli, ["--trace", str(bad), "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "TraceLab round trace" in result.output and "'prefix_tokens'" in result.output


@pytest.mark.parametrize("explicit", [True, False])
async def test_anthropic_mode_through_the_sidecar_is_one_session_per_agent(aiohttp_server, sglang_double, qwen3_tokenizer_dir,
                                                                        qwen3_tokenizer, explicit):
    """--mode anthropic against the real sidecar: tool_use replies come back as tool_result turns,
    each agent is one session (named by X-Session-Id, or recognised from its history without it),
    and every turn reuses the previous turn's whole prompt + reply."""
    from sidecar.server.app import create_app
    from sidecar.settings import load_settings

    call = qwen3_tokenizer.encode('<tool_call>\n{"name": "execute_bash", "arguments": {"command": "ls"}}\n</tool_call>',
                                  add_special_tokens=False)
    pad = qwen3_tokenizer.encode(" ok", add_special_tokens=False)
    sglang_double.responder = lambda ids, params: (call + pad * 100)[: params["max_new_tokens"]]
    settings = load_settings(overrides={"server": {"sglang_url": sglang_double.url, "tokenizer": str(qwen3_tokenizer_dir)}})
    server = await aiohttp_server(create_app(settings, tokenizer=qwen3_tokenizer))
    rounds = [Round(append_tokens=40, output_tokens=60, tool_wait_s=0.01) for _ in range(3)]
    trace = Trace(name="t", shared_prefix_tokens=20,
                  sessions=[Session(session_id=f"s{i}", rounds=rounds) for i in range(2)])
    run, records = await replay(trace, url=str(server.make_url("")).rstrip("/"), mode="anthropic",
                                opts=ClientOptions(send_session_id=explicit), tokenizer=str(qwen3_tokenizer_dir))
    assert run["summary"]["turns_ok"] == 6 and run["config"]["mode"] == "anthropic"
    sessions = [r["session_id"] for r in sglang_double.requests]
    assert sorted(sessions.count(s) for s in set(sessions)) == [3, 3]
    assert set(sessions) == {"s0", "s1"} if explicit else all(s.startswith("sess-") for s in sessions)
    for session in ("s0", "s1"):
        turns = sorted((r for r in records if r.session == session), key=lambda r: r.turn)
        for prev, cur in zip(turns, turns[1:]):
            assert cur.history_tokens == prev.prompt_tokens + prev.completion_tokens
            assert cur.cached_tokens >= prev.prompt_tokens + prev.completion_tokens - 1
    last = qwen3_tokenizer.decode(sglang_double.requests[-1]["input_ids"])
    assert last.count("<tool_response>") == 2 and all(r["sampling_params"]["ignore_eos"] for r in sglang_double.requests)


async def test_every_finished_turn_reaches_the_progress_hook(sglang_double):
    sglang_double.faults.fail_next, sglang_double.faults.fail_status = 3, 500
    seen = []
    run, records = await replay(small_trace(), url=sglang_double.url, mode="generate", opts=ClientOptions(), on_turn=seen.append)
    assert sorted(seen, key=id) == sorted(records, key=id) and len(seen) == run["summary"]["turns_planned"]
