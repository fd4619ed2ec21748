"""A continuing turn pays for what is new: it hashes and tokenizes only the messages appended since
its session's last turn (and its own reply), whatever the length of the history before them; an
edited history is still noticed and rendered whole."""

from __future__ import annotations

import aiohttp
import pytest
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
    """Characters hashed and tokenized, and jobs sent to the offload thread, while counting."""

    def __init__(self, core, monkeypatch):
        self.hashed = self.tokenized = self.offloaded = 0
        extend = fingerprint_module.extend_fingerprint

        def counting_extend(previous, message):
            self.hashed += len(message.get("content") or "")
            return extend(previous, message)

        for module in (fingerprint_module, store_module):
            monkeypatch.setattr(module, "extend_fingerprint", counting_extend)
        codec = core.renderer.codec
        encoding = codec._encoding

        def counting_encoding(backend, text):
            self.tokenized += len(text)
            return encoding(backend, text)

        monkeypatch.setattr(codec, "_encoding", counting_encoding)
        run = core.offload.run

        async def counting_run(fn, *args, **_):
            self.offloaded += 1
            return await run(fn, *args)

        monkeypatch.setattr(core.offload, "run", counting_run)

    def take(self) -> tuple[int, int, int]:
        out = (self.hashed, self.tokenized, self.offloaded)
        self.hashed = self.tokenized = self.offloaded = 0
        return out


async def run(core, messages, session_id) -> str:
    async with core.turn(TurnRequest(messages=messages, session_id=session_id)) as turn:
        return "".join([e.text async for e in turn.events() if isinstance(e, ContentDelta)])


REPLY = "Looking at the test output now."
TOOL_RESULT = "FAILED tests/test_api.py::test_limits - AssertionError: 3 != 4\n" * 20


async def continuing_costs(core, costs, session_id: str, history_chars: int, turns: int = 3) -> list[tuple[int, int, int]]:
    """Per continuing turn of a session whose history starts ``history_chars`` long: (characters
    hashed, characters tokenized, offload jobs)."""
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa\n"
    messages = [{"role": "system", "content": "You are an agent."},
                {"role": "user", "content": (words * (history_chars // len(words) + 1))[:history_chars]}]
    out = []
    reply = await run(core, messages, session_id)
    for _ in range(turns):
        messages += [{"role": "assistant", "content": reply}, {"role": "tool", "tool_call_id": "c", "content": TOOL_RESULT}]
        costs.take()
        reply = await run(core, messages, session_id)
        out.append(costs.take())
    return out


async def test_a_continuing_turn_hashes_and_tokenizes_only_its_new_messages(core, sglang_double, qwen3_tokenizer, monkeypatch):
    sglang_double.responder = scripted_responder(qwen3_tokenizer.encode(REPLY, add_special_tokens=False) + [IM_END_ID])
    costs = Costs(core, monkeypatch)
    short = await continuing_costs(core, costs, "short", 2_000)
    long = await continuing_costs(core, costs, "long", 2 * OFFLOAD_CHARS)  # 131K characters (~25K tokens): prepared off the loop when whole
    for hashed, tokenized, offloaded in short + long:
        # the new tool result (the assistant message before it is the reply its base holds), then
        # this turn's reply once it is recorded
        assert hashed == len(TOOL_RESULT) + len(REPLY)
        assert len(TOOL_RESULT) <= tokenized < len(TOOL_RESULT) + 200  # the tool result and the template's few tokens
        assert offloaded == 0  # nothing large to prepare: no trip to the tokenizer thread
    assert short == long  # the same work at 2K and at 131K characters of history
    # and the long session continued token-exactly every turn (nothing re-rendered)
    session = core.sessions.get("long")
    assert session.turn_count == 4 and len(session.turns) == 4
    assert sglang_double.results[-1]["meta_info"]["cached_tokens"] > 0


async def test_an_edited_history_of_a_named_session_is_rendered_whole(core, sglang_double, qwen3_tokenizer, monkeypatch):
    sglang_double.responder = scripted_responder(qwen3_tokenizer.encode(REPLY, add_special_tokens=False) + [IM_END_ID])
    messages = [{"role": "user", "content": "first task"}]
    reply = await run(core, messages, "agent")
    messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "next"}]
    costs = Costs(core, monkeypatch)
    edited = [{"role": "user", "content": "first task, edited"}, *messages[1:]]
    await run(core, edited, "agent")
    hashed, _, _ = costs.take()
    assert hashed == sum(len(m["content"]) for m in edited) + len(REPLY)  # fingerprinted whole: a new branch
    first, second = sglang_double.requests[-2:]
    assert second["input_ids"][: len(first["input_ids"])] != first["input_ids"]  # not continued from the old turn
    assert core.sessions.get("agent").branches() == 2
