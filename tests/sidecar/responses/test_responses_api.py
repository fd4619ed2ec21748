"""/v1/responses end to end with the official `openai` client (what Codex CLI and the OpenAI Agents
SDK speak): stateless use, the whole conversation as ``input`` each turn, recognised as one session
and continued token-exactly as on the chat-completions door."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from openai import OpenAI
from sidecar_tools.simulator.replies import scripted_responder
from tool_agent import ANSWER, READ_FILE, file_contents, ids, read_file_responder, says, serve_sidecar

TOOLS = [{"type": "function", **READ_FILE}]
SYSTEM = "You are a careful coding agent."
MODEL = "Qwen/Qwen3-8B"  # the stand-in's served model (/v1/models): every door holds requests to it


@pytest.fixture
def agent(sglang_double_thread, qwen3_tokenizer_dir):
    with serve_sidecar(sglang_double_thread, qwen3_tokenizer_dir) as url:
        yield OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0), sglang_double_thread, url



def test_plain_response_with_usage_and_sampling(agent, qwen3_tokenizer):
    client, double, _ = agent
    double.responder = says(qwen3_tokenizer, "Hello there!")
    resp = client.responses.create(
        model=MODEL, instructions=SYSTEM, input="hi", max_output_tokens=20, temperature=0.5, top_p=0.9, store=False,
        metadata={"run": "7"},
    )
    assert resp.object == "response" and resp.id.startswith("resp_") and resp.status == "completed"
    assert resp.output_text == "Hello there!"
    (item,) = resp.output
    assert item.type == "message" and item.role == "assistant" and item.status == "completed"
    sent = double.requests[0]
    assert resp.usage.input_tokens == len(sent["input_ids"])
    assert resp.usage.input_tokens_details.cached_tokens >= 0
    assert resp.usage.output_tokens == len(ids(qwen3_tokenizer, "Hello there!")) + 1
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens
    assert resp.instructions == SYSTEM and resp.metadata == {"run": "7"} and resp.max_output_tokens == 20
    assert qwen3_tokenizer.decode(sent["input_ids"]).startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nhi")
    params = sent["sampling_params"]
    assert (params["max_new_tokens"], params["temperature"], params["top_p"]) == (20, 0.5, 0.9)


def test_stream_is_the_responses_event_sequence(agent, qwen3_tokenizer):
    client, double, _ = agent
    double.responder = read_file_responder(qwen3_tokenizer)
    events = list(client.responses.create(model=MODEL, input="Find the bug.", tools=TOOLS, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert [k for k in kinds if not k.endswith(".delta")] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.done", "response.output_item.done",
        "response.completed",
    ]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Reading."
    arguments = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(arguments) == {"path": "src/f0.py"}
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [(e.output_index, e.item.type, e.item.status) for e in added] == [(0, "message", "in_progress"), (1, "function_call", "in_progress")]
    done = events[-1].response
    assert done.status == "completed" and [i.type for i in done.output] == ["message", "function_call"]
    call = done.output[1]
    assert call.name == "read_file" and call.call_id.startswith("call_") and call.arguments == arguments
    assert {e.item_id for e in events if hasattr(e, "item_id")} == {i.id for i in done.output}
    assert done.usage.input_tokens == len(double.requests[0]["input_ids"]) and done.usage.output_tokens > 0
    assert events[0].response.status == "in_progress" and events[0].response.output == []


def test_function_call_round_trips_are_one_session_whose_cache_grows(agent, qwen3_tokenizer):
    """As the Agents SDK does: echo the output items, append function_call_output items."""
    client, double, _ = agent
    double.responder = read_file_responder(qwen3_tokenizer)
    items: list = [{"role": "user", "content": "Find the bug."}]
    usages = []
    for turn in range(4):
        args = dict(model=MODEL, instructions=SYSTEM, input=items, tools=TOOLS)
        if turn % 2:
            with client.responses.stream(**args) as stream:
                resp = stream.get_final_response()
        else:
            resp = client.responses.create(**args)
        usages.append(resp.usage)
        items += [item.model_dump(exclude_none=True) for item in resp.output]
        calls = [item for item in resp.output if item.type == "function_call"]
        if not calls:
            break
        (call,) = calls
        path = json.loads(call.arguments)["path"]
        assert call.name == "read_file" and path == f"src/f{turn}.py"
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": file_contents(path)})
    assert len(usages) == 4 and resp.output_text == ANSWER
    assert len({r["session_id"] for r in double.requests}) == 1
    for prev, cur in zip(usages, usages[1:]):
        assert cur.input_tokens_details.cached_tokens >= prev.input_tokens + prev.output_tokens - 1
    for prev, cur, out in zip(double.requests, double.requests[1:], double.results):
        held = prev["input_ids"] + out["output_ids"]
        assert cur["input_ids"][: len(held)] == held


def test_a_reply_cut_by_max_output_tokens_is_incomplete(agent, qwen3_tokenizer):
    client, double, _ = agent
    double.responder = scripted_responder(ids(qwen3_tokenizer, " one two three four five six seven"))
    resp = client.responses.create(model=MODEL, input="count", max_output_tokens=3)
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    events = list(client.responses.create(model=MODEL, input="count", max_output_tokens=3, stream=True))
    assert events[-1].type == "response.incomplete" and events[-1].response.incomplete_details.reason == "max_output_tokens"


REFUSED = [
    (dict(input="x", store=True), "store=true is not supported"),
    (dict(input="x", previous_response_id="resp_123"), "previous_response_id is not supported"),
    (dict(input="x", extra_body={"conversation": "conv_1"}), "conversation is not supported"),
    (dict(input=[{"type": "function_call_output", "call_id": "call_nobody", "output": "x"}]), "input.0: function_call_output answers 'call_nobody'"),
    (dict(input=[{"type": "reasoning", "id": "rs_1", "summary": []}]), "input item 0 has type 'reasoning'"),
    (dict(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]), "content part 0 has type 'input_image'"),
    (dict(input="x", tools=[{"type": "custom", "name": "apply_patch"}]), "tool 0 has type 'custom'"),
    (dict(input="x", tools=TOOLS, tool_choice={"type": "function", "name": "nope"}), "unknown tool 'nope'"),
    (dict(input="x", text={"format": {"type": "json_schema", "name": "s", "schema": {}}}), "text.format"),
    (dict(input=[{"type": "function_call", "call_id": "c", "name": "read_file"}]), "input.0.arguments: Field required"),
]


def test_bad_input_is_a_400_in_openais_envelope_and_the_session_goes_on(agent, qwen3_tokenizer):
    client, double, url = agent
    double.responder = says(qwen3_tokenizer, "first", "second")
    items: list = [{"role": "user", "content": "start"}]
    first = client.responses.create(model=MODEL, input=items)
    items += [i.model_dump(exclude_none=True) for i in first.output]
    for args, words in REFUSED:
        with pytest.raises(openai.BadRequestError) as info:
            client.responses.create(model=MODEL, **args)
        assert info.value.body["type"] == "invalid_request_error" and words in info.value.body["message"], (args, info.value.body)
    broken = items + [{"type": "function_call_output", "call_id": "call_x", "output": "late"}]
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, input=broken)
    raw = httpx.post(f"{url}/v1/responses", content=b'{"input": [', headers={"content-type": "application/json"})
    assert raw.status_code == 400 and "not valid JSON" in raw.json()["error"]["message"]
    assert len(double.requests) == 1  # nothing reached the engine

    second = client.responses.create(model=MODEL, input=items + [{"role": "user", "content": "go on"}])
    assert second.output_text == "second"
    held = double.requests[0]["input_ids"] + double.results[0]["output_ids"]
    assert double.requests[1]["input_ids"][: len(held)] == held and double.requests[1]["session_id"] == double.requests[0]["session_id"]


def test_engine_failure_mid_stream_is_an_error_event_then_response_failed(agent, qwen3_tokenizer):
    client, double, _ = agent
    double.faults.drop_next, double.faults.drop_after_tokens = 1, 3
    double.responder = scripted_responder(ids(qwen3_tokenizer, " a b c d e f g h"))
    events = list(client.responses.create(model=MODEL, input="x", stream=True))
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2].code == "engine_unavailable" and events[-1].response.status == "failed"
    assert events[-1].response.error.message == events[-2].message
    double.faults.fail_next, double.faults.fail_status = 1, 503
    with pytest.raises(openai.InternalServerError) as info:
        client.responses.create(model=MODEL, input="x")
    assert info.value.status_code == 503 and info.value.body["code"] == "engine_overloaded"
