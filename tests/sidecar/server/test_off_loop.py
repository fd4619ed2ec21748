"""The event loop is never the place for a large request's size-proportional work (issue 27.3):
a body of megabytes is parsed, validated and converted on the pool (``sidecar.turn.offload``), on
every door and whatever field holds its text; a small one stays on the loop, a bounded amount per
turn of it; the errors a client sees
are the same either way; and a prompt many times too long is refused before it is hashed."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from sidecar.anthropic import messages as anthropic_door
from sidecar.openai import chat_completions as chat_door
from sidecar.responses import responses as responses_door
from sidecar.server import request_body
from sidecar.turn import core as core_module
from sidecar.turn.offload import OFFLOAD_CHARS, Offload

BIG = "word " * (OFFLOAD_CHARS // 4)  # ~80K characters: prepared off the loop, within the prompt limit
# ~1 MB: parsed off the loop too (a byte of text costs a 16th of a prepared character to parse)
BIG_BODY = "word " * (request_body.VALUES_COUNTED_BYTES // 5 + 1000)

# each door: its path, its parse and conversion functions, a body carrying ``text`` in one field
DOORS = {
    "chat content": ("/v1/chat/completions", chat_door, "parse_chat_request",
                     lambda text: {"max_tokens": 4, "messages": [{"role": "user", "content": text}]}),
    "chat tool arguments": ("/v1/chat/completions", chat_door, "parse_chat_request", lambda text: {"max_tokens": 4, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "w", "arguments": json.dumps({"text": text})}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}),
    "messages system": ("/v1/messages", anthropic_door, "parse_messages_request",
                        lambda text: {"max_tokens": 4, "system": text, "messages": [{"role": "user", "content": "hi"}]}),
    "messages tool descriptions": ("/v1/messages", anthropic_door, "parse_messages_request", lambda text: {
        "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": f"t{i}", "description": text[i::8], "input_schema": {"type": "object"}} for i in range(8)]}),
    "responses many items": ("/v1/responses", responses_door, "parse_responses_request", lambda text: {
        "max_output_tokens": 4, "input": _items(text)}),
}


def _items(text: str) -> list[dict]:
    """``text`` as alternating input messages of 100 characters (an odd number: the last a user's)."""
    n = max(1, len(text) // 100) | 1
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": text[i * 100:(i + 1) * 100] or text} for i in range(n)]


def _recording(where: list[str], fn):
    def wrapped(*args, **kwargs):
        where.append(threading.current_thread().name)
        return fn(*args, **kwargs)

    return wrapped


@pytest.mark.parametrize("case", list(DOORS))
async def test_a_large_body_is_parsed_and_converted_on_the_pool_and_a_small_one_inline(case, make_sidecar, monkeypatch):
    """A body of a megabyte; a small one (a history of ~80K characters is small to parse: it is
    only prepared on the pool, the next test)."""
    path, door, parser, body = DOORS[case]
    where: dict[str, list[str]] = {"json": [], "validate": [], "convert": []}
    monkeypatch.setattr(request_body, "parse_strict_json", _recording(where["json"], request_body.parse_strict_json))
    monkeypatch.setattr(door, parser, _recording(where["validate"], getattr(door, parser)))
    monkeypatch.setattr(door, "turn_request", _recording(where["convert"], door.turn_request))
    client = await make_sidecar(max_messages=20_000)
    loop_thread = threading.current_thread().name  # the test client and the app share this loop
    for text, off_loop in ((BIG_BODY, True), ("hello", False)):
        for steps in where.values():
            steps.clear()
        resp = await client.post(path, json=body(text))
        assert resp.status in (200, 400), await resp.text()  # 400: longer than the engine's context
        for step, threads in where.items():
            assert threads, step
            assert all((t != loop_thread) == off_loop for t in threads), (case, step, threads)


async def test_a_long_history_is_parsed_on_the_loop_and_prepared_on_the_pool(make_sidecar, monkeypatch):
    """~80K characters of history: a fraction of a millisecond to parse (on the loop, no queue),
    milliseconds to render and tokenize (on the pool)."""
    where: dict[str, list[str]] = {"json": [], "prompt": []}
    monkeypatch.setattr(request_body, "parse_strict_json", _recording(where["json"], request_body.parse_strict_json))
    monkeypatch.setattr(core_module, "prompt_ids", _recording(where["prompt"], core_module.prompt_ids))
    client = await make_sidecar()
    resp = await client.post("/v1/chat/completions", json=DOORS["chat content"][3](BIG))
    assert resp.status == 200, await resp.text()
    loop_thread = threading.current_thread().name
    assert where["json"] == [loop_thread] and where["prompt"] and loop_thread not in where["prompt"]


async def test_a_stream_keeps_flowing_while_a_large_body_is_prepared(make_sidecar, monkeypatch, sse):
    """A large body's validation held on its pool thread (as a slow one would be): meanwhile a
    small client's whole streamed reply arrives, and the large request then completes too."""
    release, holding = threading.Event(), threading.Event()
    parse = chat_door.parse_chat_request

    def slow_parse(body, limits):
        if threading.current_thread() is not threading.main_thread():
            holding.set()
            release.wait(10)
        return parse(body, limits)

    monkeypatch.setattr(chat_door, "parse_chat_request", slow_parse)
    client = await make_sidecar()
    large = asyncio.ensure_future(client.post("/v1/chat/completions", json=DOORS["chat content"][3](BIG_BODY)))
    for _ in range(500):
        if holding.is_set():
            break
        await asyncio.sleep(0.01)
    assert holding.is_set(), "the large body was not validated on a pool thread"
    resp = await client.post("/v1/chat/completions", json={"max_tokens": 8, "stream": True,
                                                           "messages": [{"role": "user", "content": "hi"}]})
    events = sse(await resp.read())
    assert resp.status == 200 and events[-1] == "[DONE]"
    assert not large.done() and not release.is_set()  # the large one is still being prepared
    release.set()
    assert (await large).status in (200, 400)  # 400: longer than the engine's context


@pytest.mark.parametrize("text", [BIG, "hello"])
async def test_the_errors_are_the_same_on_the_pool_and_inline(text, make_sidecar):
    client = await make_sidecar()
    # not JSON: a 400 in the door's envelope
    raw = json.dumps({"messages": [{"role": "user", "content": text}]}).encode()[:-1]
    resp = await client.post("/v1/chat/completions", data=raw, headers={"Content-Type": "application/json"})
    assert resp.status == 400 and "not valid JSON" in (await resp.json())["error"]["message"]
    resp = await client.post("/v1/messages", data=raw, headers={"Content-Type": "application/json"})
    assert resp.status == 400 and (await resp.json())["type"] == "error"
    # an unknown model and a history the conversion refuses: the model is named first (404)
    orphan = {"model": "nope", "max_tokens": 4, "messages": [
        {"role": "user", "content": text}, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "r"}]}]}
    resp = await client.post("/v1/messages", json=orphan)
    assert resp.status == 404, await resp.text()
    del orphan["model"]
    resp = await client.post("/v1/messages", json=orphan)
    assert resp.status == 400 and "tool_result" in (await resp.json())["error"]["message"]


async def test_a_prompt_many_times_too_long_is_refused_before_it_is_hashed(make_sidecar, monkeypatch):
    hashed: list[int] = []
    fingerprints = core_module.fingerprints
    monkeypatch.setattr(core_module, "fingerprints", lambda messages: hashed.append(len(messages)) or fingerprints(messages))
    client = await make_sidecar()
    args = json.dumps({"path": "a.txt", "text": "lorem ipsum dolor " * 40_000})  # ~720K characters, ~160K tokens
    body = {"max_tokens": 4, "messages": [
        {"role": "user", "content": "write it"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "w", "arguments": args}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}
    resp = await client.post("/v1/chat/completions", json=body)
    err = (await resp.json())["error"]
    assert resp.status == 400 and err["code"] == "context_length_exceeded", err
    assert hashed == []
    resp = await client.post("/v1/messages/count_tokens", json={"system": args, "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status == 400 and "more than the limit" in (await resp.json())["error"]["message"]


async def test_light_work_inline_is_bounded_per_turn_of_the_loop():
    """Ten light bodies arriving together are not all prepared inline in one turn of the loop:
    past INLINE_BUDGET the rest wait; the next turn starts the count again."""
    offload = Offload(timeout_s=10, threads=1)
    light = OFFLOAD_CHARS // 3
    assert [offload.inline(light) for _ in range(4)] == [True, True, True, False]
    assert not offload.inline(OFFLOAD_CHARS)  # a heavy one never
    await asyncio.sleep(0)
    assert offload.inline(light)
    offload.close()


async def test_light_work_past_the_budget_waits_for_the_loop_not_the_pool():
    """Ten light bodies arriving together are all prepared on the event loop, at most
    INLINE_BUDGET of them in one turn of it, with the loop's other work (the streams) between
    those turns: a light step never queues behind the pool's heavy ones."""
    offload = Offload(timeout_s=10, threads=1)
    light = OFFLOAD_CHARS // 3
    ran: list[tuple[str, int]] = []
    turn = 0

    async def count_turns():
        nonlocal turn
        while True:
            await asyncio.sleep(0)
            turn += 1

    counter = asyncio.create_task(count_turns())
    try:
        await asyncio.gather(*(offload.prepare(lambda: ran.append((threading.current_thread().name, turn)), weight=light)
                               for _ in range(10)))
    finally:
        counter.cancel()
        offload.close()
    assert {name for name, _ in ran} == {threading.current_thread().name}
    per_turn = [sum(1 for _, t in ran if t == k) for k in sorted({t for _, t in ran})]
    assert per_turn == [3, 3, 3, 1]
