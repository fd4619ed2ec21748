"""End to end with the official `openai` client: the agent only swaps its base URL."""

from __future__ import annotations

import json

import pytest
from openai import OpenAI
from sidecar_thread import sidecar_in_thread

from sidecar_tools.simulator.replies import IM_END_ID

from sidecar.settings import load_settings

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    }
]


@pytest.fixture
def agent(sglang_double_thread, qwen3_tokenizer_dir, qwen3_tokenizer):
    double = sglang_double_thread
    settings = load_settings(overrides={"server": {"sglang_url": double.url, "tokenizer": str(qwen3_tokenizer_dir)}})
    with sidecar_in_thread(settings) as url:
        yield OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0), double


def _served(client) -> str:
    """The model id an agent reads from /v1/models (the sidecar refuses other names)."""
    return client.models.list().data[0].id


def _agent_responder(tokenizer):
    """A model that calls read_file for three turns, then answers."""

    def respond(input_ids, params):
        turn = tokenizer.decode(input_ids).count("<tool_response>")
        if turn < 3:
            text = f'Reading.\n<tool_call>\n{{"name": "read_file", "arguments": {{"path": "src/f{turn}.py"}}}}\n</tool_call>'
        else:
            text = "The bug is in f2.py."
        return tokenizer.encode(text, add_special_tokens=False) + [IM_END_ID]

    return respond


def test_multi_turn_agent_conversation_cached_tokens_grow(agent, qwen3_tokenizer):
    client, double = agent
    double.responder = _agent_responder(qwen3_tokenizer)
    messages = [
        {"role": "system", "content": "You are a careful coding agent."},
        {"role": "user", "content": "Find the bug."},
    ]
    usages = []
    for turn in range(4):
        reply = client.chat.completions.create(model=_served(client), messages=messages, tools=TOOLS)
        choice = reply.choices[0]
        usages.append(reply.usage)
        messages.append(choice.message.model_dump(exclude_none=True))
        if choice.finish_reason != "tool_calls":
            break
        call = choice.message.tool_calls[0]
        assert call.function.name == "read_file"
        path = json.loads(call.function.arguments)["path"]
        messages.append({"role": "tool", "tool_call_id": call.id, "content": f"# contents of {path}\n" + "x = 1\n" * 50})
    assert len(usages) == 4 and choice.message.content == "The bug is in f2.py."
    cached = [u.prompt_tokens_details.cached_tokens for u in usages]
    assert cached == sorted(cached) and cached[1] > 0 and len(set(cached)) == 4
    for prev, cur in zip(usages, usages[1:]):
        # Everything the engine held after the previous turn is reused (SGLang never caches the
        # KV of the last sampled token, hence the -1).
        assert cur.prompt_tokens_details.cached_tokens >= prev.prompt_tokens + prev.completion_tokens - 1
    assert len({r["session_id"] for r in double.requests}) == 1


def test_streaming_with_tools_through_openai_client(agent, qwen3_tokenizer):
    client, double = agent
    double.responder = _agent_responder(qwen3_tokenizer)
    stream = client.chat.completions.create(
        model=_served(client),
        messages=[{"role": "user", "content": "Find the bug."}],
        tools=TOOLS,
        tool_choice="auto",
        stream=True,
        stream_options={"include_usage": True},
    )
    content, args, name, finish, usage = "", "", None, None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                name = call.function.name or name
                args += call.function.arguments or ""
            finish = choice.finish_reason or finish
    assert content == "Reading."
    assert name == "read_file" and json.loads(args) == {"path": "src/f0.py"}
    assert finish == "tool_calls"
    assert usage.completion_tokens > 0 and usage.prompt_tokens == len(double.requests[0]["input_ids"])


def test_openai_client_sees_clean_errors(agent):
    client, _ = agent
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=_served(client), messages=[{"role": "user", "content": "x"}], n=3)
    assert "n=1" in info.value.message
    with pytest.raises(openai.NotFoundError) as info:  # as OpenAI answers a model it does not serve
        client.chat.completions.create(model="gpt-nonexistent", messages=[{"role": "user", "content": "x"}])
    assert info.value.code == "model_not_found" and info.value.param == "model"
