"""The chat-completions front door: parse OpenAI's request into a turn, render the turn's events as
OpenAI answers (a completion, or SSE chunks exactly as OpenAI frames them).

Everything else (which session, which ids, admission, lease, the engine) is the turn core's, the
same for every front door.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from aiohttp import web

from sidecar.engine.generate import Sampling
from sidecar.errors import APIError
from sidecar.openai import shapes
from sidecar.openai.shapes import event_delta
from sidecar.openai.schema import ChatCompletionRequest, NamedToolChoice, parse_chat_request
from sidecar.turn.client_writes import ClientStalled, write_within
from sidecar.turn.core import Turn, TurnCore
from sidecar.turn.request import TurnRequest

_DISCONNECTS = (ConnectionResetError, ConnectionError)


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


async def handle(request: web.Request, body: Any, core: TurnCore, scope: str) -> web.StreamResponse:
    """POST /v1/chat/completions with its body already read and parsed (strict JSON)."""
    req = parse_chat_request(body, core.settings)
    # an explicit session id: header X-Session-Id, else body session_id, else user ("" is none)
    session_id = request.headers.get("X-Session-Id") or req.session_id or req.user
    stream = req.stream
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    # The parsed history (hundreds of objects per request) is not needed while the reply
    # streams, so it is not carried through the garbage collector's generations. It is freed
    # once the reply started, so that freeing it is not on the request's way to SGLang.
    parsed: list[Any] = [req, turn_request(req, session_id, scope)]
    del req
    try:
        async with core.turn(parsed[1]) as turn:
            if stream:
                return await stream_reply(
                    request, turn, core.model_name, include_usage, parsed.clear, core.settings.stream_write_timeout
                )
            parsed.clear()
            return await full_reply(turn, core.model_name)
    except _StreamAlreadyAnswered as done:
        return done.response


async def full_reply(turn: Turn, model: str) -> web.Response:
    async for _ in turn.events():
        pass
    result = turn.result
    body = shapes.completion(shapes.completion_id(), model, shapes.reply_message(result), result.finish_reason, shapes.usage(result))
    return web.json_response(body)


async def stream_reply(
    request: web.Request,
    turn: Turn,
    model: str,
    include_usage: bool,
    started: Callable[[], None] | None = None,
    write_timeout: float = 30.0,
) -> web.StreamResponse:
    """SSE exactly as OpenAI frames it; headers go out with the first event, so an engine failure
    before any output is still a plain HTTP error with its status code. ``started`` is called
    once that first event was written."""
    frames = shapes.ChunkFrames(shapes.completion_id(), model, int(time.time()), include_usage)
    response: web.StreamResponse | None = None

    async def send(data: bytes, last: bool = False) -> None:
        nonlocal response
        first = response is None
        if first:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await response.prepare(request)
            data = frames.delta(shapes.ROLE_DELTA) + data
        # one write with last: the data and the end of the chunked body
        await write_within(request, response, data, write_timeout, last)
        if first and started is not None:
            started()

    try:
        async for event in turn.events():
            await send(frames.delta(event_delta(event)))
        result = turn.result
        tail = frames.delta({}, result.finish_reason)
        if include_usage:
            tail += frames.usage(shapes.usage(result))
        await send(tail + shapes.DONE, last=True)
    except APIError as err:
        if response is None:
            raise
        await _write_quietly(response, shapes.error_frames(err))
        raise _StreamAlreadyAnswered(response) from err
    except ClientStalled as err:
        raise _StreamAlreadyAnswered(response) from err  # the turn aborts its engine request
    return response


class _StreamAlreadyAnswered(Exception):
    """A failure after the SSE headers went out: the error was sent in-stream; nothing to record."""

    def __init__(self, response: web.StreamResponse):
        super().__init__("stream failed after it started")
        self.response = response


async def _write_quietly(response: web.StreamResponse, data: bytes) -> None:
    try:
        await response.write(data)
        await response.write_eof()
    except _DISCONNECTS:
        pass
