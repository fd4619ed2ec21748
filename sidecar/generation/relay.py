"""One generation: SGLang's cumulative output ids in, text and tool-call events out.

The relay detokenizes incrementally, applies stop strings (SGLang runs without a tokenizer, so
they are ours to enforce), and feeds the text through the tool-call parser. When it is done it
knows the exact ids the engine produced, which the session store records for the next turn.

It is also the one place that decides to abort the engine request: whenever reading stops while
SGLang may still be generating (a stop string matched, the agent went away, the engine timed
out), nobody will read the rest, so the request is aborted.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from sidecar.engine.client import EngineClient
from sidecar.errors import APIError, engine_error
from sidecar.generation.detokenize import IncrementalDetokenizer, StopMatcher
from sidecar.generation.tool_parsers import ContentDelta, Event, ToolCall, ToolCallArgumentsDelta, ToolCallStart


@dataclass
class GenerationResult:
    """What one generation produced; :meth:`add` folds its events in as they pass."""

    output_ids: list[int] = field(default_factory=list)
    end_id: int | None = None  # stop token that ended the reply, if any
    finish_reason: str = "stop"  # stop | length | tool_calls
    stop_sequence: str | None = None  # the stop string that ended the reply, if one did
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    first_token_at: float | None = None

    def add(self, event: Event) -> Event:
        if isinstance(event, ContentDelta):
            self.content += event.text
        elif isinstance(event, ToolCallStart):
            self.tool_calls.append(ToolCall(event.id, event.name))
        elif isinstance(event, ToolCallArgumentsDelta):
            call = self.tool_calls[event.index]
            self.tool_calls[event.index] = ToolCall(call.id, call.name, call.arguments + event.arguments)
        return event


def _newest(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """The chunk of a read that stands for all of it: the first that finished the reply (SGLang
    sends nothing after it but [DONE]), else the last (cumulative: it holds every id before it)."""
    if len(chunks) > 1:
        for chunk in chunks:
            if (chunk.get("meta_info") or {}).get("finish_reason") is not None:
                return chunk
    return chunks[-1]


class Generation:
    """Run one /generate stream and translate it; iterate :meth:`events`, read :attr:`result`,
    and :meth:`close` it when the turn is over, however it ended."""

    def __init__(
        self,
        engine: EngineClient,
        payload: dict[str, Any],
        tokenizer,
        parser,
        stop: list[str] | None,
        forced_text: str | None = None,
        on_tokens: Callable[[float, int], None] | None = None,
    ):
        """``on_tokens(interval_s, n)`` hears of every chunk that brought n new tokens after the
        first ones (inter-token latency)."""
        self.engine = engine
        self.on_tokens = on_tokens
        self.payload = payload
        self.rid = payload["rid"]
        self.detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=True)
        self.stop = StopMatcher(stop) if stop else None
        self.parser = parser
        self.forced_text = forced_text
        self.result = GenerationResult(prompt_tokens=len(payload["input_ids"]))
        self.finished = False
        self._engine_busy = False  # the request went to SGLang, which has not ended it

    async def events(self) -> AsyncIterator[Event]:
        """:meth:`batches`, an event at a time."""
        async for batch in self.batches():
            for event in batch:
                yield event

    async def batches(self) -> AsyncIterator[list[Event]]:
        """The reply's events, as lists (never empty) of what one read of SGLang's stream brought.

        A read may bring several chunks (the reader was behind, or the engine released several
        steps at once); SGLang's chunks are cumulative, so only the newest is detokenized and the
        text they add is parsed once: one content delta instead of one per chunk, the same text
        (the detokenizer, stop strings and tool-call parser give the same result however their
        input is split)."""
        result = self.result
        if self.forced_text:
            forced = [result.add(event) for event in self.parser.feed(self.forced_text)]
            if forced:
                yield forced
        stopped_by_string = False
        self._engine_busy = True
        seen, last_at = 0, 0.0
        finished = False
        try:
            async for chunks in self.engine.generate_batches(self.payload):
                if finished:
                    # past the finish only SGLang's [DONE] comes: reading it to the end of the body
                    # keeps the connection for the next turn (one left unread is closed, and the
                    # next turn pays a new TCP connection on both sides)
                    continue
                chunk = _newest(chunks)
                ids = chunk.get("output_ids") or []
                meta = chunk.get("meta_info") or {}
                if len(ids) > seen:
                    now = time.monotonic()
                    if result.first_token_at is None:
                        result.first_token_at = now
                    elif self.on_tokens is not None:
                        self.on_tokens(now - last_at, len(ids) - seen)
                    seen, last_at = len(ids), now
                result.output_ids = ids  # a fresh list per chunk (cumulative); the detokenizer keeps its own
                self._read_usage(meta)
                text = self.detok.update(ids)
                finish = meta.get("finish_reason")
                if self.stop is not None and text:
                    text, stopped_by_string = self.stop.feed(text)
                if text:
                    batch = [result.add(event) for event in self.parser.feed(text)]
                    if batch:
                        yield batch
                if stopped_by_string:
                    await self._abort()
                    result.finish_reason = "stop"
                    break
                if finish is not None:
                    self._engine_busy = False
                    self._read_finish(finish)
                    finished = True
            if not finished and not stopped_by_string:
                self._engine_busy = False
                raise engine_error("SGLang ended the stream without a finish reason")
        except APIError as err:
            if err.code != "engine_timeout":  # SGLang refused, failed or dropped it: nothing runs on
                self._engine_busy = False
            raise
        tail_events: list[Event] = []
        if not stopped_by_string:
            tail = self.detok.flush()
            if self.stop is not None:
                held, stopped_by_string = self.stop.feed(tail) if tail else ("", False)
                tail = held if stopped_by_string else held + self.stop.flush()
            if tail:
                tail_events += self.parser.feed(tail)
        tail_events += self.parser.finish()
        if self.stop is not None:
            result.stop_sequence = self.stop.matched
        last = [result.add(event) for event in tail_events]
        if result.tool_calls and result.finish_reason == "stop":
            result.finish_reason = "tool_calls"
        self.finished = True
        if last:
            yield last

    def close(self) -> None:
        """The turn is over. If SGLang may still be generating for it (the agent went away, the
        engine timed out), abort the request in the background: nobody reads the rest."""
        if self._engine_busy:
            self._engine_busy = False
            asyncio.ensure_future(self.engine.abort(self.rid))

    async def _abort(self) -> None:
        """Abort now, while the reply goes on (a stop string ended it before SGLang did)."""
        self._engine_busy = False
        await self.engine.abort(self.rid)

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
