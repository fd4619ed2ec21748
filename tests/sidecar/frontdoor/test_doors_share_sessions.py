"""One conversation core behind three front doors: an agent's history is recognised whichever door
carried each turn, because a tool call (chat ``tool_calls``, Anthropic ``tool_use``, Responses
``function_call``) and its result become the same canonical message on every door."""

from __future__ import annotations

import json

import anthropic
from openai import OpenAI
from tool_agent import READ_FILE, file_contents, read_file_responder, serve_sidecar

SYSTEM = "You are a careful coding agent."
MODEL = "Qwen/Qwen3-8B"  # the stand-in's served model (/v1/models): every door holds requests to it


def test_one_session_continues_token_exactly_across_all_three_doors(sglang_double_thread, qwen3_tokenizer_dir, qwen3_tokenizer):
    double = sglang_double_thread
    double.responder = read_file_responder(qwen3_tokenizer)
    with serve_sidecar(double, qwen3_tokenizer_dir) as url:
        chat = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        messages = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0)

        first = chat.chat.completions.create(
            model=chat.models.list().data[0].id, messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Find the bug."}],
            tools=[{"type": "function", "function": READ_FILE}],
        ).choices[0].message
        call0 = first.tool_calls[0]

        second = messages.messages.create(
            model=MODEL, system=SYSTEM, max_tokens=200,
            tools=[{"name": READ_FILE["name"], "description": READ_FILE["description"], "input_schema": READ_FILE["parameters"]}],
            messages=[
                {"role": "user", "content": "Find the bug."},
                {"role": "assistant", "content": [
                    {"type": "text", "text": first.content},
                    {"type": "tool_use", "id": call0.id, "name": "read_file", "input": json.loads(call0.function.arguments)},
                ]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call0.id, "content": file_contents("src/f0.py")}]},
            ],
        )
        text1, call1 = second.content

        third = chat.responses.create(model=MODEL, instructions=SYSTEM, tools=[{"type": "function", **READ_FILE}], input=[
            {"role": "user", "content": "Find the bug."},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": first.content}]},
            {"type": "function_call", "call_id": call0.id, "name": "read_file", "arguments": call0.function.arguments},
            {"type": "function_call_output", "call_id": call0.id, "output": file_contents("src/f0.py")},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text1.text}]},
            {"type": "function_call", "call_id": call1.id, "name": "read_file", "arguments": json.dumps(call1.input)},
            {"type": "function_call_output", "call_id": call1.id, "output": file_contents("src/f1.py")},
        ])
    assert call1.input == {"path": "src/f1.py"}
    assert json.loads(third.output[-1].arguments) == {"path": "src/f2.py"}
    assert len({r["session_id"] for r in double.requests}) == 1
    for prev, cur, out in zip(double.requests, double.requests[1:], double.results):
        held = prev["input_ids"] + out["output_ids"]
        assert cur["input_ids"][: len(held)] == held  # each door continued the engine's exact ids
    prompt2 = second.usage.input_tokens + second.usage.cache_read_input_tokens
    assert third.usage.input_tokens_details.cached_tokens >= prompt2 + second.usage.output_tokens - 1
