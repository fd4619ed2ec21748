"""The policy as the turn core drives it over HTTP: leases on the wire, admission queue, idle closing."""

from __future__ import annotations

import asyncio

import pytest

from sidecar_tools.simulator.replies import IM_END_ID, scripted_responder

from sidecar.server.app import create_app
from sidecar.settings import load_settings


async def _client(aiohttp_client, double, tokenizer, tokenizer_dir, **sections):
    overrides = {"server": {"sglang_url": double.url, "tokenizer": str(tokenizer_dir)}}
    for section, values in sections.items():
        overrides.setdefault(section, {}).update(values)
    return await aiohttp_client(create_app(load_settings(overrides=overrides), tokenizer=tokenizer))


def _ask(text, sid=None):
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 8, **({"session_id": sid} if sid else {})}


async def test_fixed_lease_reaches_sglang_and_is_tracked(aiohttp_client, make_sglang_double, qwen3_tokenizer, qwen3_tokenizer_dir):
    double = await make_sglang_double()
    client = await _client(aiohttp_client, double, qwen3_tokenizer, qwen3_tokenizer_dir, policy={"mode": "fixed", "fixed_ttl": 42.0})
    resp = await client.post("/v1/chat/completions", json=_ask("hi", "leased-1"))
    assert resp.status == 200
    assert double.requests[0]["sampling_params"]["custom_params"]["session_lease_ttl_s"] == 42.0
    listed = {s["id"]: s for s in (await (await client.get("/v1/sessions")).json())["data"]}
    assert listed["leased-1"]["state"] == "leased" and 41 < listed["leased-1"]["lease_remaining_s"] <= 42
    assert listed["leased-1"]["lease_source"] == "requested"  # what the sidecar asked for; SGLang holds the real one


async def test_policy_off_sends_no_lease(aiohttp_client, make_sglang_double, qwen3_tokenizer, qwen3_tokenizer_dir):
    double = await make_sglang_double()
    client = await _client(aiohttp_client, double, qwen3_tokenizer, qwen3_tokenizer_dir, policy={"mode": "off"})
    assert (await client.post("/v1/chat/completions", json=_ask("hi"))).status == 200
    assert "custom_params" not in double.requests[0]["sampling_params"]


async def test_predictive_lease_is_bounded(aiohttp_client, make_sglang_double, qwen3_tokenizer, qwen3_tokenizer_dir):
    double = await make_sglang_double()
    client = await _client(
        aiohttp_client, double, qwen3_tokenizer, qwen3_tokenizer_dir, policy={"mode": "predictive", "min_ttl": 1.0, "max_ttl": 90.0}
    )
    assert (await client.post("/v1/chat/completions", json=_ask("hi"))).status == 200
    ttl = double.requests[0]["sampling_params"]["custom_params"]["session_lease_ttl_s"]
    assert 1.0 <= ttl <= 90.0


async def test_idle_session_is_closed_in_sglang_and_forgotten(aiohttp_client, make_sglang_double, qwen3_tokenizer, qwen3_tokenizer_dir):
    double = await make_sglang_double()
    client = await _client(
        aiohttp_client,
        double,
        qwen3_tokenizer,
        qwen3_tokenizer_dir,
        server={"session_idle_grace": 0.2},
        policy={"mode": "fixed", "fixed_ttl": 0.3},
    )
    assert (await client.post("/v1/chat/completions", json=_ask("hi", "short-lived"))).status == 200
    for _ in range(40):
        await asyncio.sleep(0.1)
        if any(c.get("session_id") == "short-lived" for c in double.closed_sessions):
            break
    assert any(c.get("session_id") == "short-lived" for c in double.closed_sessions)
    assert (await (await client.get("/v1/sessions")).json())["data"] == []


async def test_admission_queues_new_sessions_and_answers_429_when_full(
    aiohttp_client, make_sglang_double, qwen3_tokenizer, qwen3_tokenizer_dir
):
    # A pool that holds one session at a time (projected growth included).
    double = await make_sglang_double(max_total_num_tokens=600, token_delay=0.02)
    double.responder = scripted_responder([1000 + i for i in range(30)] + [IM_END_ID])
    client = await _client(
        aiohttp_client,
        double,
        qwen3_tokenizer,
        qwen3_tokenizer_dir,
        policy={"mode": "fixed", "fixed_ttl": 0.5},
        admission={"enabled": True, "headroom": 1.0, "expected_growth_tokens": 300, "max_queue": 1, "max_wait": 0, "poll_interval": 0.05},
    )
    body = {"messages": [{"role": "user", "content": "word " * 40}], "max_tokens": 40}
    first = asyncio.ensure_future(client.post("/v1/chat/completions", json={**body, "session_id": "a"}))
    await asyncio.sleep(0.05)
    second = asyncio.ensure_future(client.post("/v1/chat/completions", json={**body, "session_id": "b"}))
    await asyncio.sleep(0.05)
    third = await client.post("/v1/chat/completions", json={**body, "session_id": "c"})
    assert third.status == 429
    assert int(third.headers["Retry-After"]) >= 1
    assert (await third.json())["error"]["code"] == "admission_queue_full"
    r1, r2 = await asyncio.gather(first, second)
    assert r1.status == 200 and r2.status == 200
    # b reached the engine only after a's turn ended and its lease ran out.
    order = [r["session_id"] for r in double.requests]
    assert order == ["a", "b"]
    text = await (await client.get("/metrics")).text()
    assert "admission" in text


@pytest.mark.parametrize("section, key, bad", [("policy", "mode", "sometimes"), ("admission", "headroom", -1)])
def test_policy_settings_are_validated(section, key, bad):
    from sidecar.settings import SettingsError

    with pytest.raises(SettingsError) as info:
        load_settings(overrides={section: {key: bad}})
    assert f"{section}.{key}" in str(info.value)
