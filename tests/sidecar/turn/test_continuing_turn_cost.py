"""A continuing turn pays for what is new: it hashes and tokenizes only the messages appended since
its session's last turn (and its own reply), whatever the length of the history before them; an
edited history is still noticed and rendered whole."""

from __future__ import annotations

import aiohttp
import pytest
from pydantic_core import from_json
from sidecar_tools.simulator.replies import IM_END_ID, scripted_responder

import sidecar.conversation.fingerprint as fingerprint_module
import sidecar.conversation.store as store_module
from sidecar.engine.capacity import EngineCapacity
from sidecar.engine.client import EngineClient
from sidecar.engine.worker import Worker, Workers
from sidecar.generation.tool_parsers import ContentDelta
from sidecar.metrics import SidecarMetrics
from sidecar.settings import load_settings
from sidecar.turn.core import build_core
from sidecar.turn.offload import OFFLOAD_CHARS
from sidecar.turn.request import TurnRequest


class Costs:
    """Characters hashed and tokenized, jobs sent to the offload thread, and tool calls put in
    canonical form (parsed, keys sorted, serialized), while counting."""

    def __init__(self, core, monkeypatch):
        self.hashed = self.tokenized = self.offloaded = self.canonical = 0
        extend = fingerprint_module.extend_fingerprint
        canonical = fingerprint_module._canonical

        def counting_canonical(calls, fallback):
            self.canonical += bool(calls)
            return canonical(calls, fallback)

        monkeypatch.setattr(fingerprint_module, "_canonical", counting_canonical)

        def counting_extend(previous, message):
            self.hashed += len(message.get("content") or "")
            return extend(previous, message)

        for module in (fingerprint_module, store_module):
            monkeypatch.setattr(module, "extend_fingerprint", counting_extend)
        codec = core.renderer.codec
        ids = codec._ids

        def counting_ids(backend, text):
            self.tokenized += len(text)
            return ids(backend, text)

        monkeypatch.setattr(codec, "_ids", counting_ids)
        run = core.offload.run

        async def counting_run(fn, *args, **_):
            self.offloaded += 1
            return await run(fn, *args)

        monkeypatch.setattr(core.offload, "run", counting_run)

    def take(self) -> tuple[int, int, int, int]:
        out = (self.hashed, self.tokenized, self.offloaded, self.canonical)
        self.hashed = self.tokenized = self.offloaded = self.canonical = 0
        return out


TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}]


async def run(core, messages, session_id) -> dict:
    """One turn; its reply as the next request carries it back through a door (tool-call arguments
    parsed, a call id of the client's)."""
    async with core.turn(TurnRequest(messages=messages, tools=TOOLS, session_id=session_id)) as turn:
        content = "".join([e.text async for e in turn.events() if isinstance(e, ContentDelta)])
        calls = turn.result.tool_calls
    reply = {"role": "assistant", "content": content}
    if calls:
        reply["tool_calls"] = [{"id": f"client-{c.id}", "type": "function",
                                "function": {"name": c.name, "arguments": from_json(c.arguments)}} for c in calls]
    return reply


REPLY = "Looking at the test output now."
CALL = '<tool_call>\n{"name": "bash", "arguments": {"cmd": "pytest -x tests/test_api.py", "verbose": true}}\n</tool_call>'
TOOL_RESULT = "FAILED tests/test_api.py::test_limits - AssertionError: 3 != 4\n" * 20


async def continuing_costs(core, costs, session_id: str | None, history_chars: int, turns: int = 3) -> list[tuple[int, int, int, int]]:
    """Per continuing turn of a session whose history starts ``history_chars`` long: (characters
    hashed, characters tokenized, offload jobs, tool calls made canonical)."""
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa\n"
    messages = [{"role": "system", "content": "You are an agent."},
                {"role": "user", "content": (words * (history_chars // len(words) + 1))[:history_chars]}]
    out = []
    reply = await run(core, messages, session_id)
    for k in range(turns):
        messages += [reply, {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": TOOL_RESULT}]
        costs.take()
        reply = await run(core, messages, session_id)
        out.append(costs.take())
    return out


@pytest.mark.parametrize("named", [True, False])
async def test_a_continuing_turn_hashes_and_tokenizes_only_its_new_messages(core, sglang_double, qwen3_tokenizer, monkeypatch, named):
    """Named or implicit (found by its last messages), the work of a continuing turn does not grow
    with its history: the previous reply's door-parsed arguments are compared, not re-serialized."""
    sglang_double.responder = scripted_responder(qwen3_tokenizer.encode(REPLY + "\n" + CALL, add_special_tokens=False) + [IM_END_ID])
    costs = Costs(core, monkeypatch)
    short = await continuing_costs(core, costs, "short" if named else None, 2_000)
    long = await continuing_costs(core, costs, "long" if named else None, 2 * OFFLOAD_CHARS)  # 131K characters (~25K tokens): prepared off the loop when whole
    for hashed, tokenized, offloaded, canonical in short + long:
        # the new tool result (the assistant message before it is the reply its base holds), then
        # this turn's reply once it is recorded
        assert hashed == len(TOOL_RESULT) + len(REPLY)
        assert len(TOOL_RESULT) <= tokenized < len(TOOL_RESULT) + 200  # the tool result and the template's few tokens
        assert offloaded == 0  # nothing large to prepare: no trip to the tokenizer thread
        assert canonical == 2  # the new reply's calls (its key, its fingerprint); none of the history's
    assert short == long  # the same work at 2K and at 131K characters of history
    # and the long session continued token-exactly every turn (nothing re-rendered)
    long_id = "long" if named else sglang_double.requests[-1]["session_id"]
    session = core.sessions.get(long_id)
    assert session.turn_count == 4 and len(session.turns) == 4
    assert len(core.sessions) == 2
    assert sglang_double.results[-1]["meta_info"]["cached_tokens"] > 0
    for earlier, later in zip(sglang_double.requests[4:], sglang_double.requests[5:]):
        assert later["input_ids"][: len(earlier["input_ids"])] == earlier["input_ids"]


async def test_an_edited_history_of_a_named_session_is_rendered_whole(core, sglang_double, qwen3_tokenizer, monkeypatch):
    sglang_double.responder = scripted_responder(qwen3_tokenizer.encode(REPLY, add_special_tokens=False) + [IM_END_ID])
    messages = [{"role": "user", "content": "first task"}]
    reply = await run(core, messages, "agent")
    messages += [reply, {"role": "user", "content": "next"}]
    costs = Costs(core, monkeypatch)
    edited = [{"role": "user", "content": "first task, edited"}, *messages[1:]]
    await run(core, edited, "agent")
    hashed, _, _, _ = costs.take()
    assert hashed == sum(len(m["content"]) for m in edited) + len(REPLY)  # fingerprinted whole: a new branch
    first, second = sglang_double.requests[-2:]
    assert second["input_ids"][: len(first["input_ids"])] != first["input_ids"]  # not continued from the old turn
    assert core.sessions.get("agent").branches() == 2
