"""Hostile input on the Anthropic and Responses doors, fuzzed with hypothesis. For every body:
never a 5xx; an error is that API's own envelope, a reply that API's shape, a stream that API's
event sequence (each ``event:`` naming its payload's type, Responses' sequence numbers in order);
and afterwards nothing is left in flight and a canary session still continues token-exactly."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hostile_values import json_values, numbers, plain, texts
from tool_agent import says, serve_sidecar

FUZZ = settings(
    max_examples=60, deadline=None, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
ANTHROPIC_ERRORS = {"invalid_request_error", "authentication_error", "not_found_error", "request_too_large",
                    "rate_limit_error", "overloaded_error", "timeout_error", "api_error"}


@pytest.fixture
def door(sglang_double_thread, qwen3_tokenizer_dir, qwen3_tokenizer):
    double = sglang_double_thread
    double.responder = says(qwen3_tokenizer, "fine")
    with serve_sidecar(double, qwen3_tokenizer_dir, max_body_bytes=64 * 1024, max_messages=12, max_prompt_tokens=3000,
                       default_max_tokens=16, request_timeout=10) as url:
        with httpx.Client(base_url=url, timeout=20) as http:
            yield http, double


def _post(http: httpx.Client, path: str, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    data = json.dumps(body, allow_nan=True).encode()  # NaN/Infinity literals too
    return http.post(path, content=data, headers={"content-type": "application/json", **(headers or {})})


def _events(raw: str) -> list[tuple[str, dict]]:
    """(event name, payload) of each SSE event; lines end at LF only, as SSE says."""
    out = []
    for block in raw.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n") if line)
        if fields:
            out.append((fields["event"], json.loads(fields["data"])))
    return out


def check_messages_answer(resp: httpx.Response) -> None:
    event(f"HTTP {resp.status_code}")
    assert resp.status_code < 500, resp.text[:500]
    if resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream"):
        events = _events(resp.text)
        assert all(name == data["type"] for name, data in events)
        kinds = [name for name, _ in events]
        assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], kinds
        return
    body = resp.json()
    if resp.status_code == 200:
        assert body["type"] == "message" and body["role"] == "assistant" and body["stop_reason"]
        return
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] in ANTHROPIC_ERRORS and body["error"]["message"]


def check_responses_answer(resp: httpx.Response) -> None:
    event(f"HTTP {resp.status_code}")
    assert resp.status_code < 500, resp.text[:500]
    if resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream"):
        events = _events(resp.text)
        assert all(name == data["type"] for name, data in events)
        assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
        assert events[0][0] == "response.created" and events[-1][0] in ("response.completed", "response.incomplete")
        return
    body = resp.json()
    if resp.status_code == 200:
        assert body["object"] == "response" and body["status"] in ("completed", "incomplete")
        return
    assert body["error"]["message"] and body["error"]["type"] != "server_error"


def check_nothing_in_flight(http: httpx.Client) -> None:
    assert all(s["state"] != "generating" for s in http.get("/v1/sessions").json()["data"])


# --------------------------------------------------------------------------- strategies

def _blocks(types: list[str]):
    return st.fixed_dictionaries({"type": st.sampled_from(types)}, optional={
        "text": texts, "id": texts, "name": texts, "input": json_values, "tool_use_id": texts,
        "content": st.one_of(texts, json_values), "is_error": json_values, "source": json_values, "cache_control": json_values,
    })


BLOCK_TYPES = ["text", "tool_use", "tool_result", "image", "thinking", "document", "", "TEXT"]
anthropic_bodies = st.fixed_dictionaries(
    {"messages": st.one_of(st.lists(st.fixed_dictionaries({
        "role": st.sampled_from(["user", "assistant", "system", "tool", ""]),
        "content": st.one_of(texts, st.lists(_blocks(BLOCK_TYPES), max_size=3), json_values),
    }), min_size=1, max_size=4), json_values), "max_tokens": st.one_of(st.integers(1, 16), numbers)},
    optional={
        "system": st.one_of(texts, st.lists(_blocks(["text", "image"]), max_size=2), json_values),
        "tools": st.one_of(st.lists(st.fixed_dictionaries({"name": texts, "input_schema": json_values},
                                                          optional={"type": texts, "description": texts}), max_size=2), json_values),
        "tool_choice": st.one_of(st.fixed_dictionaries({"type": st.sampled_from(["auto", "any", "tool", "none", "x"])},
                                                       optional={"name": texts}), json_values),
        "temperature": numbers, "top_p": numbers, "top_k": numbers,
        "stop_sequences": st.one_of(st.lists(texts, max_size=2), json_values),
        "stream": st.one_of(st.booleans(), json_values), "metadata": json_values, "ignore_eos": json_values, "thinking": json_values,
    },
)

ITEM_TYPES = ["message", "function_call", "function_call_output", "reasoning", "item_reference", "", "web_search_call"]
responses_bodies = st.fixed_dictionaries(
    {"input": st.one_of(texts, st.lists(st.fixed_dictionaries({}, optional={
        "type": st.sampled_from(ITEM_TYPES), "role": st.sampled_from(["user", "assistant", "system", "developer", "tool"]),
        "content": st.one_of(texts, st.lists(st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text", "input_image"]),
                                                                     "text": texts}), max_size=2), json_values),
        "call_id": texts, "name": texts, "arguments": st.one_of(texts, json_values), "output": st.one_of(texts, json_values),
    }), max_size=4), json_values)},
    optional={
        "instructions": st.one_of(texts, json_values), "max_output_tokens": st.one_of(st.integers(1, 16), numbers),
        "tools": st.one_of(st.lists(st.fixed_dictionaries({"type": st.sampled_from(["function", "custom", "web_search"]), "name": texts},
                                                          optional={"parameters": json_values}), max_size=2), json_values),
        "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required", "any"]), json_values),
        "temperature": numbers, "top_p": numbers, "stream": st.one_of(st.booleans(), json_values),
        "store": json_values, "previous_response_id": json_values, "text": json_values, "metadata": json_values,
        "reasoning": json_values, "include": json_values,
    },
)

names = st.from_regex(r"[a-z_][a-z0-9_]{0,11}", fullmatch=True)
inputs = st.dictionaries(names, st.one_of(plain, st.integers()), max_size=2)


@st.composite
def anthropic_conversations(draw):
    """Well-formed histories with hostile text: past validation into rendering, matching and the relay."""
    messages: list[dict] = [{"role": "user", "content": draw(plain)}]
    for _ in range(draw(st.integers(0, 2))):
        calls = [{"type": "tool_use", "id": f"toolu_{n}{draw(names)}", "name": draw(names), "input": draw(inputs)}
                 for n in range(draw(st.integers(0, 2)))]
        messages.append({"role": "assistant", "content": [{"type": "text", "text": draw(plain)}] + calls})
        results = [{"type": "tool_result", "tool_use_id": c["id"], "content": draw(plain)} for c in calls]
        messages.append({"role": "user", "content": results + [{"type": "text", "text": draw(plain)}]})
    body = {"messages": messages, "max_tokens": draw(st.integers(1, 16)), "stream": draw(st.booleans())}
    if draw(st.booleans()):
        body["system"] = draw(plain)
    if draw(st.booleans()):
        body["stop_sequences"] = draw(st.lists(plain, min_size=1, max_size=2))
    if draw(st.booleans()):
        body["tools"] = [{"name": "read_file", "input_schema": {"type": "object"}}]
        body["tool_choice"] = draw(st.sampled_from([{"type": "auto"}, {"type": "any"}, {"type": "none"}, {"type": "tool", "name": "read_file"}]))
    return body


@st.composite
def responses_inputs(draw):
    items: list[dict] = [{"role": "user", "content": draw(plain)}]
    for _ in range(draw(st.integers(0, 2))):
        items.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": draw(plain)}]})
        for n in range(draw(st.integers(0, 2))):
            call_id = f"call_{n}{draw(names)}"
            items.append({"type": "function_call", "call_id": call_id, "name": draw(names), "arguments": json.dumps(draw(inputs))})
            items.append({"type": "function_call_output", "call_id": call_id, "output": draw(plain)})
        items.append({"role": draw(st.sampled_from(["user", "developer"])), "content": [{"type": "input_text", "text": draw(plain)}]})
    body = {"input": items, "max_output_tokens": draw(st.integers(1, 16)), "stream": draw(st.booleans())}
    if draw(st.booleans()):
        body["instructions"] = draw(plain)
    if draw(st.booleans()):
        body["tools"] = [{"type": "function", "name": "read_file", "parameters": {"type": "object"}}]
        body["tool_choice"] = draw(st.sampled_from(["auto", "none", "required", {"type": "function", "name": "read_file"}]))
    return body


# --------------------------------------------------------------------------- fuzz


def _canary(http: httpx.Client, double) -> tuple[list, list]:
    messages = [{"role": "user", "content": "canary task"}]
    reply = _post(http, "/v1/messages", {"messages": messages, "max_tokens": 8}, {"X-Session-Id": "canary"}).json()
    return messages + [{"role": "assistant", "content": reply["content"]}], double.requests[-1]["input_ids"] + double.results[-1]["output_ids"]


def _canary_continues(http: httpx.Client, double, messages: list, held: list) -> None:
    body = {"messages": messages + [{"role": "user", "content": "still there?"}], "max_tokens": 8}
    assert _post(http, "/v1/messages", body, {"X-Session-Id": "canary"}).status_code == 200
    assert double.requests[-1]["input_ids"][: len(held)] == held


def _fuzz(door, path: str, bodies, check) -> None:
    """Every fuzzed body answers as ``check`` demands; then nothing is in flight and the canary goes on."""
    http, double = door
    canary = _canary(http, double)

    @FUZZ
    @given(body=bodies)
    def fuzz(body):
        check(_post(http, path, body))

    fuzz()
    check_nothing_in_flight(http)
    _canary_continues(http, double, *canary)


def test_fuzzed_messages_bodies(door):
    _fuzz(door, "/v1/messages", st.one_of(anthropic_bodies, anthropic_conversations()), check_messages_answer)


def test_fuzzed_responses_bodies(door):
    _fuzz(door, "/v1/responses", st.one_of(responses_bodies, responses_inputs()), check_responses_answer)
