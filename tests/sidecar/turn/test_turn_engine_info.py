"""What the sidecar knows of its engine: read at start, re-read until known, shown on /health and
/metrics; and the after-turn lease revision through the plugin's channel."""

from __future__ import annotations

import asyncio
import socket

from sidecar_tools.simulator.replies import IM_END_ID, scripted_responder
from sidecar_tools.simulator.standin import SGLangStandIn

from sidecar.server import keys
from sidecar.server.app import create_app
from sidecar.settings import load_settings

TOOLS = [{"type": "function", "function": {"name": "slow_tool", "parameters": {"type": "object", "properties": {}}}}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _sidecar(aiohttp_client, url, tokenizer, tokenizer_dir, **sections):
    overrides = {"server": {"sglang_url": url, "tokenizer": str(tokenizer_dir), "startup_wait": 0.0, "connect_retries": 0}}
    for section, values in sections.items():
        overrides.setdefault(section, {}).update(values)
    return await aiohttp_client(create_app(load_settings(overrides=overrides), tokenizer=tokenizer))


def _ask(text, sid, **extra):
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 8, "session_id": sid, **extra}


def _gauge(text: str, name: str) -> float:
    line = next(line for line in text.splitlines() if line.startswith(name))
    return float(line.rsplit(" ", 1)[1])


async def test_an_engine_that_starts_later_is_read_before_any_session_is_admitted(
    aiohttp_client, qwen3_tokenizer, qwen3_tokenizer_dir
):
    port = _free_port()
    client = await _sidecar(aiohttp_client, f"http://127.0.0.1:{port}", qwen3_tokenizer, qwen3_tokenizer_dir,
                            admission={"enabled": True})
    resp = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
    body = await resp.json()
    assert resp.status == 503 and body["error"]["code"] == "engine_info_unknown" and resp.headers["Retry-After"]
    assert _gauge(await (await client.get("/metrics")).text(), "sidecar_engine_info_known") == 0
    assert not client.app[keys.SESSIONS].all()  # the refused first request left nothing behind

    hicache = {"enable_hierarchical_cache": True, "hicache_ratio": 2.0, "hicache_size": 0}  # as SGLang reports it
    engine = SGLangStandIn(max_total_num_tokens=4096, server_info_overrides=hicache)
    await engine.start(port=port)
    try:
        resp = await client.post("/v1/chat/completions", json=_ask("hi", "later"))
        assert resp.status == 200  # asked again at once, not after the next periodic read
        policy = client.app[keys.TURNS].policy
        headroom = policy.admission_settings.headroom
        assert [r.budget_tokens for r in policy.placement.rooms()] == [4096 + 8193 - (1 - headroom) * 4096]  # GPU + host, less the GPU's headroom
        health = await (await client.get("/health")).json()
        assert health["capacity"] == {"gpu_tokens": 4096, "host_tokens": 8193, "plugin": False}
        metrics = await (await client.get("/metrics")).text()
        assert _gauge(metrics, 'sidecar_engine_capacity_tokens{tier="gpu"}') == 4096
        assert _gauge(metrics, 'sidecar_engine_capacity_tokens{tier="host"}') == 8193
        assert _gauge(metrics, "sidecar_engine_info_known") == 1
    finally:
        await engine.stop()


async def _after_turn_run(aiohttp_client, make_sglang_double, tokenizer, tokenizer_dir, policy):
    double = await make_sglang_double(policy=policy)
    call = '<tool_call>\n{"name": "slow_tool", "arguments": {}}\n</tool_call>'
    double.responder = scripted_responder(tokenizer.encode(call, add_special_tokens=False) + [IM_END_ID])
    client = await _sidecar(aiohttp_client, double.url, tokenizer, tokenizer_dir, policy={"mode": "predictive"})
    predictor = client.app[keys.TURNS].policy.predictor
    for _ in range(40):  # learned: replies without tools come back in 0.5 s, slow_tool ones in 30 s
        predictor.observe([], 0.5, None, 100)
    for _ in range(10):
        predictor.observe(["slow_tool"], 30.0, None, 5000)
    resp = await client.post("/v1/chat/completions", json=_ask("go", "agent-1", tools=TOOLS, max_tokens=64))
    assert resp.status == 200 and (await resp.json())["choices"][0]["message"]["tool_calls"]
    sent = double.requests[0]["sampling_params"]["custom_params"]["session_expected_back_s"]
    assert sent < 2.0  # before the reply, the session looked like the quick no-tool ones
    return double


async def test_the_reply_s_tool_call_revises_the_lease_in_the_plugin(
    aiohttp_client, make_sglang_double, qwen3_tokenizer, qwen3_tokenizer_dir
):
    double = await _after_turn_run(aiohttp_client, make_sglang_double, qwen3_tokenizer, qwen3_tokenizer_dir, "session_ttl")
    for _ in range(50):
        if double.internal_state_updates:
            break
        await asyncio.sleep(0.02)
    (update,) = double.internal_state_updates
    args = update["server_args"]
    assert 20.0 < args["sglang_ext:expect:agent-1"] < 45.0  # slow_tool's gap, now that it was called
    assert args["sglang_ext:ttl:agent-1"] > 0
    lease = double.engine.mgr.table.get("agent-1")  # the plugin took it
    assert lease is not None and lease.expect_s > 20.0


async def test_without_the_plugin_no_revision_is_sent(
    aiohttp_client, make_sglang_double, qwen3_tokenizer, qwen3_tokenizer_dir
):
    double = await _after_turn_run(aiohttp_client, make_sglang_double, qwen3_tokenizer, qwen3_tokenizer_dir, "lru")
    await asyncio.sleep(0.2)
    assert double.internal_state_updates == []  # SGLang would refuse the plugin's keys


async def test_a_final_answer_shortens_the_lease_in_the_plugin_when_sessions_end_there(
    aiohttp_client, make_sglang_double, qwen3_tokenizer, qwen3_tokenizer_dir
):
    """The reply called no tool (a final answer) and sessions have been ending after theirs: the
    after-turn channel replaces the request's predicted lease by the short end-of-session one."""
    double = await make_sglang_double(policy="session_ttl")
    double.responder = scripted_responder(qwen3_tokenizer.encode("All done.", add_special_tokens=False) + [IM_END_ID])
    client = await _sidecar(aiohttp_client, double.url, qwen3_tokenizer, qwen3_tokenizer_dir, policy={"mode": "predictive"})
    policy = client.app[keys.TURNS].policy
    for _ in range(40):  # learned: tools come back in 30 s, final answers end their sessions
        policy.predictor.observe(["slow_tool"], 30.0, None, 100)
        policy.final_answers.ended()
    resp = await client.post("/v1/chat/completions", json=_ask("go", "agent-2", tools=TOOLS, max_tokens=64))
    assert resp.status == 200 and not (await resp.json())["choices"][0]["message"].get("tool_calls")
    assert double.requests[0]["sampling_params"]["custom_params"]["session_lease_ttl_s"] > 10.0
    for _ in range(50):
        if double.internal_state_updates:
            break
        await asyncio.sleep(0.02)
    (update,) = double.internal_state_updates
    assert update["server_args"]["sglang_ext:ttl:agent-2"] == policy.settings.final_answer_ttl
