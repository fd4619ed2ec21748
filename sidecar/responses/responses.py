"""The Responses front door: parse the request into a turn, render the turn's events as a response
object or its SSE event sequence.

Everything else (which session, which ids, admission, lease, the engine) is the turn core's, the
same for every front door. The explicit session id is the ``X-Session-Id`` header only.
"""

from __future__ import annotations

import functools
from typing import Any

from aiohttp import web

from sidecar.frontdoor.blocks import ReplyBlocks
from sidecar.frontdoor.request_model import RequestBody
from sidecar.frontdoor.session_id import explicit_session_id
from sidecar.frontdoor.stream import serve_turn
from sidecar.responses import shapes
from sidecar.responses.schema import NamedFunction, ResponsesRequest, parse_responses_request
from sidecar.turn.core import Turn, TurnCore
from sidecar.turn.request import Sampling, TurnRequest


def turn_request(req: ResponsesRequest, session_id: str | None, scope: str) -> TurnRequest:
    named = isinstance(req.tool_choice, NamedFunction)
    return TurnRequest(
        messages=req.template_messages(),
        tools=req.template_tools(),
        tool_choice="required" if named else req.tool_choice,
        forced_tool=req.tool_choice.name if named else None,
        session_id=session_id,
        scope=scope,
        sampling=Sampling(max_tokens=req.max_output_tokens, temperature=req.temperature, top_p=req.top_p, ignore_eos=req.ignore_eos),
    )


def echo(req: ResponsesRequest) -> dict[str, Any]:
    """The request fields a response repeats."""
    choice = req.tool_choice
    return {
        "instructions": req.instructions,
        "metadata": req.metadata or {},
        "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],  # hosted tools left out
        "tool_choice": choice.model_dump() if isinstance(choice, NamedFunction) else (choice or "auto"),
        "parallel_tool_calls": req.parallel_tool_calls if req.parallel_tool_calls is not None else True,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "max_output_tokens": req.max_output_tokens,
        "text": {"format": {"type": "text"}},
        "store": False,
        "previous_response_id": None,
        "truncation": "disabled",
    }


def _converted(request: web.Request, scope: str, req: ResponsesRequest) -> tuple[dict[str, Any], dict[str, str], TurnRequest, bool]:
    """What a response repeats of the request, its namespaces, its turn, whether to stream."""
    echoed, namespaces = echo(req), req.namespaces()
    return echoed, namespaces, turn_request(req, explicit_session_id(request), scope), req.stream


async def handle(request: web.Request, body: RequestBody, core: TurnCore, scope: str) -> web.StreamResponse:
    """POST /v1/responses with its body read (parsed and converted where its size says)."""
    asked, converted = await body.parse(parse_responses_request, core.settings, convert=functools.partial(_converted, request, scope))
    await core.check_model(asked)
    echoed, namespaces, turn, stream = converted.value()
    head = shapes.ResponseHead(core.model_name, echoed, namespaces)
    parsed: list[Any] = [turn]
    del turn, converted
    return await serve_turn(request, core, parsed, stream, lambda turn: shapes.ResponseStream(turn, head), lambda turn: full_reply(turn, head))


async def full_reply(turn: Turn, head: shapes.ResponseHead) -> web.Response:
    blocks = ReplyBlocks()
    async for event in turn.events():
        blocks.feed(event)
    result = turn.result
    status = shapes.final_status(result)
    statuses = shapes.item_statuses(blocks.blocks, status)
    output = [
        shapes.output_item(b, shapes.new_id("msg" if b.call is None else "fc"), st, head.namespaces)
        for b, st in zip(blocks.blocks, statuses)
    ]
    return web.json_response(head.response(status, output, result))
