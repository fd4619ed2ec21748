"""The chat-completions front door: parse OpenAI's request into a turn, render the turn's events as
OpenAI answers (a completion, or SSE chunks exactly as OpenAI frames them).

Everything else (which session, which ids, admission, lease, the engine) is the turn core's, the
same for every front door.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from aiohttp import web

from sidecar.errors import APIError
from sidecar.frontdoor.request_model import RequestBody
from sidecar.frontdoor.session_id import explicit_session_id
from sidecar.frontdoor.stream import serve_turn
from sidecar.generation.tool_parsers import Event
from sidecar.openai import shapes
from sidecar.openai.shapes import event_delta
from sidecar.openai.schema import ChatCompletionRequest, NamedToolChoice, parse_chat_request
from sidecar.turn.core import Turn, TurnCore
from sidecar.turn.request import Sampling, TurnRequest


def turn_request(req: ChatCompletionRequest, session_id: str | None, scope: str) -> TurnRequest:
    named = isinstance(req.tool_choice, NamedToolChoice)
    return TurnRequest(
        messages=[m.to_template() for m in req.messages],
        tools=req.template_tools(),
        tool_choice="required" if named else req.tool_choice,
        forced_tool=req.tool_choice.function.name if named else None,
        template_kwargs=req.chat_template_kwargs,
        session_id=session_id,
        scope=scope,
        stop=req.stop,
        sampling=Sampling(
            max_tokens=req.wanted_max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            min_p=req.min_p,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            repetition_penalty=req.repetition_penalty,
            min_tokens=req.min_tokens,
            ignore_eos=req.ignore_eos,
            seed=req.seed,
            stop_token_ids=req.stop_token_ids,
        ),
    )


def _converted(request: web.Request, scope: str, req: ChatCompletionRequest) -> tuple[TurnRequest, bool, bool]:
    """The turn, whether to stream, whether to add usage: all the door keeps of the request."""
    # an explicit session id: header X-Session-Id, else body session_id, else user ("" is none)
    session_id = explicit_session_id(request, req.session_id, req.user)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return turn_request(req, session_id, scope), req.stream, include_usage


async def handle(request: web.Request, body: RequestBody, core: TurnCore, scope: str) -> web.StreamResponse:
    """POST /v1/chat/completions with its body read (parsed and converted where its size says)."""
    asked, converted = await body.parse(parse_chat_request, core.settings, convert=functools.partial(_converted, request, scope))
    await core.check_model(asked)
    turn, stream, include_usage = converted.value()
    parsed: list[Any] = [turn]
    del turn, converted
    model = core.model_name
    return await serve_turn(
        request, core, parsed, stream, lambda turn: ChatStream(turn, model, include_usage), lambda turn: full_reply(turn, model)
    )


async def full_reply(turn: Turn, model: str) -> web.Response:
    async for _ in turn.events():
        pass
    result = turn.result
    body = shapes.completion(shapes.completion_id(), model, shapes.reply_message(result), result.finish_reason, shapes.usage(result))
    return web.json_response(body)


class ChatStream:
    """SSE exactly as OpenAI frames it: a role delta first, a chunk per event, the finish chunk,
    usage when asked for, ``[DONE]``; an in-stream error in OpenAI's envelope."""

    def __init__(self, turn: Turn, model: str, include_usage: bool):
        self.turn = turn
        self.include_usage = include_usage
        self.frames = shapes.ChunkFrames(shapes.completion_id(), model, int(time.time()), include_usage)

    def opening(self) -> bytes:
        return self.frames.delta(shapes.ROLE_DELTA)

    def event(self, event: Event) -> bytes:
        return self.frames.delta(event_delta(event))

    def closing(self) -> bytes:
        result = self.turn.result
        tail = self.frames.delta({}, result.finish_reason)
        if self.include_usage:
            tail += self.frames.usage(shapes.usage(result))
        return tail + shapes.DONE

    def failure(self, err: APIError) -> bytes:
        return shapes.error_frames(err)
