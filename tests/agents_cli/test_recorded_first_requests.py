"""The first request of each published agent CLI, recorded from the real client (Claude Code
2.1.332, Codex CLI 0.171.0; ``fixtures/``), must keep passing: sent as recorded to the sidecar in
front of the simulated engine with the demo's agent model, each is a 200 whose stream ends as the
client expects, with a tool call to a tool the client offered. What the sidecar made of the
request is checked on the prompt the engine received (the ids it was sent)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from sidecar_tools.simulator.replies import agent_responder
from sidecar_tools.simulator.standin import SGLangStandIn, run_in_thread
from tool_agent import serve_sidecar

FIXTURES = Path(__file__).parent / "fixtures"
CLAUDE_CODE = json.loads((FIXTURES / "claude-code-2.1.332-first-request.json").read_text())
CODEX = json.loads((FIXTURES / "codex-0.171.0-first-request.json").read_text())
SERVED = "simulated-qwen3-8b"  # the demo's model id, which both recordings name


@pytest.fixture
def demo_like(qwen3_tokenizer, qwen3_tokenizer_dir):
    """The stand-in engine answering as the demo's agent model, the sidecar in front; (url, engine)."""
    # the demo engine's context (131,072): Claude Code asks for max_tokens 32,000 on top of ~11.6K prompt tokens
    engine = SGLangStandIn(served_model_name=SERVED, responder=agent_responder(qwen3_tokenizer), context_length=131_072)
    with run_in_thread(engine), serve_sidecar(engine, qwen3_tokenizer_dir) as url:
        yield url, engine


def _events(response: httpx.Response) -> list[dict]:
    return [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]


def _send(url: str, recorded: dict) -> httpx.Response:
    headers = {**recorded["headers"], "content-type": "application/json", "authorization": "Bearer k"}
    return httpx.post(url + recorded["path"], json=recorded["body"], headers=headers, timeout=60)


def test_claude_codes_first_request_is_answered_with_a_tool_call(demo_like, qwen3_tokenizer):
    url, engine = demo_like
    body = CLAUDE_CODE["body"]
    assert any(m["role"] == "system" for m in body["messages"])  # the beta that used to be a 400
    assert {"thinking", "context_management", "output_config", "metadata"} <= set(body)
    reply = _send(url, CLAUDE_CODE)
    assert reply.status_code == 200, reply.text
    events = _events(reply)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert events[0]["message"]["usage"]["output_tokens"] == 1  # the final count comes in message_delta
    (start,) = [e["content_block"] for e in events if e["type"] == "content_block_start" and e["content_block"]["type"] == "tool_use"]
    assert start["name"] in {t["name"] for t in body["tools"]}
    delta = next(e for e in events if e["type"] == "message_delta")
    assert delta["delta"]["stop_reason"] == "tool_use" and delta["usage"]["output_tokens"] > 1
    prompt = qwen3_tokenizer.decode(engine.requests[-1]["input_ids"])
    # the mid-conversation system message is a system turn where Claude Code put it: after the user's
    user_at, system_at = prompt.rindex("list the files here"), prompt.rindex("<|im_start|>system\n# Environment")
    assert user_at < system_at


def test_codexs_first_request_is_answered_with_a_tool_call(demo_like, qwen3_tokenizer):
    url, engine = demo_like
    body = CODEX["body"]
    kinds = {t["type"] for t in body["tools"]}
    assert {"namespace", "web_search"} <= kinds  # the two that used to be 400s
    reply = _send(url, CODEX)
    assert reply.status_code == 200, reply.text
    events = _events(reply)
    assert events[0]["type"] == "response.created" and events[-1]["type"] == "response.completed"
    calls = [e["item"] for e in events if e["type"] == "response.output_item.done" and e["item"]["type"] == "function_call"]
    assert [c["name"] for c in calls] == ["exec_command"] and json.loads(calls[0]["arguments"]) == {"cmd": "ls"}
    final = events[-1]["response"]
    assert [t["type"] for t in final["tools"]].count("web_search") == 0  # left out, not echoed as offered
    prompt = qwen3_tokenizer.decode(engine.requests[-1]["input_ids"])
    namespaced = [t["name"] for t in body["tools"] if t["type"] == "namespace" for t in t["tools"]]
    assert namespaced and all(f'"name": "{name}"' in prompt for name in namespaced)  # flattened into functions
    assert '"web_search"' not in prompt
    developer = body["input"][0]["content"][0]["text"]
    assert developer[:200] in prompt  # developer messages are system turns
