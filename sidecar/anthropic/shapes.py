"""Every shape the Messages door answers with: the message, its content blocks, usage, the SSE event
sequence (``message_start``, ``content_block_start``/``delta``/``stop``, ``message_delta``,
``message_stop``), and errors in Anthropic's envelope, in the stream or not.

Usage follows Anthropic's accounting: ``input_tokens`` are the prompt tokens the engine did *not*
find cached, ``cache_read_input_tokens`` those it did (SGLang's ``cached_tokens``); their sum is the
prompt. Nothing is billed as a cache write, so ``cache_creation_input_tokens`` is 0.
"""

from __future__ import annotations

import uuid
from typing import Any

from sidecar.errors import APIError
from sidecar.frontdoor.blocks import Block, BlockDelta, BlockEvent, BlockStart, ReplyBlocks
from sidecar.frontdoor.canonical_messages import json_or_str
from sidecar.frontdoor.stream import event_frame
from sidecar.generation.relay import GenerationResult
from sidecar.generation.tool_parsers import Event
from sidecar.turn.core import Turn

# Anthropic's error types by HTTP status; any other 4xx is an invalid request, any other 5xx an api_error
_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",  # SGLang overloaded or not answering: the clients retry these
    504: "timeout_error",
}


def error_body(err: APIError) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(err.status, "api_error" if err.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}


def message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def usage(result: GenerationResult) -> dict[str, Any]:
    return {
        "input_tokens": result.prompt_tokens - result.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": result.cached_tokens,
        "output_tokens": result.completion_tokens,
    }


def stop_reason(result: GenerationResult) -> str:
    if result.tool_calls:
        return "tool_use"
    if result.stop_sequence is not None:
        return "stop_sequence"
    return "max_tokens" if result.finish_reason == "length" else "end_turn"


def content_block(block: Block) -> dict[str, Any]:
    if block.call is None:
        return {"type": "text", "text": block.text}
    return {"type": "tool_use", "id": block.call.id, "name": block.call.name, "input": json_or_str(block.text) if block.text else {}}


def message(mid: str, model: str, content: list[dict[str, Any]], result: GenerationResult, final: bool = True) -> dict[str, Any]:
    """The message; not ``final``: the head of a stream (no stop reason yet)."""
    return {
        "id": mid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(result) if final else None,
        "stop_sequence": result.stop_sequence if final else None,
        "usage": usage(result),
    }


class MessageStream:
    """The SSE events of one streamed message. ``message_start`` carries the prompt's usage known
    when the first event is ready (SGLang reports its cached tokens with the first chunk) and
    ``output_tokens: 1``, as Anthropic starts a stream; ``message_delta`` carries the final usage,
    cumulative, as Anthropic sends it."""

    def __init__(self, turn: Turn, model: str):
        self.turn = turn
        self.model = model
        self.mid = message_id()
        self.blocks = ReplyBlocks()

    def opening(self) -> bytes:
        head = message(self.mid, self.model, [], self.turn.result, final=False)
        head["usage"]["output_tokens"] = 1  # as Anthropic starts a stream: the count so far, final in message_delta
        return event_frame("message_start", {"type": "message_start", "message": head})

    def event(self, event: Event) -> bytes:
        return b"".join(self._frame(e) for e in self.blocks.feed(event))

    def closing(self) -> bytes:
        result = self.turn.result
        tail = b"".join(self._frame(e) for e in self.blocks.finish())
        delta = {"stop_reason": stop_reason(result), "stop_sequence": result.stop_sequence}
        tail += event_frame("message_delta", {"type": "message_delta", "delta": delta, "usage": usage(result)})
        return tail + event_frame("message_stop", {"type": "message_stop"})

    def failure(self, err: APIError) -> bytes:
        return event_frame("error", error_body(err))

    @staticmethod
    def _frame(event: BlockEvent) -> bytes:
        block = event.block
        if isinstance(event, BlockStart):
            start = {"type": "text", "text": ""} if block.call is None else {
                "type": "tool_use", "id": block.call.id, "name": block.call.name, "input": {}
            }
            return event_frame("content_block_start", {"type": "content_block_start", "index": block.index, "content_block": start})
        if isinstance(event, BlockDelta):
            delta = {"type": "text_delta", "text": event.piece} if block.call is None else {
                "type": "input_json_delta", "partial_json": event.piece
            }
            return event_frame("content_block_delta", {"type": "content_block_delta", "index": block.index, "delta": delta})
        return event_frame("content_block_stop", {"type": "content_block_stop", "index": block.index})
