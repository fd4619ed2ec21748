"""The demo's model: the agent responder answers a user's turn with one well-formed tool call to a
tool the prompt offers, a tool result with a short final answer, and ends every reply with EOS;
and the simulated engine exports the plugin's lease series under the plugin's own names."""

from __future__ import annotations

import json

import aiohttp
from sidecar_tools.simulator.costmodel import load_calibration
from sidecar_tools.simulator.engine import SimEngine
from sidecar_tools.simulator.replies import AGENT_ANSWER, IM_END_ID, agent_responder, plan_reply
from sidecar_tools.simulator.server import SimServer

BASH = {"type": "function", "function": {"name": "Bash", "description": "Run a shell command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}, "timeout": {"type": "number"}}, "required": ["command"]}}}
READ = {"type": "function", "function": {"name": "Read", "description": "Read a file.", "parameters": {
    "type": "object", "properties": {"file_path": {"type": "string"}, "limit": {"type": "integer"}}, "required": ["file_path", "limit"]}}}


def _reply(tokenizer, messages, tools=None, suffix=""):
    prompt = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True) + suffix
    raw = agent_responder(tokenizer)(tokenizer.encode(prompt, add_special_tokens=False), {})
    planned, finish = plan_reply(raw, {}, 4096)
    assert finish == {"type": "stop", "matched": IM_END_ID} and len(planned) < 80  # EOS, a small budget
    return tokenizer.decode(planned[:-1])


def _call(text: str) -> dict:
    assert text.count("<tool_call>") == 1 and text.rstrip().endswith("</tool_call>")
    return json.loads(text.split("<tool_call>\n", 1)[1].split("\n</tool_call>", 1)[0])


def test_a_tool_loop_a_call_then_an_answer(qwen3_tokenizer):
    chat = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "list the files"}]
    call = _call(_reply(qwen3_tokenizer, chat, [READ, BASH]))
    assert call == {"name": "Bash", "arguments": {"command": "ls"}}  # the shell tool, where there is one
    chat += [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": call}]},
             {"role": "tool", "content": "Exit code 0\nnotes.txt"}]
    answer = _reply(qwen3_tokenizer, chat + [{"role": "system", "content": "a reminder after the result"}], [READ, BASH])
    assert answer == f"{AGENT_ANSWER} The tool said: notes.txt"
    # another user turn: another call; without a shell tool each required parameter gets a value
    chat += [{"role": "assistant", "content": answer}, {"role": "user", "content": "read it"}]
    assert _call(_reply(qwen3_tokenizer, chat, [READ])) == {"name": "Read", "arguments": {"file_path": ".", "limit": 1}}


def test_no_tools_is_an_answer_and_a_forced_call_is_completed(qwen3_tokenizer):
    chat = [{"role": "user", "content": "hi"}]
    assert _reply(qwen3_tokenizer, chat).startswith(AGENT_ANSWER)
    forced = '<tool_call>\n{"name": "Bash", "arguments": '
    rest = _reply(qwen3_tokenizer, chat, [BASH], suffix=forced)
    assert json.loads(forced.split("\n", 1)[1] + rest.split("\n</tool_call>")[0]) == {"name": "Bash", "arguments": {"command": "ls"}}


async def test_the_engine_exports_the_plugins_lease_series():
    cost, _ = load_calibration(None)
    server = SimServer(SimEngine(kv_tokens=20_000, policy="session_ttl", cost=cost), time_scale=20.0)
    url = await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            body = {"input_ids": list(range(1000, 1300)), "session_id": "s1",
                    "sampling_params": {"max_new_tokens": 4, "ignore_eos": True, "custom_params": {"session_lease_ttl_s": 30}}}
            assert (await http.post(f"{url}/generate", json=body)).status == 200
            text = await (await http.get(f"{url}/metrics")).text()
    finally:
        await server.stop()
    assert "# TYPE sglang_ext:session_lease_grants_total counter" in text
    grants = [line for line in text.splitlines() if line.startswith("sglang_ext:session_lease_grants_total{")]
    assert grants and float(grants[0].rsplit(" ", 1)[1]) >= 1
