"""What Codex CLI sends, accepted: ``namespace`` tools flattened into their functions (a call comes
back with its namespace, as OpenAI answers), hosted tools (``web_search``) left out with one logged
note, ``developer`` messages as system turns, ``reasoning``/``include``/``prompt_cache_key``/
``client_metadata`` ignored; and the item ``max_output_tokens`` cut is ``incomplete``."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
from openai import OpenAI
from sidecar_tools.simulator.replies import IM_END_ID, scripted_responder
from tool_agent import ids, serve_sidecar

MODEL = "Qwen/Qwen3-8B"  # the stand-in's served model
SPAWN = {"type": "function", "name": "spawn_agent", "description": "Spawn a sub-agent.", "strict": False,
         "parameters": {"type": "object", "properties": {"task": {"type": "string"}}, "required": ["task"]}}
EXEC = {"type": "function", "name": "exec_command", "description": "Run a command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
CODEX_TOOLS = [EXEC, {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.", "tools": [SPAWN]},
               {"type": "web_search", "external_web_access": False}]
CODEX_EXTRAS = dict(reasoning={"summary": "auto"}, include=["reasoning.encrypted_content"], prompt_cache_key="thread-1",
                    client_metadata={"session_id": "thread-1"}, store=False, parallel_tool_calls=True)


@pytest.fixture
def agent(sglang_double_thread, qwen3_tokenizer_dir):
    with serve_sidecar(sglang_double_thread, qwen3_tokenizer_dir) as url:
        yield url, sglang_double_thread


def _call(tokenizer, name: str, arguments: dict) -> list[int]:
    return ids(tokenizer, f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>") + [IM_END_ID]


def test_a_namespaced_function_is_offered_and_called_back_with_its_namespace(agent, qwen3_tokenizer, caplog):
    url, double = agent
    double.responder = scripted_responder(_call(qwen3_tokenizer, "spawn_agent", {"task": "look"}))
    body = {"model": MODEL, "input": [{"role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
                                      {"role": "user", "content": "spawn one"}], "tools": CODEX_TOOLS, **CODEX_EXTRAS}
    with caplog.at_level(logging.INFO, logger="sidecar.responses"):
        first = httpx.post(f"{url}/v1/responses", json=body, timeout=30)
        assert first.status_code == 200, first.text
        again = httpx.post(f"{url}/v1/responses", json={**body, "stream": True}, timeout=30)
        assert again.status_code == 200
    (call,) = first.json()["output"]
    assert (call["type"], call["name"], call["namespace"]) == ("function_call", "spawn_agent", "multi_agent_v1")
    assert json.loads(call["arguments"]) == {"task": "look"}
    done = [json.loads(line[6:]) for line in again.text.splitlines() if line.startswith("data: ")]
    streamed = [e["item"] for e in done if e["type"] == "response.output_item.done"]
    assert streamed[0]["namespace"] == "multi_agent_v1"
    notes = [r.getMessage() for r in caplog.records if "web_search" in r.getMessage()]
    assert len(notes) <= 1 and all("left out" in n for n in notes)  # noted once per process, not per request
    prompt = qwen3_tokenizer.decode(double.requests[0]["input_ids"])
    assert prompt.startswith("<|im_start|>system\nYou are Codex.")  # developer message: the system turn
    assert '"name": "spawn_agent"' in prompt and '"name": "exec_command"' in prompt and "web_search" not in prompt
    # Codex echoes the call back with its namespace: the session goes on token-exactly
    double.responder = scripted_responder(ids(qwen3_tokenizer, "spawned") + [IM_END_ID])
    follow = {**body, "input": body["input"] + [{**call, "id": call["id"]},
                                                {"type": "function_call_output", "call_id": call["call_id"], "output": "ok"}]}
    second = httpx.post(f"{url}/v1/responses", json=follow, timeout=30)
    assert second.status_code == 200, second.text
    held = double.requests[0]["input_ids"] + double.results[0]["output_ids"]
    assert double.requests[-1]["input_ids"][: len(held)] == held


def test_two_tools_of_one_name_across_namespaces_are_a_400(agent):
    url, double = agent
    tools = [EXEC, {"type": "namespace", "name": "ns", "tools": [EXEC]}]
    resp = httpx.post(f"{url}/v1/responses", json={"model": MODEL, "input": "x", "tools": tools})
    assert resp.status_code == 400 and "exec_command" in resp.json()["error"]["message"]
    assert double.requests == []


def test_the_item_cut_by_max_output_tokens_is_incomplete(agent, qwen3_tokenizer):
    url, double = agent
    double.responder = scripted_responder(ids(qwen3_tokenizer, " one two three four five six seven"))
    client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    resp = client.responses.create(model=MODEL, input="count", max_output_tokens=3)
    assert resp.status == "incomplete" and [o.status for o in resp.output] == ["incomplete"]
    events = list(client.responses.create(model=MODEL, input="count", max_output_tokens=3, stream=True))
    (done,) = [e.item for e in events if e.type == "response.output_item.done"]
    assert done.status == "incomplete" and events[-1].response.output[0].status == "incomplete"
    double.responder = scripted_responder(ids(qwen3_tokenizer, "short") + [IM_END_ID])
    whole = client.responses.create(model=MODEL, input="count", max_output_tokens=30)
    assert whole.status == "completed" and [o.status for o in whole.output] == ["completed"]
