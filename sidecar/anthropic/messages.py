"""The Messages front door: parse Anthropic's request into a turn, render the turn's events as
Anthropic answers (a message, or its SSE event sequence); count a prompt's tokens.

Everything else (which session, which ids, admission, lease, the engine) is the turn core's, the
same for every front door. The explicit session id is the ``X-Session-Id`` header only:
``metadata.user_id`` names a user, and Claude Code sends the same one on its main loop, its
sub-agents and its side calls, which are separate conversations that implicit recognition keeps apart.
"""

from __future__ import annotations

import functools
from typing import Any

from aiohttp import web

from sidecar.anthropic import shapes
from sidecar.anthropic.schema import CountTokensRequest, MessagesRequest, parse_count_tokens_request, parse_messages_request
from sidecar.frontdoor.blocks import ReplyBlocks
from sidecar.frontdoor.request_model import RequestBody
from sidecar.frontdoor.session_id import explicit_session_id
from sidecar.frontdoor.stream import serve_turn
from sidecar.turn.core import Turn, TurnCore
from sidecar.turn.request import Sampling, TurnRequest

_TOOL_CHOICES = {"auto": "auto", "any": "required", "tool": "required", "none": "none"}


def turn_request(req: CountTokensRequest, session_id: str | None, scope: str) -> TurnRequest:
    choice = req.tool_choice
    turn = TurnRequest(
        messages=req.template_messages(),
        tools=req.template_tools(),
        tool_choice=_TOOL_CHOICES[choice.type] if choice is not None else None,
        forced_tool=choice.name if choice is not None else None,
        session_id=session_id,
        scope=scope,
    )
    if isinstance(req, MessagesRequest):
        turn.stop = req.stop_sequences
        turn.sampling = Sampling(
            max_tokens=req.max_tokens, temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, ignore_eos=req.ignore_eos
        )
    return turn


def _converted(request: web.Request, scope: str, req: MessagesRequest) -> tuple[TurnRequest, bool]:
    return turn_request(req, explicit_session_id(request), scope), req.stream


async def handle(request: web.Request, body: RequestBody, core: TurnCore, scope: str) -> web.StreamResponse:
    """POST /v1/messages with its body read (parsed and converted where its size says)."""
    asked, converted = await body.parse(parse_messages_request, core.settings, convert=functools.partial(_converted, request, scope))
    await core.check_model(asked)
    turn, stream = converted.value()
    parsed: list[Any] = [turn]
    del turn, converted
    model = core.model_name
    return await serve_turn(
        request, core, parsed, stream, lambda turn: shapes.MessageStream(turn, model), lambda turn: full_reply(turn, model)
    )


async def full_reply(turn: Turn, model: str) -> web.Response:
    blocks = ReplyBlocks()
    async for event in turn.events():
        blocks.feed(event)
    content = [shapes.content_block(b) for b in blocks.blocks]
    return web.json_response(shapes.message(shapes.message_id(), model, content, turn.result))


async def count_tokens(request: web.Request, body: RequestBody, core: TurnCore, scope: str) -> web.Response:
    """POST /v1/messages/count_tokens: the prompt's tokens rendered whole, as a new session sends it."""
    asked, converted = await body.parse(parse_count_tokens_request, core.settings, convert=lambda req: turn_request(req, None, scope))
    await core.check_model(asked)
    return web.json_response({"input_tokens": await core.count_tokens(converted.value())})
