"""Serving one turn over HTTP, the same for every front door: a whole reply, or an SSE stream whose
headers go out with its first event, so that an engine failure before any output is still a plain
HTTP error with its status code, and one after it is an error in the stream, in the door's words."""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable, Protocol

from aiohttp import web
from pydantic_core import PydanticSerializationError, to_json

from sidecar import logs

from sidecar.errors import APIError
from sidecar.generation.tool_parsers import Event
from sidecar.frontdoor.client_writes import ClientStalled, write_within
from sidecar.turn.core import Turn, TurnCore

_DISCONNECTS = (ConnectionResetError, ConnectionError)



def event_frame(event: str, payload: dict[str, Any]) -> bytes:
    """One named SSE event (``event: NAME`` + ``data: JSON``), as Anthropic and the Responses API send.
    The JSON is pydantic-core's (compact UTF-8, as those APIs send it): a frame per token, and
    ~3x cheaper than the stdlib's encoder plus its ``str.encode``."""
    return b"event: " + event.encode() + b"\ndata: " + frame_json(payload) + b"\n\n"


def frame_json(payload: Any) -> bytes:
    """``payload`` as the JSON of an SSE frame: pydantic-core's compact UTF-8; text it cannot
    write as UTF-8 (a lone surrogate, say, echoed in an error's message) the stdlib's ASCII escapes."""
    try:
        return to_json(payload)
    except PydanticSerializationError:
        return json.dumps(payload, separators=(",", ":")).encode()


class StreamFrames(Protocol):
    """A door's SSE rendering of one turn's events."""

    def opening(self) -> bytes:
        """Frames that go out with the first event (the reply's head)."""

    def event(self, event: Event) -> bytes:
        """Frames of one relay event."""

    def closing(self) -> bytes:
        """Frames after the last event (the turn's result is complete)."""

    def failure(self, err: APIError) -> bytes:
        """Frames that end a stream the engine failed after it started."""


async def serve_turn(
    request: web.Request,
    core: TurnCore,
    parsed: list[Any],
    stream: bool,
    frames: Callable[[Turn], StreamFrames],
    whole: Callable[[Turn], Awaitable[web.Response]],
) -> web.StreamResponse:
    """Run the turn of ``parsed[-1]`` (a TurnRequest) and answer it: ``whole(turn)`` drains the
    events into one response, or the ``frames(turn)`` are streamed.

    The parsed request (``parsed``: hundreds of objects for a long history) is not needed while the
    reply streams, so it is not carried through the garbage collector's generations: the list is
    cleared once the reply started, so that freeing it is not on the request's way to SGLang.
    """
    try:
        async with core.turn(parsed[-1]) as turn:
            if stream:
                return await stream_reply(
                    request, turn, frames(turn), started=parsed.clear, write_timeout=core.settings.stream_write_timeout
                )
            parsed.clear()
            return await whole(turn)
    except _StreamAlreadyAnswered as done:
        return done.response


async def stream_reply(
    request: web.Request,
    turn: Turn,
    frames: StreamFrames,
    started: Callable[[], None] | None = None,
    write_timeout: float = 30.0,
) -> web.StreamResponse:
    """Stream the turn's events as ``frames`` render them; ``started`` is called once the first
    event was written. Every write goes through :func:`write_within`: a client that reads nothing
    for ``write_timeout`` s is cut, and the turn (its engine request) aborted."""
    response: web.StreamResponse | None = None
    head: bytes | None = None

    def opened() -> bytes:
        """The head before the first event's frames are rendered (frames may be numbered)."""
        nonlocal head
        if head is None:
            head = frames.opening()
            return head
        return b""

    async def send(data: bytes, last: bool = False) -> None:
        nonlocal response
        first = response is None
        if first:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await response.prepare(request)
        # one write with last: the data and the end of the chunked body
        await write_within(request, response, data, write_timeout, last)
        if first and started is not None:
            started()

    try:
        async for batch in turn.batches():  # one write for what one read of the engine brought
            await send(opened() + b"".join([frames.event(event) for event in batch]))
        await send(opened() + frames.closing(), last=True)
    except APIError as err:
        if response is None:
            raise
        logs.note_error(err.code or err.type)  # answered in-stream: the status stays 200
        await _write_quietly(response, frames.failure(err))
        raise _StreamAlreadyAnswered(response) from err
    except ClientStalled as err:
        logs.note_error("client_stalled")
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
