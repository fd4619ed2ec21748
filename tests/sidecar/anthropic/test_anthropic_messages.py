"""/v1/messages end to end with the official `anthropic` client: an agent that speaks Anthropic's
Messages API (Claude Code's wire format) only swaps its base URL, and its turns are one session
continued token-exactly, as on the chat-completions door."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest
from sidecar_tools.simulator.replies import scripted_responder
from tool_agent import ANSWER, READ_FILE, file_contents, ids, read_file_responder, says, serve_sidecar

TOOLS = [{"name": READ_FILE["name"], "description": READ_FILE["description"], "input_schema": READ_FILE["parameters"]}]
SYSTEM = "You are a careful coding agent."
MODEL = "Qwen/Qwen3-8B"  # the stand-in's served model (/v1/models): every door holds requests to it


@pytest.fixture
def agent(sglang_double_thread, qwen3_tokenizer_dir):
    with serve_sidecar(sglang_double_thread, qwen3_tokenizer_dir) as url:
        yield anthropic.Anthropic(base_url=url, api_key="none", max_retries=0), sglang_double_thread, url



def test_plain_message_with_usage_and_sampling(agent, qwen3_tokenizer):
    client, double, _ = agent
    double.responder = says(qwen3_tokenizer, "Hello there!")
    # anthropic 2.x no longer names the sampling fields; clients that send them (Claude Code sends
    # temperature) still get them honoured
    msg = client.messages.create(
        model=MODEL, system=SYSTEM, max_tokens=20, messages=[{"role": "user", "content": "hi"}],
        extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 40},
    )
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert [b.model_dump(exclude_none=True) for b in msg.content] == [{"type": "text", "text": "Hello there!"}]
    assert msg.stop_reason == "end_turn" and msg.stop_sequence is None
    sent = double.requests[0]
    # Anthropic's accounting: input + cache reads = the prompt the engine got
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == len(sent["input_ids"])
    assert msg.usage.output_tokens == len(ids(qwen3_tokenizer, "Hello there!")) + 1
    assert qwen3_tokenizer.decode(sent["input_ids"]).startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nhi")
    params = sent["sampling_params"]
    assert (params["max_new_tokens"], params["temperature"], params["top_p"], params["top_k"]) == (20, 0.5, 0.9, 40)


def test_stream_is_anthropics_event_sequence(agent, qwen3_tokenizer):
    client, double, _ = agent
    double.responder = read_file_responder(qwen3_tokenizer)
    events = list(client.messages.create(
        model=MODEL, max_tokens=100, tools=TOOLS, stream=True, messages=[{"role": "user", "content": "Find the bug."}]
    ))
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    blocks = [e.content_block for e in events if e.type == "content_block_start"]
    assert [b.type for b in blocks] == ["text", "tool_use"] and blocks[1].name == "read_file"
    # every block opens, gets its deltas, and closes before the next opens
    assert [k for k in kinds if k != "content_block_delta"] == [
        "message_start", "content_block_start", "content_block_stop", "content_block_start", "content_block_stop",
        "message_delta", "message_stop",
    ]
    deltas = [e for e in events if e.type == "content_block_delta"]
    assert "".join(d.delta.text for d in deltas if d.index == 0) == "Reading."
    assert json.loads("".join(d.delta.partial_json for d in deltas if d.index == 1)) == {"path": "src/f0.py"}
    assert {d.delta.type for d in deltas} == {"text_delta", "input_json_delta"}
    end = events[-2]
    assert end.delta.stop_reason == "tool_use"
    assert end.usage.output_tokens > 0
    assert end.usage.input_tokens + end.usage.cache_read_input_tokens == len(double.requests[0]["input_ids"])
    head = events[0].message
    assert head.stop_reason is None and head.content == [] and head.usage.output_tokens <= end.usage.output_tokens


def test_tool_use_round_trips_are_one_session_whose_cache_grows(agent, qwen3_tokenizer):
    """Streamed and whole replies alternate; each echoed reply is recognised as the sidecar's."""
    client, double, _ = agent
    double.responder = read_file_responder(qwen3_tokenizer)
    messages = [{"role": "user", "content": "Find the bug."}]
    usages = []
    for turn in range(4):
        args = dict(model=MODEL, system=SYSTEM, max_tokens=200, tools=TOOLS, messages=messages)
        if turn % 2:
            with client.messages.stream(**args) as stream:
                reply = stream.get_final_message()
        else:
            reply = client.messages.create(**args)
        usages.append(reply.usage)
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
        if reply.stop_reason != "tool_use":
            break
        (call,) = [b for b in reply.content if b.type == "tool_use"]
        assert call.name == "read_file" and call.input == {"path": f"src/f{turn}.py"}
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call.id, "content": [{"type": "text", "text": file_contents(call.input["path"])}]},
        ]})
    assert len(usages) == 4 and reply.content[0].text == ANSWER
    assert len({r["session_id"] for r in double.requests}) == 1
    for prev, cur in zip(usages, usages[1:]):
        prompt = prev.input_tokens + prev.cache_read_input_tokens
        # everything the engine held after the previous turn is reused (SGLang never caches the
        # KV of the last sampled token, hence the -1)
        assert cur.cache_read_input_tokens >= prompt + prev.output_tokens - 1
    for prev, cur, out in zip(double.requests, double.requests[1:], double.results):
        held = prev["input_ids"] + out["output_ids"]
        assert cur["input_ids"][: len(held)] == held  # token-exact continuation


def test_stop_sequences_and_tool_choice(agent, qwen3_tokenizer):
    client, double, _ = agent
    double.responder = says(qwen3_tokenizer, "abc END def")
    msg = client.messages.create(model=MODEL, max_tokens=20, stop_sequences=["END"], messages=[{"role": "user", "content": "x"}])
    assert msg.content[0].text == "abc " and msg.stop_reason == "stop_sequence" and msg.stop_sequence == "END"

    ask = dict(model=MODEL, max_tokens=50, tools=TOOLS, messages=[{"role": "user", "content": "y"}])
    double.responder = says(qwen3_tokenizer, '{"path": "src/a.py"}}\n</tool_call>')
    msg = client.messages.create(**ask, tool_choice={"type": "tool", "name": "read_file"})
    assert qwen3_tokenizer.decode(double.requests[-1]["input_ids"]).endswith('<tool_call>\n{"name": "read_file", "arguments": ')
    assert msg.stop_reason == "tool_use" and msg.content[0].input == {"path": "src/a.py"}

    double.responder = says(qwen3_tokenizer, '{"name": "read_file", "arguments": {"path": "b"}}\n</tool_call>')
    msg = client.messages.create(**ask, tool_choice={"type": "any"})
    assert qwen3_tokenizer.decode(double.requests[-1]["input_ids"]).endswith("<tool_call>\n")
    assert msg.content[0].name == "read_file"

    text = '<tool_call>\n{"name": "read_file", "arguments": {"path": "c"}}\n</tool_call>'
    double.responder = says(qwen3_tokenizer, text)
    msg = client.messages.create(**ask, tool_choice={"type": "none"})
    assert msg.stop_reason == "end_turn" and msg.content[0].text == text  # no call parsed


def test_count_tokens_is_the_prompt_a_new_session_sends(agent, qwen3_tokenizer):
    client, double, _ = agent
    double.responder = says(qwen3_tokenizer, "ok")
    ask = dict(model=MODEL, system=SYSTEM, tools=TOOLS, messages=[{"role": "user", "content": "count me"}])
    counted = client.messages.count_tokens(**ask)
    client.messages.create(max_tokens=5, **ask)
    assert counted.input_tokens == len(double.requests[0]["input_ids"])
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}])
    assert info.value.body["error"]["type"] == "invalid_request_error"


BAD_TURNS = {
    "a text block without text": ([{"type": "text"}], "messages.2.content.0.text"),
    "a tool_result without its tool_use": (
        [{"type": "tool_result", "tool_use_id": "toolu_nobody", "content": "x"}],
        "answers 'toolu_nobody', which is not a tool_use",
    ),
    "an unknown block type": ([{"type": "image", "source": {"type": "base64", "data": "", "media_type": "image/png"}}], "type 'image'"),
    "a server tool's block": ([{"type": "web_search_tool_result", "tool_use_id": "x", "content": []}], "supported: text, tool_result"),
}


@pytest.mark.parametrize("case", sorted(BAD_TURNS))
def test_bad_input_is_a_400_in_anthropics_envelope_and_the_session_goes_on(agent, qwen3_tokenizer, case):
    client, double, url = agent
    double.responder = says(qwen3_tokenizer, "first", "second")
    messages = [{"role": "user", "content": "start"}]
    first = client.messages.create(model=MODEL, max_tokens=20, messages=messages)
    messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]})

    content, words = BAD_TURNS[case]
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model=MODEL, max_tokens=20, messages=messages + [{"role": "user", "content": content}])
    assert info.value.status_code == 400
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "invalid_request_error"
    assert words in info.value.body["error"]["message"]
    assert len(double.requests) == 1  # nothing reached the engine

    second = client.messages.create(model=MODEL, max_tokens=20, messages=messages + [{"role": "user", "content": "go on"}])
    assert second.content[0].text == "second"
    held = double.requests[0]["input_ids"] + double.results[0]["output_ids"]
    assert double.requests[1]["input_ids"][: len(held)] == held and double.requests[1]["session_id"] == double.requests[0]["session_id"]


def test_refusals_name_what_is_wrong(agent):
    client, _, url = agent
    ask = dict(model=MODEL, max_tokens=20)
    cases = [
        (dict(messages=[{"role": "user", "content": "x"}, {"role": "assistant", "content": "The answer is"}]), "prefill"),
        (dict(messages=[{"role": "user", "content": "x"}], tools=TOOLS, tool_choice={"type": "tool", "name": "nope"}), "unknown tool 'nope'"),
        (dict(messages=[{"role": "user", "content": "x"}], tools=[{"type": "bash_20250124", "name": "bash"}]), "tools.0"),
        (dict(messages=[{"role": "user", "content": "x"}], extra_body={"temperature": 1.5}), "temperature"),
        (dict(messages=[{"role": "tool", "content": "x"}]), "messages.0"),
    ]
    for args, words in cases:
        with pytest.raises(anthropic.BadRequestError) as info:
            client.messages.create(**{**ask, **args})
        assert words in info.value.body["error"]["message"], (args, info.value.body)
    raw = httpx.post(f"{url}/v1/messages", content=b'{"model": "Qwen/Qwen3-8B", "max_tokens": ', headers={"content-type": "application/json"})
    assert raw.status_code == 400
    assert raw.json()["type"] == "error" and "not valid JSON" in raw.json()["error"]["message"]
    missing = httpx.post(f"{url}/v1/messages", json={"messages": [{"role": "user", "content": "x"}]})
    assert missing.status_code == 400 and "max_tokens" in missing.json()["error"]["message"]


def test_engine_failures_keep_anthropics_envelope(agent, qwen3_tokenizer):
    client, double, _ = agent
    ask = dict(model=MODEL, max_tokens=20, messages=[{"role": "user", "content": "x"}])
    double.faults.fail_next, double.faults.fail_status = 1, 503
    with pytest.raises(anthropic.APIStatusError) as info:
        client.messages.create(**ask)
    assert info.value.status_code == 503 and info.value.body["error"]["type"] == "overloaded_error"

    double.faults.drop_next, double.faults.drop_after_tokens = 1, 3
    double.responder = scripted_responder(ids(qwen3_tokenizer, " a b c d e f g h"))
    with pytest.raises(anthropic.APIStatusError) as info:  # raised by the SDK on Anthropic's `event: error`
        for _ in client.messages.create(**ask, stream=True):
            pass
    assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "overloaded_error"


def test_api_keys_through_x_api_key_or_bearer(sglang_double_thread, qwen3_tokenizer_dir, qwen3_tokenizer):
    double = sglang_double_thread
    double.responder = says(qwen3_tokenizer, "ok")
    ask = dict(model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "x"}])
    with serve_sidecar(double, qwen3_tokenizer_dir, api_key="sk-door") as url:
        assert anthropic.Anthropic(base_url=url, api_key="sk-door", max_retries=0).messages.create(**ask).content[0].text == "ok"
        assert anthropic.Anthropic(base_url=url, auth_token="sk-door", max_retries=0).messages.create(**ask).content[0].text == "ok"
        with pytest.raises(anthropic.AuthenticationError) as info:
            anthropic.Anthropic(base_url=url, api_key="sk-wrong", max_retries=0).messages.create(**ask)
        assert info.value.body == {"type": "error", "error": {"type": "authentication_error", "message": "invalid API key"}}
        assert httpx.post(f"{url}/v1/messages", json=ask).json()["error"]["type"] == "authentication_error"
