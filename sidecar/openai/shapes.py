"""Every shape the chat-completions door answers with: the completion, the SSE chunks (role delta,
content and tool-call deltas, finish, usage, in-stream error, ``[DONE]``), usage, tool calls."""

from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic_core import to_json

from sidecar.errors import APIError
from sidecar.frontdoor.stream import frame_json
from sidecar.generation.relay import GenerationResult
from sidecar.generation.tool_parsers import ContentDelta, Event, ToolCall, ToolCallArgumentsDelta, ToolCallStart

ROLE_DELTA = {"role": "assistant", "content": ""}  # the first chunk of every stream
DONE = b"data: [DONE]\n\n"


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


def usage_dict(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def usage(result: GenerationResult) -> dict[str, Any]:
    return usage_dict(result.prompt_tokens, result.completion_tokens, result.cached_tokens)


def tool_call(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def reply_message(result: GenerationResult) -> dict[str, Any]:
    """The assistant message of a (non-streamed) completion; beside tool calls, only the text
    around them (stripped) is content."""
    content = result.content or None
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if result.tool_calls:
        message["tool_calls"] = [tool_call(c) for c in result.tool_calls]
        if content is not None:
            message["content"] = content.strip() or None
    return message


def completion(cid: str, model: str, message: dict[str, Any], finish_reason: str, usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
        "usage": usage,
    }


def event_delta(event: Event) -> dict[str, Any]:
    """A relay event as the ``delta`` of a stream chunk."""
    if isinstance(event, ContentDelta):
        return {"content": event.text}
    if isinstance(event, ToolCallStart):
        return {"tool_calls": [{"index": event.index, "id": event.id, "type": "function", "function": {"name": event.name, "arguments": ""}}]}
    if isinstance(event, ToolCallArgumentsDelta):
        return {"tool_calls": [{"index": event.index, "function": {"arguments": event.arguments}}]}
    raise TypeError(f"unknown relay event {event!r}")


def _chunk_head(cid: str, model: str, created: int) -> dict[str, Any]:
    return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model, "system_fingerprint": None}


def chunk(cid: str, model: str, created: int, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return _chunk_head(cid, model, created) | {
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
    }


def usage_chunk(cid: str, model: str, created: int, usage: dict[str, Any]) -> dict[str, Any]:
    return _chunk_head(cid, model, created) | {"choices": [], "usage": usage}


def sse_frame(payload: dict[str, Any]) -> bytes:
    """``data: JSON``: pydantic-core's compact UTF-8 JSON, as OpenAI's stream sends it."""
    return b"data: " + frame_json(payload) + b"\n\n"


def error_frames(err: APIError) -> bytes:
    """A failure after the stream started: the error in OpenAI's envelope, then ``[DONE]``."""
    return sse_frame(err.body()) + DONE


class ChunkFrames:
    """SSE frames of one streamed completion, byte for byte ``sse_frame(chunk(...))``.

    A stream sends a chunk per token; the part every chunk shares (id, model, ...) is serialized
    once here, so a frame costs only the JSON of its delta.
    """

    _DELTA, _FINISH = "\x00delta\x00", "\x00finish\x00"  # placeholders: JSON escapes NUL, no real value has it

    def __init__(self, cid: str, model: str, created: int, include_usage: bool):
        self._usage = {"usage": None} if include_usage else {}
        self._chunk_args = (cid, model, created)
        text = to_json(chunk(cid, model, created, self._DELTA, self._FINISH) | self._usage)  # type: ignore[arg-type]
        delta, finish = to_json(self._DELTA), to_json(self._FINISH)
        self._parts: tuple[bytes, bytes, bytes] | None = None
        if text.count(delta) == 1 and text.count(finish) == 1 and text.index(delta) < text.index(finish):
            head, rest = text.split(delta)
            middle, tail = rest.split(finish)
            self._parts = (b"data: " + head, middle, tail + b"\n\n")

    def delta(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        if self._parts is None:  # a model name holding a placeholder: serialize whole
            return sse_frame(chunk(*self._chunk_args, delta, finish_reason) | self._usage)
        head, middle, tail = self._parts
        finish = b"null" if finish_reason is None else to_json(finish_reason)
        return head + to_json(delta) + middle + finish + tail

    def usage(self, usage: dict[str, Any]) -> bytes:
        return sse_frame(usage_chunk(*self._chunk_args, usage))
