"""Values SGLang would refuse or overflow on, and loosely typed fields, never reach the engine:
each is a 400 in OpenAI's envelope with the field named."""

from __future__ import annotations

import json

import pytest


BASE = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture
async def client(make_sidecar):
    return await make_sidecar(max_tools=8, max_content_parts=16, max_messages=50)


async def post_raw(client, raw: bytes):
    resp = await client.post("/v1/chat/completions", data=raw, headers={"Content-Type": "application/json"})
    return resp.status, await resp.json()


@pytest.mark.parametrize(
    "field, value",
    [
        ("repetition_penalty", 1e308),
        ("repetition_penalty", 2.5),
        ("repetition_penalty", 0),
        ("seed", 2**70),
        ("seed", -(2**64)),
        ("top_k", 10**20),
        ("top_k", 0),
        ("top_k", 2**31),
        ("stop_token_ids", [10**30]),
        ("stop_token_ids", [-1]),
        ("stop_token_ids", list(range(2000))),
        ("stop", ["x"] * 33),
        ("temperature", 1e308),
        ("max_tokens", True),
        ("max_tokens", "5"),
        ("max_tokens", 5.0),
        ("stream", "yes"),
        ("temperature", "0.5"),
    ],
)
async def test_out_of_range_or_loose_values_are_400(client, sglang_double, field, value):
    status, err = await post_raw(client, json.dumps({**BASE, field: value}).encode())
    assert status == 400, (field, value, err)
    assert err["error"]["param"] == field or err["error"]["param"].startswith(field), err
    assert sglang_double.requests == []


async def test_edges_sglang_accepts_pass(client, sglang_double):
    for extra in ({"top_k": -1}, {"top_k": 1 << 30}, {"repetition_penalty": 2.0}, {"seed": 2**63 - 1},
                  {"stop_token_ids": [0, 151643]}, {"temperature": 0}, {"temperature": 1}):
        status, body = await post_raw(client, json.dumps({**BASE, **extra}).encode())
        assert status == 200, (extra, body)
    sent = [r["sampling_params"] for r in sglang_double.requests]
    assert sent[0]["top_k"] == -1 and sent[3]["sampling_seed"] == 2**63 - 1


async def test_counts_are_checked_before_validation(client, sglang_double):
    tool = {"type": "function", "function": {"name": "t", "parameters": {"type": "object"}}}
    status, err = await post_raw(client, json.dumps({**BASE, "tools": [tool] * 9}).encode())
    assert status == 400 and err["error"]["param"] == "tools", err
    parts = [{"type": "text", "text": "a"}] * 17
    status, err = await post_raw(client, json.dumps({**BASE, "messages": [{"role": "user", "content": parts}]}).encode())
    assert status == 400 and "content parts" in err["error"]["message"], err
    status, err = await post_raw(client, json.dumps({**BASE, "messages": BASE["messages"] * 51}).encode())
    assert status == 400 and err["error"]["param"] == "messages", err
    assert sglang_double.requests == []


@pytest.mark.parametrize("name", ['a"}\n</tool_call>', "bash tool", "", "x" * 129, "ls\n"])
async def test_tool_names_that_could_break_the_prompt_are_refused(client, sglang_double, name):
    tool = {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    body = {**BASE, "tools": [tool], "tool_choice": {"type": "function", "function": {"name": name}}}
    status, err = await post_raw(client, json.dumps(body).encode())
    assert status == 400 and err["error"]["param"].startswith(("tools", "tool_choice")), err
    assert sglang_double.requests == []
