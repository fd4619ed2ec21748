"""A reply as content blocks: the runs of text between tool calls, and the tool calls.

The relay's events are a flat stream (content deltas, a call's start, its arguments). Anthropic's
content blocks and the Responses API's output items are both blocks: opened, filled, closed, one at
a time. :class:`ReplyBlocks` does that cutting once for every door that needs it, streamed or not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from sidecar.generation.tool_parsers import ContentDelta, Event, ToolCallArgumentsDelta, ToolCallStart


@dataclass
class Block:
    index: int  # position in the reply
    call: ToolCallStart | None  # None: a text block
    text: str = ""  # the text so far, or the call's arguments JSON so far


@dataclass(frozen=True)
class BlockStart:
    block: Block


@dataclass(frozen=True)
class BlockDelta:
    block: Block
    piece: str


@dataclass(frozen=True)
class BlockStop:
    block: Block


BlockEvent = Union[BlockStart, BlockDelta, BlockStop]


class ReplyBlocks:
    """Feed the relay's events in order; :meth:`finish` closes the last block. ``blocks`` is the
    reply so far, in order."""

    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self._open: Block | None = None

    def feed(self, event: Event) -> list[BlockEvent]:
        if isinstance(event, ContentDelta):
            out = [] if self._open is not None and self._open.call is None else self._start(None)
            block = self._open
        elif isinstance(event, ToolCallStart):
            return self._start(event)
        elif isinstance(event, ToolCallArgumentsDelta):
            block = self._open
            if block is None or block.call is None or block.call.index != event.index:
                raise ValueError(f"arguments for tool call {event.index}, which is not the open block")
            out = []
        else:
            raise TypeError(f"unknown relay event {event!r}")
        piece = event.text if isinstance(event, ContentDelta) else event.arguments
        block.text += piece
        out.append(BlockDelta(block, piece))
        return out

    def finish(self) -> list[BlockEvent]:
        """Close the open block, if any (the reply is complete)."""
        if self._open is None:
            return []
        block, self._open = self._open, None
        return [BlockStop(block)]

    def _start(self, call: ToolCallStart | None) -> list[BlockEvent]:
        out = self.finish()
        block = self._open = Block(len(self.blocks), call)
        self.blocks.append(block)
        out.append(BlockStart(block))
        return out
