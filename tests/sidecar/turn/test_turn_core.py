"""The turn core without any front door or HTTP server in front of it: a TurnRequest in, the
relay's events out, the finished turn recorded. A second front door would drive exactly this."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from sidecar_tools.simulator.replies import IM_END_ID, scripted_responder

from sidecar.engine.capacity import EngineCapacity
from sidecar.engine.client import EngineClient
from sidecar.engine.worker import Worker, Workers
from sidecar.generation.tool_parsers import ContentDelta
from sidecar.metrics import SidecarMetrics
from sidecar.settings import load_settings
from sidecar.turn.core import build_core
from sidecar.turn.request import TurnRequest


async def run(core, request: TurnRequest) -> str:
    async with core.turn(request) as turn:
        return "".join([e.text async for e in turn.events() if isinstance(e, ContentDelta)])


async def test_a_turn_runs_from_a_turn_request_and_the_next_continues_token_exactly(core, sglang_double, qwen3_tokenizer):
    sglang_double.responder = scripted_responder(qwen3_tokenizer.encode("first reply", add_special_tokens=False) + [IM_END_ID])
    messages = [{"role": "user", "content": "hello"}]
    assert await run(core, TurnRequest(messages=messages, session_id="agent-1")) == "first reply"

    session = core.sessions.get("agent-1")
    (worker,) = core.workers
    assert session.turn_count == 1 and session.inflight == 0
    assert session.worker is worker  # it lives where its request went
    assert session.record.lease_expires_at is not None  # the lease it asked for (fixed 20 s)
    sent = sglang_double.requests[0]
    lease = sent["sampling_params"]["custom_params"]
    assert sent["session_id"] == "agent-1" and lease["session_lease_ttl_s"] == 20.0
    # nothing learned yet: the session is expected back after the prior's median gap (2 s)
    assert lease["session_expected_back_s"] == pytest.approx(2.0, rel=0.05)
    assert 0 < lease["session_expected_spread_s"] < lease["session_expected_back_s"]

    # the next turn, recognised from its history alone (no id), continues the engine's exact ids
    messages += [{"role": "assistant", "content": "first reply"}, {"role": "user", "content": "more"}]
    await run(core, TurnRequest(messages=messages))
    held = sglang_double.requests[0]["input_ids"] + sglang_double.results[0]["output_ids"]
    assert sglang_double.requests[1]["input_ids"][: len(held)] == held
    assert sglang_double.requests[1]["session_id"] == "agent-1" and session.turn_count == 2


async def test_a_door_that_gives_up_mid_reply_records_nothing_and_aborts_the_engine(core, sglang_double):
    sglang_double.responder = scripted_responder(list(range(1000, 1100)))
    sglang_double.token_delay = 0.02
    with pytest.raises(ConnectionResetError):
        async with core.turn(TurnRequest(messages=[{"role": "user", "content": "long"}], session_id="s")) as turn:
            async for _ in turn.events():
                raise ConnectionResetError  # the agent hung up while the reply streamed
    for _ in range(50):
        if sglang_double.aborts:
            break
        await asyncio.sleep(0.02)
    assert [a["rid"] for a in sglang_double.aborts] == [sglang_double.requests[0]["rid"]]
    session = core.sessions.get("s")
    assert session.turn_count == 0 and session.inflight == 0 and session.record.running == 0


async def test_a_failed_first_request_leaves_no_session_and_no_policy_record(core, sglang_double):
    with pytest.raises(Exception, match="too many messages"):  # refused before it was admitted
        async with core.turn(TurnRequest(messages=[{"role": "user", "content": "x"}] * (core.settings.max_messages + 1))):
            pass
    sglang_double.faults.fail_next, sglang_double.faults.fail_status = 1, 500
    with pytest.raises(Exception, match="HTTP 500"):  # admitted, leased, then the engine failed
        async with core.turn(TurnRequest(messages=[{"role": "user", "content": "x"}])) as turn:
            async for _ in turn.events():
                pass
    assert len(core.sessions) == 0 and list(core.sessions.records()) == []
    assert core.policy.gate.queue_length == 0
    # the refused one never became a session; the failed one was forgotten the one way
    assert core.metrics.registry.get_sample_value("sidecar_sessions_closed_total", {"reason": "failed"}) == 1


async def test_agents_with_one_system_prompt_share_its_prefix_at_the_door(core, sglang_double, qwen3_tokenizer):
    """The door gets the rendered prompt ids: two agents of one deployment (the same system prompt
    and tools) are counted as holding its blocks once."""
    sglang_double.responder = scripted_responder(qwen3_tokenizer.encode("ok", add_special_tokens=False) + [IM_END_ID])
    system = {"role": "system", "content": " ".join(f"rule {i}: keep the tests green." for i in range(60))}
    for sid, task in (("agent-1", "fix the parser"), ("agent-2", "write the docs")):
        await run(core, TurnRequest(messages=[system, {"role": "user", "content": task}], session_id=sid))
    first, second = (core.sessions.get(s).record.share for s in ("agent-1", "agent-2"))
    assert first is not None and first == second and first.tokens >= 512
