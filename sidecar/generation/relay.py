"""One generation: SGLang's cumulative output ids in, OpenAI-level events out.

The relay detokenizes incrementally, applies stop strings (SGLang runs without a tokenizer, so
they are ours to enforce), and feeds the text through the tool-call parser. When it is done it
knows the exact ids the engine produced, which the session registry records for the next turn.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from sidecar.generation.detokenize import IncrementalDetokenizer, StopMatcher
from sidecar.engine.client import EngineClient
from sidecar.errors import engine_error
from sidecar.generation.tool_parsers import ContentDelta, ToolCallArgumentsDelta, ToolCallStart


@dataclass
class ToolCallOut:
    id: str
    name: str
    arguments: str = ""

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class GenerationResult:
    output_ids: list[int] = field(default_factory=list)
    end_id: int | None = None  # stop token that ended the reply, if any
    finish_reason: str = "stop"  # OpenAI's: stop | length | tool_calls
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    content: str = ""
    tool_calls: list[ToolCallOut] = field(default_factory=list)
    first_token_at: float | None = None


class Generation:
    """Run one /generate stream and translate it; iterate :meth:`events` then read :attr:`result`."""

    def __init__(
        self,
        engine: EngineClient,
        payload: dict[str, Any],
        tokenizer,
        parser,
        stop: list[str] | None,
        forced_text: str | None = None,
    ):
        self.engine = engine
        self.payload = payload
        self.rid = payload["rid"]
        self.detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=True)
        self.stop = StopMatcher(stop) if stop else None
        self.parser = parser
        self.forced_text = forced_text
        self.result = GenerationResult(prompt_tokens=len(payload["input_ids"]))
        self.finished = False

    async def events(self) -> AsyncIterator[Any]:
        result = self.result
        if self.forced_text:
            for event in self.parser.feed(self.forced_text):
                yield self._collect(event)
        stopped_by_string = False
        async for chunk in self.engine.generate_stream(self.payload):
            ids = chunk.get("output_ids") or []
            meta = chunk.get("meta_info") or {}
            if ids and result.first_token_at is None:
                result.first_token_at = time.monotonic()
            result.output_ids = ids  # a fresh list per chunk (cumulative); the detokenizer keeps its own
            self._read_usage(meta)
            text = self.detok.update(ids)
            finish = meta.get("finish_reason")
            if self.stop is not None and text:
                text, stopped_by_string = self.stop.feed(text)
            for event in self.parser.feed(text) if text else ():
                yield self._collect(event)
            if stopped_by_string:
                await self.engine.abort(self.rid)
                result.finish_reason = "stop"
                break
            if finish is not None:
                self._read_finish(finish)
                break
        else:
            raise engine_error("SGLang ended the stream without a finish reason")
        if not stopped_by_string:
            tail = self.detok.flush()
            if self.stop is not None:
                held, stopped_by_string = self.stop.feed(tail) if tail else ("", False)
                tail = held if stopped_by_string else held + self.stop.flush()
            for event in self.parser.feed(tail) if tail else ():
                yield self._collect(event)
        for event in self.parser.finish():
            yield self._collect(event)
        if result.tool_calls and result.finish_reason == "stop":
            result.finish_reason = "tool_calls"
        self.finished = True

    def _collect(self, event):
        result = self.result
        if isinstance(event, ContentDelta):
            result.content += event.text
        elif isinstance(event, ToolCallStart):
            result.tool_calls.append(ToolCallOut(event.id, event.name))
        elif isinstance(event, ToolCallArgumentsDelta):
            result.tool_calls[event.index].arguments += event.arguments
        return event

    def _read_usage(self, meta: dict[str, Any]) -> None:
        result = self.result
        result.prompt_tokens = int(meta.get("prompt_tokens", result.prompt_tokens) or result.prompt_tokens)
        result.completion_tokens = int(meta.get("completion_tokens", len(result.output_ids)) or 0)
        result.cached_tokens = int(meta.get("cached_tokens", 0) or 0)

    def _read_finish(self, finish: dict[str, Any]) -> None:
        result = self.result
        kind = finish.get("type")
        if kind == "abort":
            raise engine_error(f"SGLang aborted the request: {finish.get('message', 'no reason given')}")
        if kind == "length":
            result.finish_reason = "length"
            return
        result.finish_reason = "stop"
        matched = finish.get("matched")
        if isinstance(matched, int) and not isinstance(matched, bool):
            if not result.output_ids or result.output_ids[-1] != matched:
                result.output_ids.append(matched)  # the stop token belongs to the history either way
            result.end_id = matched

    def reply_message(self) -> dict[str, Any]:
        """The assistant message as the agent receives it (and will send it back)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.result.content or None}
        if self.result.tool_calls:
            message["tool_calls"] = [c.to_openai() for c in self.result.tool_calls]
        return message
