import asyncio
import json

from sidecar_tools.benchmarks.clients import ClientOptions
from sidecar_tools.benchmarks.replay import main as replay_cli
from sidecar_tools.benchmarks.replay import replay
from sidecar_tools.benchmarks.traces import Round, Session, Trace, build_config, generate


def small_trace(sessions=3, turns=4, gap=0.01):
    return generate(build_config("reference", sessions=sessions, turns=turns, tool_wait=gap))


async def test_generate_mode_grows_exact_ids_and_sends_lease(make_engine):
    engine, url = await make_engine()
    trace = small_trace()
    run, records = await replay(trace, url=url, mode="generate",
                                opts=ClientOptions(lease_ttl_s=30.0, close_sessions=True))
    s = run["summary"]
    assert s["turns_ok"] == 12 and s["turns_failed"] == 0 and not s["timed_out"]
    by_session: dict[str, list[dict]] = {}
    for body in engine.requests:
        by_session.setdefault(body["session_id"], []).append(body)
        assert body["sampling_params"]["custom_params"] == {"session_lease_ttl_s": 30.0}
        assert body["sampling_params"]["ignore_eos"] is True and body["stream"] is True
    assert sorted(engine.closed) == sorted(by_session)
    shared = [b[0]["input_ids"][:3000] for b in by_session.values()]
    assert all(x == shared[0] for x in shared)  # one system prompt for all sessions
    for session, bodies in zip(trace.sessions, by_session.values()):
        for k in range(1, len(bodies)):
            prev = bodies[k - 1]
            n_out = prev["sampling_params"]["max_new_tokens"]
            grown = bodies[k]["input_ids"]
            assert grown[: len(prev["input_ids"])] == prev["input_ids"]
            assert len(grown) == len(prev["input_ids"]) + n_out + session.rounds[k].append_tokens
    # Nothing is evicted in a big cache: the whole history is reused.
    assert s["recomputed_share"] == 0.0 and s["history_tokens"] > 0
    assert run["metrics"]["endpoint"]["counters"]['sglang:prompt_tokens_total{model_name="fake"}'] == s["prompt_tokens"]
    assert all(r.ttft_s is not None and r.ttft_s >= 0 for r in records)


async def test_small_cache_recomputes_history(make_engine):
    _, url = await make_engine(capacity=12000)
    run, records = await replay(small_trace(sessions=6, turns=5), url=url, mode="generate", opts=ClientOptions())
    assert run["summary"]["recomputed_share"] > 0.05
    assert all(r.history_tokens == 0 for r in records if r.turn == 0)


async def test_failures_are_recorded_and_sessions_go_on(make_engine):
    engine, url = await make_engine(fail_every=4)
    run, records = await replay(small_trace(), url=url, mode="generate", opts=ClientOptions())
    s = run["summary"]
    assert s["turns_failed"] == 3 and s["turns_ok"] == 9 and s["errors"] == {"http 500": 3}
    assert len(engine.requests) == 12


async def test_stop_on_error(make_engine):
    engine, url = await make_engine(fail_every=1)
    run, _ = await replay(small_trace(), url=url, mode="generate", opts=ClientOptions(), stop_on_error=True)
    assert run["summary"]["turns_failed"] == 3 and len(engine.requests) == 3


async def test_unreachable_engine_does_not_hang():
    trace = small_trace(sessions=2, turns=2)
    run, _ = await asyncio.wait_for(
        replay(trace, url="http://127.0.0.1:9", mode="generate", opts=ClientOptions(request_timeout_s=2)), 20)
    assert run["summary"]["turns_failed"] == 4 and run["metrics"]["endpoint"] is None


async def test_time_limit_cancels_the_run(make_engine):
    _, url = await make_engine(token_delay_s=0.05)
    trace = small_trace(sessions=2, turns=10, gap=0.5)
    run, records = await asyncio.wait_for(
        replay(trace, url=url, mode="generate", opts=ClientOptions(), time_limit_s=1.0), 10)
    s = run["summary"]
    assert s["timed_out"] and s["makespan_s"] < 2 and s["turns_ok"] < 20


async def test_client_side_session_cap(make_engine):
    _, url = await make_engine(token_delay_s=0.01)
    run, records = await replay(small_trace(sessions=4, turns=2), url=url, mode="generate",
                                opts=ClientOptions(), max_concurrent_sessions=2)
    waits = sorted(r.client_wait_s for r in records if r.turn == 0)
    assert waits[1] < 0.01 < waits[2]
    assert run["summary"]["ttft_with_client_wait_p99_s"] > run["summary"]["ttft_p99_s"]


async def test_sessions_start_at_their_offsets_and_then_wait_for_a_slot(make_engine):
    _, url = await make_engine(token_delay_s=0.01)
    rounds = [Round(append_tokens=20, output_tokens=10, tool_wait_s=0.05), Round(append_tokens=5, output_tokens=10)]
    trace = Trace(name="t", sessions=[Session(session_id="a", rounds=rounds),
                                      Session(session_id="b", start_s=1.0, rounds=rounds),
                                      Session(session_id="c", start_s=1.05, rounds=rounds)])
    run, records = await replay(trace, url=url, mode="generate", opts=ClientOptions(), max_concurrent_sessions=1)
    first = {r.session: r for r in records if r.turn == 0}
    assert first["a"].send_s < 0.5
    assert first["b"].send_s >= 1.0 and first["b"].client_wait_s < 0.5  # the wait counts from its start, a is done
    assert first["c"].send_s >= first["b"].end_s and first["c"].client_wait_s > 0  # arrived while b held the slot
    assert run["summary"]["turns_ok"] == 6


async def test_openai_mode_messages_headers_usage(make_engine):
    engine, url = await make_engine()
    trace = small_trace(sessions=2, turns=3)
    run, records = await replay(trace, url=url, mode="openai", opts=ClientOptions(body_session_id=True))
    assert run["summary"]["turns_ok"] == 6 and run["config"]["model"] == "fake-model"
    bodies = [b for b in engine.requests if b["headers"]["X-Session-Id"] == records[0].session]
    assert [m["role"] for m in bodies[0]["messages"]] == ["system", "user"]
    assert [m["role"] for m in bodies[2]["messages"]] == ["system", "user", "assistant", "user", "assistant", "user"]
    first = bodies[0]
    assert first["stream_options"] == {"include_usage": True} and first["ignore_eos"] is True
    assert first["max_tokens"] == trace.sessions[0].rounds[0].output_tokens
    assert first["tools"][0]["function"]["name"] == "execute_bash" and first["session_id"] == records[0].session
    # The fake counts words: system text is exactly the shared prefix size (+1 role marker).
    assert len(first["messages"][0]["content"].split()) == 3000
    assert run["summary"]["recomputed_share"] == 0.0 and run["summary"]["cached_tokens"] > 0


async def test_openai_tool_calls_become_tool_messages(make_engine):
    engine, url = await make_engine(tool_calls=True)
    trace = Trace(name="t", sessions=[Session(session_id="s", rounds=[
        Round(append_tokens=5, output_tokens=3), Round(append_tokens=7, output_tokens=3)])])
    run, records = await replay(trace, url=url, mode="openai", opts=ClientOptions(model="m", tools=False))
    msgs = engine.requests[-1]["messages"]
    call_id = msgs[-2]["tool_calls"][0]["id"]
    assert msgs[-2]["tool_calls"][0]["function"]["name"] == "execute_bash"
    assert msgs[-1] == {"role": "tool", "tool_call_id": call_id, "content": msgs[-1]["content"]}
    assert len(msgs[-1]["content"].split()) == 7
    assert "tools" not in engine.requests[-1]
    assert records[1].history_tokens == records[0].prompt_tokens + records[0].completion_tokens > 0


def test_cli_writes_json_and_csv(tmp_path):
    """The CLI runs its own event loop, so the fake is served from a thread."""
    import threading

    from aiohttp import web
    from click.testing import CliRunner

    from fake_engine import FakeEngine

    loop = asyncio.new_event_loop()
    engine = FakeEngine()
    runner = web.AppRunner(engine.app)
    ready = threading.Event()

    def run_server():
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        run_server.port = site._server.sockets[0].getsockname()[1]
        ready.set()
        loop.run_forever()

    t = threading.Thread(target=run_server, daemon=True)
    t.start()
    ready.wait(5)
    result = CliRunner().invoke(replay_cli, [
        "--url", f"http://127.0.0.1:{run_server.port}", "--sessions", "2", "--turns", "2", "--tool-wait", "0",
        "--lease-ttl", "5", "--close-sessions", "--name", "cli", "--out", str(tmp_path)])
    loop.call_soon_threadsafe(loop.stop)
    assert result.exit_code == 0, result.output
    run = json.loads((tmp_path / "cli.json").read_text())
    assert run["name"] == "cli" and run["summary"]["turns_ok"] == 4
    assert run["command"] == (f"python -m sidecar_tools.benchmarks.replay --url http://127.0.0.1:{run_server.port} --sessions 2 "
                              "--turns 2 --tool-wait 0.0 --lease-ttl 5.0 --close-sessions --name cli --out " + str(tmp_path))
    assert run["config"]["lease_ttl_s"] == 5.0 and run["trace"]["name"] == "reference"
    assert (tmp_path / "cli-turns.csv").read_text().count("\n") == 5


def test_cli_names_a_trace_it_cannot_read(tmp_path):
    from click.testing import CliRunner

    bad = tmp_path / "round_trace.jsonl"
    bad.write_text('{"session_id": "s", "round_index": 0, "output_tokens": 5}\n')
    result = CliRunner().invoke(replay_cli, ["--trace", str(bad), "--out", str(tmp_path)])
    assert result.exit_code == 1
    assert "TraceLab round trace" in result.output and "'prefix_tokens'" in result.output


async def test_every_finished_turn_reaches_the_progress_hook(make_engine):
    _, url = await make_engine(fail_every=4)
    seen = []
    run, records = await replay(small_trace(), url=url, mode="generate", opts=ClientOptions(), on_turn=seen.append)
    assert sorted(seen, key=id) == sorted(records, key=id) and len(seen) == run["summary"]["turns_planned"]
