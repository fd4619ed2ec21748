"""The sidecar's HTTP API against the SGLang double: shapes, sessions, errors, aborts."""

from __future__ import annotations

import asyncio

import pytest

from sidecar_tools.simulator.replies import IM_END_ID, scripted_responder

from sidecar.server.app import create_app
from sidecar.settings import load_settings

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
    }
]


@pytest.fixture
async def sidecar(aiohttp_client, sglang_double, qwen3_tokenizer_dir, qwen3_tokenizer):
    """A sidecar test client in front of the SGLang double (returns (client, double))."""

    async def make(**server):
        settings = load_settings(
            overrides={"server": {"sglang_url": sglang_double.url, "tokenizer": str(qwen3_tokenizer_dir), **server}}
        )
        return await aiohttp_client(create_app(settings, tokenizer=qwen3_tokenizer))

    client = await make()
    client.make = make
    return client, sglang_double


def _encode(tok, text):
    return tok.encode(text, add_special_tokens=False)


async def _chat(client, body, headers=None):
    resp = await client.post("/v1/chat/completions", json=body, headers=headers)
    return resp.status, await resp.json()


async def test_non_stream_reply_with_usage_and_session_tag(sidecar, qwen3_tokenizer):
    client, double = sidecar
    double.responder = scripted_responder(_encode(qwen3_tokenizer, "Hello there!") + [IM_END_ID])
    model = double.served_model_name
    status, body = await _chat(client, {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20})
    assert status == 200, body
    assert body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Hello there!"}
    assert choice["finish_reason"] == "stop"
    usage = body["usage"]
    assert usage["completion_tokens"] == len(_encode(qwen3_tokenizer, "Hello there!")) + 1
    assert usage["prompt_tokens"] == len(double.requests[0]["input_ids"])
    assert "cached_tokens" in usage["prompt_tokens_details"]
    sent = double.requests[0]
    assert sent["session_id"].startswith("sess-")
    assert sent["sampling_params"]["max_new_tokens"] == 20
    assert IM_END_ID in sent["sampling_params"]["stop_token_ids"]
    assert "text" not in sent and isinstance(sent["input_ids"], list)


async def test_tool_call_is_parsed_and_next_turn_continues_exact_ids(sidecar, qwen3_tokenizer):
    client, double = sidecar
    call_text = '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>'
    double.responder = scripted_responder(
        _encode(qwen3_tokenizer, call_text) + [IM_END_ID], _encode(qwen3_tokenizer, "Done.") + [IM_END_ID]
    )
    messages = [{"role": "system", "content": "agent"}, {"role": "user", "content": "list files"}]
    status, first = await _chat(client, {"messages": messages, "tools": TOOLS})
    assert status == 200, first
    msg = first["choices"][0]["message"]
    assert first["choices"][0]["finish_reason"] == "tool_calls"
    assert msg["content"] is None
    assert msg["tool_calls"][0]["function"] == {"name": "bash", "arguments": '{"cmd": "ls"}'}

    messages += [msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "a.py\nb.py"}]
    status, second = await _chat(client, {"messages": messages, "tools": TOOLS})
    assert status == 200, second
    turn1, turn2 = double.requests
    assert turn2["session_id"] == turn1["session_id"]
    history = turn1["input_ids"] + double.results[0]["output_ids"]
    assert turn2["input_ids"][: len(history)] == history
    # Only the tool result and the generation prompt were rendered anew.
    suffix = qwen3_tokenizer.decode(turn2["input_ids"][len(history) :])
    assert suffix.startswith("\n<|im_start|>user\n<tool_response>\na.py\nb.py\n</tool_response><|im_end|>")
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= len(history) - 1


async def test_history_never_rerendered_even_when_template_rewrites_past_turns(sidecar, qwen3_tokenizer):
    """Qwen3's template drops <think> blocks of earlier assistant turns; we keep the real ids."""
    client, double = sidecar
    reply = "<think>\nI should look.\n</think>\n\nLet me check."
    double.responder = scripted_responder(_encode(qwen3_tokenizer, reply) + [IM_END_ID])
    messages = [{"role": "user", "content": "why is it slow?"}]
    _, first = await _chat(client, {"messages": messages})
    messages += [first["choices"][0]["message"], {"role": "user", "content": "and now?"}]
    await _chat(client, {"messages": messages})
    turn1, turn2 = double.requests
    history = turn1["input_ids"] + double.results[0]["output_ids"]
    assert turn2["input_ids"][: len(history)] == history
    # A full re-render would differ: the template strips the earlier <think> block.
    rerendered = qwen3_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "I should look." not in rerendered
    assert "I should look." in qwen3_tokenizer.decode(turn2["input_ids"])


async def test_diverging_history_starts_a_new_branch(sidecar, qwen3_tokenizer):
    client, double = sidecar
    double.responder = scripted_responder(_encode(qwen3_tokenizer, "ok") + [IM_END_ID])
    messages = [{"role": "user", "content": "task A"}]
    _, first = await _chat(client, {"messages": messages})
    edited = [{"role": "user", "content": "task B"}, first["choices"][0]["message"], {"role": "user", "content": "go"}]
    status, _ = await _chat(client, {"messages": edited})
    assert status == 200
    turn1, turn2 = double.requests
    assert turn2["session_id"] != turn1["session_id"]
    rendered = qwen3_tokenizer.apply_chat_template(edited, tokenize=False, add_generation_prompt=True)
    assert turn2["input_ids"] == _encode(qwen3_tokenizer, rendered)


async def test_explicit_session_id_from_header_body_or_user(sidecar, qwen3_tokenizer):
    client, double = sidecar
    await _chat(client, {"messages": [{"role": "user", "content": "a"}]}, headers={"X-Session-Id": "agent-1"})
    await _chat(client, {"messages": [{"role": "user", "content": "b"}], "session_id": "agent-2"})
    await _chat(client, {"messages": [{"role": "user", "content": "c"}], "user": "agent-3"})
    assert [r["session_id"] for r in double.requests] == ["agent-1", "agent-2", "agent-3"]
    resp = await client.get("/v1/sessions")
    listed = {s["id"]: s for s in (await resp.json())["data"]}
    assert {"agent-1", "agent-2", "agent-3"} <= set(listed)
    assert listed["agent-1"]["tokens"] > 0 and listed["agent-1"]["state"] == "idle"


async def test_stream_chunks_are_shaped_like_openai(sidecar, qwen3_tokenizer, sse):
    client, double = sidecar
    text = "Sure. "
    call = '<tool_call>\n{"name": "bash", "arguments": {"cmd": "pwd"}}\n</tool_call>'
    double.responder = scripted_responder(_encode(qwen3_tokenizer, text + call) + [IM_END_ID])
    resp = await client.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "where am I"}],
            "tools": TOOLS,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert resp.status == 200
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    events = sse(await resp.read())
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert content == "Sure."
    tool_deltas = [d for c in chunks if c["choices"] for d in c["choices"][0]["delta"].get("tool_calls", [])]
    assert tool_deltas[0]["function"]["name"] == "bash" and tool_deltas[0]["id"].startswith("call_")
    assert "".join(d["function"]["arguments"] for d in tool_deltas) == '{"cmd": "pwd"}'
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [f["choices"][0]["finish_reason"] for f in finals] == ["tool_calls"]
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] > 0
    assert all(c["usage"] is None for c in chunks[:-1])


async def test_stream_is_relayed_as_the_engine_produces_it(sidecar, qwen3_tokenizer):
    client, double = sidecar
    double.token_delay = 0.05
    double.responder = scripted_responder(_encode(qwen3_tokenizer, " one two three four five six") + [IM_END_ID])
    resp = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "count"}], "stream": True})
    arrivals = []
    async for line in resp.content:
        if line.startswith(b"data: {"):
            arrivals.append(asyncio.get_running_loop().time())
    # Chunks trickle in over the generation instead of arriving in one burst at the end.
    assert arrivals[-1] - arrivals[1] > 0.15


async def test_stop_strings_end_the_reply_and_abort_the_engine(sidecar, qwen3_tokenizer):
    client, double = sidecar
    double.responder = scripted_responder(_encode(qwen3_tokenizer, "alpha beta END gamma delta epsilon"))
    status, body = await _chat(client, {"messages": [{"role": "user", "content": "x"}], "stop": ["END"], "max_tokens": 30})
    assert status == 200
    assert body["choices"][0]["message"]["content"] == "alpha beta "
    assert body["choices"][0]["finish_reason"] == "stop"
    await asyncio.sleep(0.05)
    assert double.aborts and double.aborts[0]["rid"] == double.requests[0]["rid"]


async def test_sampling_params_and_extras_pass_through(sidecar):
    client, double = sidecar
    body = {
        "messages": [{"role": "user", "content": "x"}],
        "max_completion_tokens": 7,
        "temperature": 0.3,
        "top_p": 0.9,
        "seed": 42,
        "ignore_eos": True,
        "top_k": 5,
        "presence_penalty": 0.5,
    }
    status, _ = await _chat(client, body)
    assert status == 200
    params = double.requests[0]["sampling_params"]
    assert params["max_new_tokens"] == 7 and params["temperature"] == 0.3 and params["top_p"] == 0.9
    assert params["sampling_seed"] == 42 and params["ignore_eos"] is True and params["top_k"] == 5
    assert "stop_token_ids" not in params  # ignore_eos means the agent wants exactly max tokens


async def test_named_tool_choice_forces_that_tool(sidecar, qwen3_tokenizer):
    client, double = sidecar
    double.responder = scripted_responder(_encode(qwen3_tokenizer, '{"cmd": "make"}}\n</tool_call>') + [IM_END_ID])
    status, body = await _chat(
        client,
        {"messages": [{"role": "user", "content": "build"}], "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "bash"}}},
    )
    assert status == 200, body
    call = body["choices"][0]["message"]["tool_calls"][0]
    assert call["function"] == {"name": "bash", "arguments": '{"cmd": "make"}'}
    forced = qwen3_tokenizer.decode(double.requests[0]["input_ids"][-12:])
    assert forced.endswith('<tool_call>\n{"name": "bash", "arguments": ')


async def test_tool_choice_none_leaves_tool_markup_as_content(sidecar, qwen3_tokenizer):
    client, double = sidecar
    text = '<tool_call>\n{"name": "bash", "arguments": {}}\n</tool_call>'
    double.responder = scripted_responder(_encode(qwen3_tokenizer, text) + [IM_END_ID])
    _, body = await _chat(client, {"messages": [{"role": "user", "content": "x"}], "tools": TOOLS, "tool_choice": "none"})
    assert body["choices"][0]["message"].get("tool_calls") is None
    assert "<tool_call>" in body["choices"][0]["message"]["content"]


async def test_models_health_metrics(sidecar):
    client, double = sidecar
    models = await (await client.get("/v1/models")).json()
    assert models["data"][0]["id"] == double.served_model_name
    health = await client.get("/health")
    assert health.status == 200 and (await health.json())["sglang"] is True
    double.healthy = False
    health = await client.get("/health")
    assert health.status == 503 and (await health.json())["sglang"] is False
    await _chat(client, {"messages": [{"role": "user", "content": "x"}]})
    text = await (await client.get("/metrics")).text()
    assert "sidecar_turns_total" in text and "sidecar_prompt_tokens_total" in text


@pytest.mark.parametrize(
    "body, fragment",
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "role"),
        ({"messages": [{"role": "user", "content": 5}]}, "content"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "n=1"),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, "max_tokens"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "'image_url' are not supported"),
        ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, "tools"),
        ({"messages": "hello"}, "messages"),
        (["not", "an", "object"], "object"),
    ],
)
async def test_bad_input_gets_openai_style_400(sidecar, body, fragment):
    client, double = sidecar
    status, err = await _chat(client, body)
    assert status == 400
    assert err["error"]["type"] == "invalid_request_error"
    assert fragment in err["error"]["message"]
    assert double.requests == []


async def test_a_model_it_does_not_serve_is_a_404_as_openai_answers(sidecar):
    client, double = sidecar
    hi = [{"role": "user", "content": "hi"}]
    status, err = await _chat(client, {"model": "gpt-4o", "messages": hi})
    assert status == 404, err
    assert err["error"]["code"] == "model_not_found" and err["error"]["param"] == "model"
    assert "gpt-4o" in err["error"]["message"] and double.requests == []
    assert (await _chat(client, {"model": double.served_model_name, "messages": hi}))[0] == 200
    assert (await _chat(client, {"messages": hi}))[0] == 200  # no model: the served one
    lenient = await client.make(accept_any_model=True)
    resp = await lenient.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": hi})
    assert resp.status == 200


async def test_sessions_count_branches_not_stored_turns(sidecar):
    client, _ = sidecar
    headers = {"X-Session-Id": "tree"}
    messages = [{"role": "user", "content": "start"}]
    for k in range(3):  # a straight chain of three turns
        _, reply = await _chat(client, {"messages": messages}, headers)
        messages += [reply["choices"][0]["message"], {"role": "user", "content": f"next {k}"}]

    async def listed():
        return next(s for s in (await (await client.get("/v1/sessions")).json())["data"] if s["id"] == "tree")

    assert (await listed())["turns"] == 3 and (await listed())["branches"] == 1
    await _chat(client, {"messages": [{"role": "user", "content": "start over, edited"}]}, headers)
    assert (await listed())["turns"] == 4 and (await listed())["branches"] == 2


async def test_malformed_json_and_oversize_bodies(sidecar):
    client, double = sidecar
    resp = await client.post("/v1/chat/completions", data=b"{not json", headers={"Content-Type": "application/json"})
    assert resp.status == 400 and "JSON" in (await resp.json())["error"]["message"]
    lone = b'{"messages": [{"role": "user", "content": "half a pair: \\ud83d"}]}'
    resp = await client.post("/v1/chat/completions", data=lone, headers={"Content-Type": "application/json"})
    assert resp.status == 400 and "unpaired surrogate" in (await resp.json())["error"]["message"]
    deep = b'{"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"a": ' + b"[" * 5000 + b"]" * 5000 + b"}}"
    resp = await client.post("/v1/chat/completions", data=deep, headers={"Content-Type": "application/json"})
    assert resp.status == 400 and "not valid JSON" in (await resp.json())["error"]["message"]
    assert double.requests == []
    small, _ = await client.make(max_body_bytes=2048), None
    resp = await small.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 5000}]})
    assert resp.status == 413 and (await resp.json())["error"]["code"] == "body_too_large"
    resp = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}, headers={"X-Session-Id": "bad id!"})
    assert resp.status == 400 and "session id" in (await resp.json())["error"]["message"]


async def test_lone_surrogate_inside_tool_call_arguments_is_a_400(sidecar):
    """Arguments are JSON text inside JSON: an escaped lone surrogate there is valid in the body and
    only appears once the sidecar parses the arguments; still the client's error, never a 500."""
    client, double = sidecar
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": "\\ud800"}'}}
    body = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}
    status, err = await _chat(client, body)
    assert status == 400 and "not valid Unicode" in err["error"]["message"]
    assert double.requests == []


async def test_prompt_token_limit(sidecar):
    client, _ = sidecar
    tight = await client.make(max_prompt_tokens=10)
    resp = await tight.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "word " * 50}]})
    body = await resp.json()
    assert resp.status == 400 and body["error"]["code"] == "context_length_exceeded"


async def test_engine_errors_map_to_status_codes_and_leave_sessions_intact(sidecar, qwen3_tokenizer):
    client, double = sidecar
    double.responder = scripted_responder(_encode(qwen3_tokenizer, "fine") + [IM_END_ID])
    messages = [{"role": "user", "content": "start"}]
    headers = {"X-Session-Id": "stable"}
    _, first = await _chat(client, {"messages": messages}, headers)
    messages += [first["choices"][0]["message"], {"role": "user", "content": "more"}]

    double.faults.fail_next, double.faults.fail_status = 1, 503
    status, err = await _chat(client, {"messages": messages}, headers)
    assert status == 503 and err["error"]["code"] == "engine_overloaded"

    double.faults.fail_next, double.faults.fail_status = 1, 500
    status, err = await _chat(client, {"messages": messages}, headers)
    assert status == 502

    status, err = await _chat(client, {"messages": messages, "max_tokens": 50_000}, headers)
    assert status == 400 and "context length" in err["error"]["message"]

    # After the failures the session still continues from the first turn's exact ids.
    status, _ = await _chat(client, {"messages": messages}, headers)
    assert status == 200
    history = double.requests[0]["input_ids"] + double.results[0]["output_ids"]
    assert double.requests[-1]["input_ids"][: len(history)] == history
    sessions = (await (await client.get("/v1/sessions")).json())["data"]
    assert [s["turns"] for s in sessions if s["id"] == "stable"] == [2]


async def test_engine_down_is_503_and_health_says_so(aiohttp_client, qwen3_tokenizer_dir, unused_tcp_port):
    settings = load_settings(
        overrides={"server": {"sglang_url": f"http://127.0.0.1:{unused_tcp_port}", "tokenizer": str(qwen3_tokenizer_dir), "connect_retries": 1, "startup_wait": 0}}
    )
    client = await aiohttp_client(create_app(settings))
    status, err = await _chat(client, {"messages": [{"role": "user", "content": "x"}]})
    assert status == 503 and err["error"]["type"] == "engine_unavailable"
    assert (await client.get("/health")).status == 503
    assert (await (await client.get("/v1/sessions")).json())["data"] == []
    metrics = await (await client.get("/metrics")).text()  # the failed first request left no policy record either
    assert "\nsidecar_policy_sessions 0.0\n" in metrics and "\nsidecar_sessions 0.0\n" in metrics


async def test_agent_disconnect_mid_stream_aborts_the_engine_request(sidecar, qwen3_tokenizer):
    client, double = sidecar
    double.token_delay = 0.05
    double.responder = scripted_responder(list(range(1000, 1100)))
    resp = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "long"}], "stream": True, "max_tokens": 100})
    await resp.content.readline()
    resp.close()  # the agent goes away mid-stream
    for _ in range(50):
        await asyncio.sleep(0.05)
        if double.aborts:
            break
    assert double.aborts and double.aborts[0]["rid"] == double.requests[0]["rid"]
    sessions = (await (await client.get("/v1/sessions")).json())["data"]
    assert all(s["turns"] == 0 for s in sessions)  # nothing half-finished was recorded


async def test_engine_failure_mid_stream_is_an_error_event(sidecar, qwen3_tokenizer, sse):
    client, double = sidecar
    double.faults.drop_next, double.faults.drop_after_tokens = 1, 3
    double.responder = scripted_responder(_encode(qwen3_tokenizer, " a b c d e f g h"))
    resp = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "stream": True})
    assert resp.status == 200
    events = sse(await resp.read())
    assert "error" in events[-2] and events[-1] == "[DONE]"
    assert events[-2]["error"]["type"] == "engine_unavailable"


async def test_close_session_route_releases_in_sglang(sidecar):
    client, double = sidecar
    await _chat(client, {"messages": [{"role": "user", "content": "x"}]}, {"X-Session-Id": "done-1"})
    resp = await client.delete("/v1/sessions/done-1")
    assert resp.status == 200
    await asyncio.sleep(0.05)
    assert double.closed_sessions[-1]["session_id"] == "done-1"
    assert (await client.delete("/v1/sessions/done-1")).status == 404
    # SGLang's own route works too, for clients that already speak it.
    await _chat(client, {"messages": [{"role": "user", "content": "y"}]}, {"X-Session-Id": "done-2"})
    assert (await client.post("/close_session", json={"session_id": "done-2"})).status == 200
    assert "done-2" not in {s["id"] for s in (await (await client.get("/v1/sessions")).json())["data"]}


async def test_sidecar_waits_for_sglang_that_starts_later(aiohttp_client, qwen3_tokenizer_dir, qwen3_tokenizer, unused_tcp_port):
    """Started side by side, the sidecar learns SGLang's model and KV capacity once it is up."""
    from sidecar_tools.simulator.standin import SGLangStandIn

    double = SGLangStandIn(max_total_num_tokens=12345, served_model_name="late-model")
    settings = load_settings(
        overrides={"server": {"sglang_url": f"http://127.0.0.1:{unused_tcp_port}", "tokenizer": str(qwen3_tokenizer_dir), "startup_wait": 10}}
    )

    async def start_late():
        await asyncio.sleep(1.5)
        await double.start(port=unused_tcp_port)

    starter = asyncio.ensure_future(start_late())
    try:
        client = await aiohttp_client(create_app(settings, tokenizer=qwen3_tokenizer))
        models = await (await client.get("/v1/models")).json()
        assert models["data"][0]["id"] == "late-model"
        status, _ = await _chat(client, {"messages": [{"role": "user", "content": "hi"}]})
        assert status == 200
    finally:
        await starter
        await double.stop()
