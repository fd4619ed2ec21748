"""Every shape the Responses door answers with: the response object, its output items (a message
with one ``output_text`` part per run of text, a ``function_call`` per tool call), usage, and the
SSE event sequence with its ``sequence_number``s (``response.created``, ``response.in_progress``,
``response.output_item.added``/``done``, ``response.content_part.added``/``done``,
``response.output_text.delta``/``done``, ``response.function_call_arguments.delta``/``done``,
``response.completed`` or ``response.incomplete``; ``error`` + ``response.failed`` when the engine
fails mid-stream). HTTP errors keep OpenAI's envelope, as on the chat-completions door."""

from __future__ import annotations

import time
import uuid
from typing import Any

from sidecar.errors import APIError
from sidecar.frontdoor.blocks import Block, BlockDelta, BlockEvent, BlockStart, ReplyBlocks
from sidecar.frontdoor.stream import event_frame
from sidecar.generation.relay import GenerationResult
from sidecar.generation.tool_parsers import Event
from sidecar.turn.core import Turn


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(result: GenerationResult) -> dict[str, Any]:
    return {
        "input_tokens": result.prompt_tokens,
        "input_tokens_details": {"cached_tokens": result.cached_tokens},
        "output_tokens": result.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": result.prompt_tokens + result.completion_tokens,
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def output_item(block: Block, item_id: str, status: str = "completed", namespaces: dict[str, str] | None = None) -> dict[str, Any]:
    """A block as an output item; ``in_progress``: as ``output_item.added`` announces it (empty);
    ``incomplete``: the item ``max_output_tokens`` cut. A call of a namespaced function names its
    namespace, as OpenAI answers it."""
    done = status != "in_progress"
    if block.call is None:
        content = [_text_part(block.text)] if done else []
        return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}
    arguments = block.text if done else ""
    item = {"id": item_id, "type": "function_call", "status": status, "call_id": block.call.id, "name": block.call.name, "arguments": arguments}
    namespace = (namespaces or {}).get(block.call.name)
    if namespace is not None:
        item["namespace"] = namespace
    return item


def item_statuses(blocks: list[Block], status: str) -> list[str]:
    """Each output item's status in a response of ``status``: in an incomplete one the last item is
    the one that was cut, the items before it were done."""
    out = ["completed"] * len(blocks)
    if out and status == "incomplete":
        out[-1] = "incomplete"
    return out


class ResponseHead:
    """What every rendering of one response repeats: its id, creation time, model and the request
    fields a response echoes (instructions, tools, tool_choice, sampling, metadata)."""

    def __init__(self, model: str, echo: dict[str, Any], namespaces: dict[str, str] | None = None):
        self.id = new_id("resp")
        self.namespaces = namespaces or {}  # namespaced functions' namespaces, by function name
        self.created_at = int(time.time())
        self.model = model
        self.echo = echo

    def response(self, status: str, output: list[dict[str, Any]], result: GenerationResult | None, error: APIError | None = None) -> dict[str, Any]:
        incomplete = status == "incomplete"
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": {"code": error.code or "server_error", "message": error.message} if error is not None else None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "model": self.model,
            "output": output,
            "usage": usage(result) if result is not None else None,
            **self.echo,
        }


def final_status(result: GenerationResult) -> str:
    return "incomplete" if result.finish_reason == "length" else "completed"


class ResponseStream:
    """The SSE events of one streamed response, numbered in order."""

    def __init__(self, turn: Turn, head: ResponseHead):
        self.turn = turn
        self.head = head
        self.blocks = ReplyBlocks()
        self.item_ids: list[str] = []
        self.sequence = 0
        self.cut = False  # the reply ended at max_output_tokens (known at closing)

    def _emit(self, kind: str, **fields: Any) -> bytes:
        frame = event_frame(kind, {"type": kind, **fields, "sequence_number": self.sequence})
        self.sequence += 1
        return frame

    def opening(self) -> bytes:
        head = self.head.response("in_progress", [], None)
        return self._emit("response.created", response=head) + self._emit("response.in_progress", response=head)

    def event(self, event: Event) -> bytes:
        return b"".join(self._frames(e) for e in self.blocks.feed(event))

    def closing(self) -> bytes:
        result = self.turn.result
        status = final_status(result)
        self.cut = status == "incomplete"
        tail = b"".join(self._frames(e) for e in self.blocks.finish())
        statuses = item_statuses(self.blocks.blocks, status)
        output = [output_item(b, i, st, self.head.namespaces) for b, i, st in zip(self.blocks.blocks, self.item_ids, statuses)]
        return tail + self._emit(f"response.{status}", response=self.head.response(status, output, result))

    def failure(self, err: APIError) -> bytes:
        failed = self.head.response("failed", [], self.turn.result, err)
        return self._emit("error", code=err.code, message=err.message, param=err.param) + self._emit("response.failed", response=failed)

    def _frames(self, event: BlockEvent) -> bytes:
        block = event.block
        where = {"output_index": block.index}
        if isinstance(event, BlockStart):
            self.item_ids.append(new_id("msg" if block.call is None else "fc"))
            item_id = self.item_ids[-1]
            frames = self._emit("response.output_item.added", **where, item=output_item(block, item_id, "in_progress", self.head.namespaces))
            if block.call is None:
                frames += self._emit("response.content_part.added", item_id=item_id, **where, content_index=0, part=_text_part(""))
            return frames
        item_id = self.item_ids[block.index]
        if isinstance(event, BlockDelta):
            if block.call is None:
                return self._emit("response.output_text.delta", item_id=item_id, **where, content_index=0, delta=event.piece, logprobs=[])
            return self._emit("response.function_call_arguments.delta", item_id=item_id, **where, delta=event.piece)
        if block.call is None:
            frames = self._emit("response.output_text.done", item_id=item_id, **where, content_index=0, text=block.text, logprobs=[])
            frames += self._emit("response.content_part.done", item_id=item_id, **where, content_index=0, part=_text_part(block.text))
        else:
            frames = self._emit(
                "response.function_call_arguments.done", item_id=item_id, **where, name=block.call.name, arguments=block.text
            )
        last = self.cut and block.index == len(self.blocks.blocks) - 1  # the block max_output_tokens cut
        item = output_item(block, item_id, "incomplete" if last else "completed", self.head.namespaces)
        return frames + self._emit("response.output_item.done", **where, item=item)
