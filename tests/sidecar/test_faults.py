"""Faults: SGLang killed, restarted or slow; agents that hang up; a sidecar that restarts.

Each test bounds every wait (``bounded``), so a hang is a failure, not a stuck suite. After each
fault the tests check what the agent got, that the session store and the policy's records are consistent
(nothing half-recorded, nothing left in flight, no admission slot held), and that the next request
works and continues the session token-exactly.
"""

from __future__ import annotations

import json

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager

import aiohttp
import pytest

from sidecar_tools.simulator.http_contract import parse_sse
from sidecar_tools.simulator.replies import IM_END_ID, scripted_responder

from sidecar.engine.capacity import EngineCapacity
from sidecar.server import keys
from sidecar.server.app import create_app
from sidecar.settings import load_settings

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


async def bounded(awaitable, seconds: float = 5.0):
    """Nothing may hang: every wait on the sidecar is bounded."""
    return await asyncio.wait_for(awaitable, seconds)


def _encode(tok, text):
    return tok.encode(text, add_special_tokens=False)


@pytest.fixture
async def make_sidecar(aiohttp_client, sglang_double, qwen3_tokenizer_dir, qwen3_tokenizer):
    """``await make_sidecar(policy={...}, admission={...}, **server)`` -> test client (the app is client.app)."""

    async def make(policy=None, admission=None, **server):
        overrides = {"server": {"sglang_url": sglang_double.url, "tokenizer": str(qwen3_tokenizer_dir), **server}}
        if policy:
            overrides["policy"] = policy
        if admission:
            overrides["admission"] = admission
        client = await aiohttp_client(create_app(load_settings(overrides=overrides), tokenizer=qwen3_tokenizer))
        return client

    return make


async def chat(client, body, headers=None, timeout=5.0):
    async def go():
        resp = await client.post("/v1/chat/completions", json=body, headers=headers)
        return resp.status, await resp.json()

    return await bounded(go(), timeout)


async def stream_until_content(client, body, headers=None):
    """Start a streamed turn and return the response once the first content delta arrived."""
    resp = await bounded(client.post("/v1/chat/completions", json={**body, "stream": True}, headers=headers))
    assert resp.status == 200
    while True:
        line = await bounded(resp.content.readline())
        assert line, "stream ended before any content"
        if line.startswith(b"data: {") and any(c["delta"].get("content") for c in json.loads(line[6:]).get("choices", [])):
            return resp


def assert_quiescent(app, *explicit_turns: tuple[str, int]):
    """Store and policy agree that nothing is running and no admission slot is held."""
    store, policy = app[keys.SESSIONS], app[keys.TURNS].policy
    assert all(s.inflight == 0 for s in store.all())
    assert all(s.turns or s.explicit for s in store.all())  # no half-born implicit session
    assert all(record.running == 0 for record in store.records())
    assert policy.gate.queue_length == 0
    for sid, turns in explicit_turns:
        assert store.get(sid).turn_count == turns


def history_of(double, turn: int) -> list[int]:
    """Exact ids the engine holds after the ``turn``-th finished generation (0-based)."""
    result = double.results[turn]
    request = next(r for r in double.requests if r.get("rid") == result["meta_info"]["id"])
    return request["input_ids"] + result["output_ids"]


LONG = list(range(1000, 1200))  # 200 plain tokens, no stop token
SESSION = {"X-Session-Id": "agent-7"}


# --------------------------------------------------------------------------- SGLang killed


async def test_engine_killed_mid_stream_then_next_turn_continues_on_the_restarted_engine(make_sidecar, sglang_double, qwen3_tokenizer):
    client = await make_sidecar()
    double = sglang_double
    double.responder = scripted_responder(_encode(qwen3_tokenizer, "first answer") + [IM_END_ID], LONG, _encode(qwen3_tokenizer, "ok") + [IM_END_ID])
    messages = [{"role": "user", "content": "start"}]
    status, first = await chat(client, {"messages": messages}, SESSION)
    assert status == 200
    messages += [first["choices"][0]["message"], {"role": "user", "content": "go on"}]

    double.token_delay = 0.02
    resp = await stream_until_content(client, {"messages": messages, "max_tokens": 200}, SESSION)
    started = time.monotonic()
    await bounded(double.restart())  # the engine dies with the stream in flight and comes back empty
    events = parse_sse(await bounded(resp.read()))
    assert time.monotonic() - started < 3
    assert events[-1] == "[DONE]" and events[-2]["error"]["type"] == "engine_unavailable"
    assert_quiescent(client.app, ("agent-7", 1))  # the broken turn was not recorded

    double.token_delay = 0.0
    status, body = await chat(client, {"messages": messages}, SESSION)
    assert status == 200, body
    turn1 = history_of(double, 0)
    assert double.requests[-1]["input_ids"][: len(turn1)] == turn1  # token-exact continuation
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # honest: the cache is gone
    messages += [body["choices"][0]["message"], {"role": "user", "content": "and?"}]
    status, third = await chat(client, {"messages": messages}, SESSION)
    assert status == 200 and third["usage"]["prompt_tokens_details"]["cached_tokens"] > len(turn1)
    assert_quiescent(client.app, ("agent-7", 3))


async def test_engine_killed_during_non_streamed_turn_is_503(make_sidecar, sglang_double):
    client = await make_sidecar()
    sglang_double.responder = scripted_responder(LONG)
    sglang_double.token_delay = 0.02
    task = asyncio.ensure_future(chat(client, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 200}))
    await bounded(sglang_double.wait_for_running())
    await bounded(sglang_double.restart())
    status, body = await task
    assert status == 503 and body["error"]["type"] == "engine_unavailable"
    assert_quiescent(client.app)
    assert len(client.app[keys.SESSIONS]) == 0


async def test_engine_killed_before_first_token_is_a_plain_http_error(make_sidecar, sglang_double):
    """Nothing was sent to the agent yet, so it gets a status code, not a broken 200 stream."""
    client = await make_sidecar()
    sglang_double.faults.first_token_delay = 2.0
    task = asyncio.ensure_future(
        bounded(client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "stream": True}))
    )
    await bounded(sglang_double.wait_for_running())
    await bounded(sglang_double.restart())
    resp = await task
    assert resp.status == 503 and (await resp.json())["error"]["type"] == "engine_unavailable"


async def test_engine_down_fails_fast_and_recovers(make_sidecar, sglang_double, qwen3_tokenizer):
    client = await make_sidecar(connect_retries=2)
    sglang_double.responder = scripted_responder(_encode(qwen3_tokenizer, "fine") + [IM_END_ID])
    messages = [{"role": "user", "content": "a"}]
    _, first = await chat(client, {"messages": messages}, SESSION)
    messages += [first["choices"][0]["message"], {"role": "user", "content": "b"}]
    host, port = sglang_double.host, sglang_double.port
    await sglang_double.stop()
    try:
        started = time.monotonic()
        status, body = await chat(client, {"messages": messages}, SESSION)
        assert status == 503 and body["error"]["type"] == "engine_unavailable"
        assert time.monotonic() - started < 2.0  # two quick retries, then an answer
        assert (await bounded(client.get("/health"))).status == 503
        assert_quiescent(client.app, ("agent-7", 1))
    finally:
        await sglang_double.start(host, port)
    assert (await bounded(client.get("/health"))).status == 200
    status, _ = await chat(client, {"messages": messages}, SESSION)
    assert status == 200
    turn1 = history_of(sglang_double, 0)
    assert sglang_double.requests[-1]["input_ids"][: len(turn1)] == turn1


async def test_short_engine_restart_is_bridged_by_connect_retries(make_sidecar, sglang_double):
    client = await make_sidecar(connect_retries=3)  # backoff 0.1 + 0.2 + 0.4 s
    await chat(client, {"messages": [{"role": "user", "content": "warm the pool"}], "max_tokens": 2})
    restart = asyncio.ensure_future(sglang_double.restart(downtime=0.15))
    await asyncio.sleep(0.02)  # the engine is down now
    status, body = await chat(client, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
    await restart
    assert status == 200, body


async def test_first_request_after_engine_restart_does_not_trip_on_stale_connections(make_sidecar, sglang_double):
    client = await make_sidecar(connect_retries=0)
    for _ in range(3):  # leave keep-alive connections in the pool
        assert (await chat(client, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}))[0] == 200
    await bounded(sglang_double.restart())
    for _ in range(3):
        status, body = await chat(client, {"messages": [{"role": "user", "content": "y"}], "max_tokens": 2})
        assert status == 200, body


async def test_engine_closing_an_idle_connection_as_the_turn_is_sent_does_not_fail_the_turn(
    make_sidecar, sglang_double, qwen3_tokenizer
):
    # SGLang closes keep-alive connections idle for 5 s: an agent back from a ~5 s tool gap can
    # send its turn on a connection the server is closing (seen on the H200: one 503 per run).
    client = await make_sidecar(connect_retries=1)
    sid = {"X-Session-Id": "keepalive"}
    first = [{"role": "user", "content": "run the tests"}]
    status, body = await chat(client, {"messages": first, "max_tokens": 3}, headers=sid)
    assert status == 200, body
    sglang_double.faults.hang_up_next = 1
    second = first + [body["choices"][0]["message"], {"role": "user", "content": "they pass"}]
    status, body2 = await chat(client, {"messages": second, "max_tokens": 3}, headers=sid)
    assert status == 200, body2
    generates = sglang_double.generate_requests()
    assert len(generates) == 2  # the hung-up attempt never reached the engine; the retry did
    assert generates[1]["input_ids"][: len(generates[0]["input_ids"])] == generates[0]["input_ids"]
    assert body2["usage"]["prompt_tokens_details"]["cached_tokens"] >= len(generates[0]["input_ids"])


async def test_engine_hanging_up_every_attempt_is_a_clean_503_and_the_session_survives(make_sidecar, sglang_double):
    client = await make_sidecar(connect_retries=1)
    sid = {"X-Session-Id": "hangups"}
    first = [{"role": "user", "content": "x"}]
    status, body = await chat(client, {"messages": first, "max_tokens": 2}, headers=sid)
    assert status == 200
    sglang_double.faults.hang_up_next = 2  # the attempt and its one retry
    second = first + [body["choices"][0]["message"], {"role": "user", "content": "y"}]
    status, err = await chat(client, {"messages": second, "max_tokens": 2}, headers=sid)
    assert status == 503 and err["error"]["code"] == "engine_unavailable", err
    status, body = await chat(client, {"messages": second, "max_tokens": 2}, headers=sid)
    assert status == 200, body
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # continued, not restarted


# --------------------------------------------------------------------------- SGLang restarted


async def test_engine_restart_between_turns_loses_leases_and_cache_but_not_the_session(make_sidecar, sglang_double, qwen3_tokenizer):
    client = await make_sidecar(policy={"mode": "fixed", "fixed_ttl": 30.0})
    double = sglang_double
    double.responder = scripted_responder(_encode(qwen3_tokenizer, "step") + [IM_END_ID])
    messages = [{"role": "system", "content": "You are an agent. " * 20}, {"role": "user", "content": "t1"}]
    _, first = await chat(client, {"messages": messages}, SESSION)
    assert double.requests[0]["sampling_params"]["custom_params"]["session_lease_ttl_s"] == 30.0
    assert client.app[keys.SESSIONS].get("agent-7").record.lease_expires_at > time.monotonic()

    await bounded(double.restart())  # cache, sessions and (in the real engine) the lease table are gone

    messages += [first["choices"][0]["message"], {"role": "user", "content": "t2"}]
    status, second = await chat(client, {"messages": messages}, SESSION)
    assert status == 200, second
    turn1 = history_of(double, 0)
    sent = double.requests[-1]
    assert sent["input_ids"][: len(turn1)] == turn1  # same exact ids: nothing re-rendered
    assert sent["session_id"] == "agent-7" and "session_params" not in sent  # nothing that needs open_session
    assert sent["sampling_params"]["custom_params"]["session_lease_ttl_s"] == 30.0  # the lease is granted anew
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # reported as the engine saw it
    assert double.results[-1]["meta_info"]["finish_reason"]["type"] == "stop"  # not an "unknown session" abort

    messages += [second["choices"][0]["message"], {"role": "user", "content": "t3"}]
    _, third = await chat(client, {"messages": messages}, SESSION)
    assert third["usage"]["prompt_tokens_details"]["cached_tokens"] >= len(history_of(double, 1)) - 1
    assert_quiescent(client.app, ("agent-7", 3))


# --------------------------------------------------------------------------- SGLang slow


async def test_slow_first_token_times_out_as_configured_and_is_aborted(make_sidecar, sglang_double):
    client = await make_sidecar(request_timeout=0.3)
    sglang_double.faults.first_token_delay = 3.0
    for stream in (False, True):
        started = time.monotonic()
        resp = await bounded(
            client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "stream": stream}, headers=SESSION)
        )
        body = await resp.json()
        elapsed = time.monotonic() - started
        assert resp.status == 504 and body["error"]["code"] == "engine_timeout", body
        assert 0.25 < elapsed < 1.5
    await asyncio.sleep(0.1)
    rids = {r["rid"] for r in sglang_double.requests}
    assert rids <= {a["rid"] for a in sglang_double.aborts}  # the engine stops working for nobody
    assert sglang_double.running_rids == []
    assert_quiescent(client.app, ("agent-7", 0))
    sglang_double.faults.first_token_delay = 0.0
    status, body = await chat(client, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 5}, SESSION)
    assert status == 200, body


async def test_slow_stream_times_out_mid_stream_with_an_error_event(make_sidecar, sglang_double):
    client = await make_sidecar(request_timeout=0.5)
    sglang_double.responder = scripted_responder(LONG)
    sglang_double.token_delay = 0.1
    started = time.monotonic()
    resp = await stream_until_content(client, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 200})
    events = parse_sse(await bounded(resp.read()))
    assert 0.45 < time.monotonic() - started < 2.0
    assert events[-1] == "[DONE]" and events[-2]["error"]["type"] == "timeout"
    await asyncio.sleep(0.1)
    assert sglang_double.aborts and sglang_double.aborts[-1]["rid"] == sglang_double.requests[-1]["rid"]
    assert sglang_double.running_rids == []
    assert_quiescent(client.app)


@contextmanager
def blackhole_port():
    """A port whose accept queue is full: the kernel drops further SYNs, so connect() hangs."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            fillers.append(s)
        time.sleep(0.05)
        yield port
    finally:
        for s in fillers:
            s.close()
        server.close()


async def test_connect_timeout_is_honoured(make_sidecar, sglang_double):
    client = await make_sidecar(connect_timeout=0.2, connect_retries=0)
    with blackhole_port() as port:
        (worker,) = client.app[keys.WORKERS]
        worker.client.base_url = f"http://127.0.0.1:{port}"
        started = time.monotonic()
        status, body = await chat(client, {"messages": [{"role": "user", "content": "x"}]})
        elapsed = time.monotonic() - started
    assert status in (503, 504), body
    assert 0.15 < elapsed < 1.5  # not the old hard-coded 5 s


# --------------------------------------------------------------------------- agent disconnects


async def test_agent_hanging_up_a_non_streamed_turn_aborts_and_releases_everything(make_sidecar, sglang_double):
    client = await make_sidecar(policy={"mode": "fixed", "fixed_ttl": 30.0})
    sglang_double.responder = scripted_responder(LONG)
    sglang_double.token_delay = 0.02
    task = asyncio.ensure_future(client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 200}))
    await bounded(sglang_double.wait_for_running())
    task.cancel()  # the agent goes away without reading the answer
    with pytest.raises(asyncio.CancelledError):
        await task
    await client.session.close()
    for _ in range(100):
        await asyncio.sleep(0.02)
        if sglang_double.aborts and not sglang_double.running_rids:
            break
    assert sglang_double.aborts[0]["rid"] == sglang_double.requests[0]["rid"]
    assert sglang_double.running_rids == []
    assert_quiescent(client.app)
    assert len(client.app[keys.SESSIONS]) == 0 and sglang_double.results[-1]["meta_info"]["finish_reason"]["type"] == "abort"


async def test_hanging_up_a_continued_leased_turn_keeps_the_last_good_state(make_sidecar, sglang_double, qwen3_tokenizer):
    client = await make_sidecar(policy={"mode": "fixed", "fixed_ttl": 30.0})
    double = sglang_double
    double.responder = scripted_responder(_encode(qwen3_tokenizer, "one") + [IM_END_ID], LONG, _encode(qwen3_tokenizer, "two") + [IM_END_ID])
    messages = [{"role": "user", "content": "a"}]
    _, first = await chat(client, {"messages": messages}, SESSION)
    session = client.app[keys.SESSIONS].get("agent-7")
    lease_until = session.record.lease_expires_at
    assert lease_until is not None
    messages += [first["choices"][0]["message"], {"role": "user", "content": "b"}]
    double.token_delay = 0.02
    resp = await stream_until_content(client, {"messages": messages, "max_tokens": 200}, SESSION)
    resp.close()
    for _ in range(100):
        await asyncio.sleep(0.02)
        if double.aborts and not double.running_rids:
            break
    assert double.aborts[-1]["rid"] == double.requests[-1]["rid"]
    # turn 1's lease, untouched: SGLang keeps it past an aborted turn, and so does the policy
    assert session.record.lease_expires_at == lease_until > time.monotonic()
    assert session.state(time.monotonic()) == "leased"
    assert_quiescent(client.app, ("agent-7", 1))
    double.token_delay = 0.0
    status, _ = await chat(client, {"messages": messages}, SESSION)
    turn1 = history_of(double, 0)
    assert status == 200 and double.requests[-1]["input_ids"][: len(turn1)] == turn1


async def test_hang_ups_never_leak_admission_capacity(make_sidecar, sglang_double):
    """A held slot would make the gate count a phantom resident session and queue everyone after it."""
    client = await make_sidecar(admission={"enabled": True, "headroom": 0.5, "expected_growth_tokens": 10, "max_wait": 0})
    capacity = client.app[keys.TURNS].policy.capacity.hierarchy_tokens
    assert capacity == sglang_double.max_total_num_tokens
    sglang_double.responder = scripted_responder(LONG)
    sglang_double.token_delay = 0.02
    big = "word " * 200
    for i in range(3):
        # one session fills the budget (as if the worker reported 250 KV tokens; re-set each round:
        # the engine-info refresh reports the real pool again)
        client.app[keys.TURNS].policy.set_capacity(EngineCapacity(max_total_num_tokens=250))
        resp = await stream_until_content(client, {"messages": [{"role": "user", "content": f"{i} {big}"}], "max_tokens": 200})
        # A second new session must queue behind the running one ...
        queued = asyncio.ensure_future(
            client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": f"q{i} {big}"}], "max_tokens": 2})
        )
        for _ in range(50):
            await asyncio.sleep(0.01)
            if client.app[keys.TURNS].policy.gate.queue_length:
                break
        assert client.app[keys.TURNS].policy.gate.queue_length == 1
        queued.cancel()  # ... and hangs up while waiting
        with pytest.raises(asyncio.CancelledError):
            await queued
        resp.close()  # the running one hangs up too
        for _ in range(100):
            await asyncio.sleep(0.02)
            if not sglang_double.running_rids and client.app[keys.TURNS].policy.gate.queue_length == 0:
                break
        assert_quiescent(client.app)
    assert len(sglang_double.requests) == 3  # queued requests never reached the engine
    sglang_double.token_delay = 0.0
    started = time.monotonic()
    status, _ = await chat(client, {"messages": [{"role": "user", "content": "new " + big}], "max_tokens": 2})
    assert status == 200 and time.monotonic() - started < 0.4  # admitted at once: nothing resident


# --------------------------------------------------------------------------- sidecar restarted


async def test_restarted_sidecar_rebuilds_sessions_from_the_next_request(make_sidecar, sglang_double, qwen3_tokenizer):
    """A new sidecar knows nothing: it renders the history whole (no assumption about what the
    engine holds), reports the engine's own cached_tokens, and is token-exact again from there."""
    double = sglang_double
    reply = "<think>\nprivate\n</think>\n\nchecked"
    double.responder = scripted_responder(_encode(qwen3_tokenizer, reply) + [IM_END_ID])
    old = await make_sidecar()
    explicit = [{"role": "user", "content": "explicit task"}]
    implicit = [{"role": "user", "content": "implicit task"}]
    _, a = await chat(old, {"messages": explicit}, SESSION)
    _, b = await chat(old, {"messages": implicit})
    await old.close()

    new = await make_sidecar()
    explicit += [a["choices"][0]["message"], {"role": "user", "content": "next"}]
    implicit += [b["choices"][0]["message"], {"role": "user", "content": "next"}]
    for messages, headers in ((explicit, SESSION), (implicit, None)):
        status, body = await chat(new, {"messages": messages}, headers)
        assert status == 200
        sent = double.requests[-1]
        rendered = qwen3_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert sent["input_ids"] == _encode(qwen3_tokenizer, rendered)  # rendered whole
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == double.results[-1]["meta_info"]["cached_tokens"]
        messages += [body["choices"][0]["message"], {"role": "user", "content": "again"}]
        status, _ = await chat(new, {"messages": messages}, headers)
        held = sent["input_ids"] + double.results[-2]["output_ids"]
        assert status == 200 and double.requests[-1]["input_ids"][: len(held)] == held  # exact again
        assert double.requests[-1]["session_id"] == sent["session_id"]
    assert_quiescent(new.app, ("agent-7", 2))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn_sidecar(port: int, engine_url: str, tokenizer_dir) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "sidecar", "serve", "--sglang-url", engine_url, "--port", str(port),
         "--tokenizer", str(tokenizer_dir), "--log-level", "warning"],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


async def _until_healthy(proc: subprocess.Popen, port: int) -> subprocess.Popen:
    async with aiohttp.ClientSession() as http:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"sidecar exited: {proc.stderr.read().decode()[-2000:]}")
            try:
                async with http.get(f"http://127.0.0.1:{port}/health") as resp:
                    if resp.status == 200:
                        return proc
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    proc.kill()
    raise RuntimeError("sidecar did not become healthy")


async def test_sidecar_process_killed_mid_stream_and_restarted(sglang_double, qwen3_tokenizer_dir, qwen3_tokenizer):
    """A real ``python -m sidecar serve`` is SIGKILLed mid-stream and started again on the same
    port; the new process serves the agent's retry with no memory of the old one."""
    double = sglang_double
    double.responder = scripted_responder(_encode(qwen3_tokenizer, "first") + [IM_END_ID], LONG, _encode(qwen3_tokenizer, "again") + [IM_END_ID])
    port = _free_port()
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    proc = _spawn_sidecar(port, double.url, qwen3_tokenizer_dir)
    try:
        await _until_healthy(proc, port)
        async with aiohttp.ClientSession() as http:
            messages = [{"role": "user", "content": "task"}]
            async with http.post(url, json={"messages": messages}, headers=SESSION) as resp:
                first = await resp.json()
            messages += [first["choices"][0]["message"], {"role": "user", "content": "more"}]
            double.token_delay = 0.02
            async with http.post(url, json={"messages": messages, "stream": True, "max_tokens": 200}, headers=SESSION) as resp:
                await bounded(resp.content.readline())
                await bounded(double.wait_for_running())
                os.kill(proc.pid, signal.SIGKILL)
                with pytest.raises(aiohttp.ClientError):  # the agent sees a broken stream, at once
                    await bounded(resp.read())
            proc.wait(5)
            for _ in range(100):  # the engine notices the dead client and stops generating
                if not double.running_rids:
                    break
                await asyncio.sleep(0.02)
            assert double.running_rids == []

            double.token_delay = 0.0
            proc = _spawn_sidecar(port, double.url, qwen3_tokenizer_dir)  # same port, empty memory
            await _until_healthy(proc, port)
            async with http.post(url, json={"messages": messages}, headers=SESSION) as resp:
                assert resp.status == 200
            rendered = qwen3_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            assert double.requests[-1]["input_ids"] == _encode(qwen3_tokenizer, rendered)
            async with http.get(f"http://127.0.0.1:{port}/v1/sessions") as resp:
                listed = {s["id"]: s for s in (await resp.json())["data"]}
            assert listed["agent-7"]["turns"] == 1 and listed["agent-7"]["state"] != "generating"
    finally:
        proc.kill()
        proc.wait(5)


# --------------------------------------------------------------------------- sustained load (smoke)


async def test_load_smoke_nothing_lost(qwen3_tokenizer_dir):
    """A few seconds of ``benchmarks/load_benchmark.py`` (real sidecar process, double process): every
    turn completes, the engine saw each exactly once, and every session continued turn after turn."""
    from sidecar_tools.benchmarks.load_benchmark import LoadConfig, run_load

    cfg = LoadConfig(sessions=24, duration=2.0, drain=5.0, ramp=0.5, token_delay=0.005, think=0.05, turns=4,
                     system_tokens=200, tool_tokens=30, pin=False)
    result = await bounded(run_load(cfg, str(qwen3_tokenizer_dir), modes=("sidecar",), log=lambda _: None), 60)
    summary = result["phases"]["sidecar"]["summary"]
    assert summary["turns_ok"] >= cfg.sessions * 2
    assert summary["errors"] == 0 and summary["unfinished_at_stop"] == 0
    assert summary["outside_engine_ttft_ms"]["n"] == summary["turns_ok"]  # each turn matched one engine request
    assert summary["continued_turns"] == summary["turns_ok"] - summary["sessions_started"]


async def test_an_in_stream_error_carries_a_stable_code_and_no_exception_text(make_sidecar, sglang_double, qwen3_tokenizer, sse):
    """Issue 27.7: the engine dropping a stream mid-way ends it with code engine_unavailable and a
    short message naming the kind of failure, not aiohttp's exception text."""
    from sidecar_tools.simulator.replies import scripted_responder

    client = await make_sidecar()
    sglang_double.faults.drop_next, sglang_double.faults.drop_after_tokens = 1, 3
    sglang_double.responder = scripted_responder(qwen3_tokenizer.encode(" a b c d e f g h", add_special_tokens=False))
    resp = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "stream": True})
    events = sse(await resp.read())
    error = events[-2]["error"]
    assert error["code"] == "engine_unavailable"
    assert len(error["message"]) < 120 and "Response payload" not in error["message"] and "Errno" not in error["message"]
