"""A read of SGLang's stream that brings several chunks is relayed as one delta and one write, on
every door: the agent gets the same text and tool calls as from a chunk a read, in valid events,
and the session continues from the engine's exact ids."""

from __future__ import annotations

import json

import pytest

from sidecar.engine.client import EngineClient
from sidecar_tools.simulator.replies import IM_END_ID, scripted_responder

MODEL = "Qwen/Qwen3-8B"
REPLY = 'I will list the files now, then read them.\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls -la"}}\n</tool_call>'
TOOL = {"name": "bash", "description": "Run a command", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}
ASK = "List the files."


def _body(door: str, stream: bool) -> tuple[str, dict]:
    if door == "chat":
        return "/v1/chat/completions", {"model": MODEL, "stream": stream, "messages": [{"role": "user", "content": ASK}],
                                        "tools": [{"type": "function", "function": TOOL}]}
    if door == "messages":
        return "/v1/messages", {"model": MODEL, "stream": stream, "max_tokens": 200, "messages": [{"role": "user", "content": ASK}],
                                "tools": [{"name": TOOL["name"], "description": TOOL["description"], "input_schema": TOOL["parameters"]}]}
    return "/v1/responses", {"model": MODEL, "stream": stream, "input": ASK, "tools": [{"type": "function", **TOOL}]}


def _streamed(door: str, events: list) -> tuple[str, list[tuple[str, dict]]]:
    """(text, [(tool name, arguments)]) of a door's stream, each event checked for its shape."""
    text, calls = "", []
    if door == "chat":
        assert events[-1] == "[DONE]"
        args: dict[int, list[str]] = {}
        names: dict[int, str] = {}
        for e in events[:-1]:
            assert e["object"] == "chat.completion.chunk"
            for choice in e["choices"]:
                delta = choice["delta"]
                text += delta.get("content") or ""
                for call in delta.get("tool_calls") or []:
                    if "id" in call:
                        names[call["index"]] = call["function"]["name"]
                    args.setdefault(call["index"], []).append(call["function"]["arguments"])
        assert events[-2]["choices"][0]["finish_reason"] == "tool_calls"
        return text, [(names[i], json.loads("".join(args[i]))) for i in sorted(names)]
    if door == "messages":
        kinds = [e["type"] for e in events]
        assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
        blocks: dict[int, dict] = {}
        for e in events:
            if e["type"] == "content_block_start":
                assert e["index"] not in blocks  # every block opens once, in order
                blocks[e["index"]] = {**e["content_block"], "json": ""}
            elif e["type"] == "content_block_delta":
                block = blocks[e["index"]]
                if block["type"] == "text":
                    block["text"] += e["delta"]["text"]
                else:
                    block["json"] += e["delta"]["partial_json"]
        assert events[-2]["delta"]["stop_reason"] == "tool_use"
        text = "".join(b["text"] for b in blocks.values() if b["type"] == "text")
        return text, [(b["name"], json.loads(b["json"])) for b in blocks.values() if b["type"] == "tool_use"]
    numbers = [e["sequence_number"] for e in events]
    assert numbers == list(range(len(events)))  # numbered in order, none skipped
    assert events[-1]["type"] == "response.completed"
    for e in events:
        if e["type"] == "response.output_text.delta":
            text += e["delta"]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call"]
    return text, [(item["name"], json.loads(item["arguments"])) for item in done]


def _grouped(monkeypatch, size: int | None) -> None:
    """Every read of the engine's stream brings ``size`` chunks (None: the whole stream at once)."""
    read = EngineClient.generate_batches

    async def generate_batches(self, payload, headers=None, on_response=None, every=False):
        chunks = [c async for batch in read(self, payload, headers, on_response, every=True) for c in batch]
        step = size or len(chunks)
        for i in range(0, len(chunks), step):
            yield chunks[i : i + step]

    monkeypatch.setattr(EngineClient, "generate_batches", generate_batches)


async def _turn(client, door: str, stream: bool):
    path, body = _body(door, stream)
    resp = await client.post(path, json=body)
    assert resp.status == 200, await resp.text()
    return await resp.read()


@pytest.mark.parametrize("door", ["chat", "messages", "responses"])
async def test_chunks_read_together_give_the_same_reply_as_one_a_read(door, make_sidecar, sglang_double, qwen3_tokenizer, sse, monkeypatch):
    ids = qwen3_tokenizer.encode(REPLY, add_special_tokens=False) + [IM_END_ID]
    sglang_double.responder = scripted_responder(ids)
    client = await make_sidecar()
    replies = {}
    for size in (1, 3, None):
        _grouped(monkeypatch, size)
        raw = await _turn(client, door, stream=True)
        replies[size] = (_streamed(door, sse(raw)), raw.count(b"\n\n"))
    (text, calls), frames_one = replies[1]
    assert text == REPLY.split("<tool_call>")[0].strip()
    assert calls == [("bash", {"cmd": "ls -la"})]
    assert replies[3][0] == replies[None][0] == (text, calls)
    assert replies[3][1] < frames_one and replies[None][1] < replies[3][1]  # fewer deltas, the same text
    for out in sglang_double.results:
        assert out["output_ids"] == ids  # the engine's reply, whole, each time


async def test_a_session_continues_from_the_exact_ids_of_a_coalesced_stream(make_sidecar, sglang_double, qwen3_tokenizer, sse, monkeypatch):
    ids = qwen3_tokenizer.encode(REPLY, add_special_tokens=False) + [IM_END_ID]
    sglang_double.responder = scripted_responder(ids)
    client = await make_sidecar()
    _grouped(monkeypatch, 4)
    path, body = _body("chat", True)
    first = await client.post(path, json=body, headers={"X-Session-Id": "s1"})
    events = sse(await first.read())
    call_id = next(c["id"] for e in events[:-1] for ch in e["choices"] for c in ch["delta"].get("tool_calls") or [] if "id" in c)
    body["messages"] += [
        {"role": "assistant", "content": REPLY.split("<tool_call>")[0].strip(),
         "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls -la"}'}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "a.py b.py"},
    ]
    second = await client.post(path, json=body, headers={"X-Session-Id": "s1"})
    assert second.status == 200
    await second.read()
    held = sglang_double.requests[0]["input_ids"] + sglang_double.results[0]["output_ids"]
    assert sglang_double.requests[1]["input_ids"][: len(held)] == held
