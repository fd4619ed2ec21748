"""Tool-call extraction from generated text (Hermes ``<tool_call>`` format), and how to force one.

Qwen3 (and Hermes-style models) emit tool calls as::

    <tool_call>
    {"name": "fn", "arguments": {...}}
    </tool_call>

possibly several in a row, possibly after content text (including a
``<think>...</think>`` block, which stays in the content).

One state machine serves both modes: a whole text is just ``feed(text) + finish()``,
so streaming and non-streaming results agree by construction for any split
of the text into deltas. A parser also knows the text that opens a call in
its format (:meth:`HermesToolParser.forced_prefix`), which is how
``tool_choice`` required or named is enforced.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Union

from pydantic_core import from_json


def parse_json(text: str) -> Any:
    """``json.loads(text)``, by pydantic-core's parser (a tool call per turn, a few times cheaper);
    what it refuses (an escaped lone surrogate, say) takes the stdlib's way, so the result and
    the errors are json.loads' own."""
    try:
        return from_json(text)
    except ValueError:
        return json.loads(text)


@dataclass(frozen=True)
class ToolCall:
    """One tool call of a reply; ``arguments`` is a JSON string (OpenAI's function.arguments)."""

    id: str
    name: str
    arguments: str = ""


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArgumentsDelta:
    index: int
    arguments: str


Event = Union[ContentDelta, ToolCallStart, ToolCallArgumentsDelta]


def new_tool_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _held_prefix_len(text: str, pattern: str) -> int:
    """Longest suffix of ``text`` that is a proper prefix of ``pattern``."""
    for k in range(min(len(pattern) - 1, len(text)), 0, -1):
        if text.endswith(pattern[:k]):
            return k
    return 0


class _StrippedContent:
    """Emit content so that the concatenation equals ``all_content.strip()``.

    Leading whitespace is dropped and trailing whitespace is held until
    non-whitespace follows (dropped at the end), so streamed content matches the
    stripped non-streaming content exactly, e.g. the newline between the content
    and a following ``<tool_call>`` is never sent.
    """

    def __init__(self) -> None:
        self._started = False
        self._ws = ""

    def push(self, text: str) -> str:
        if not self._started:
            text = text.lstrip()
            if not text:
                return ""
            self._started = True
        body = text.rstrip()
        if not body:
            self._ws += text
            return ""
        out = self._ws + body
        self._ws = text[len(body) :]
        return out


class HermesToolParser:
    """Stateful parser for ``<tool_call>{json}</tool_call>`` blocks.

    Content streams immediately, except a held-back suffix that could be the
    start of ``<tool_call>``. A tool call's events (Start, then one
    ArgumentsDelta with the whole arguments JSON) are emitted when its block
    closes, or at :meth:`finish` if an unterminated block holds a well-formed
    call (e.g. ``</tool_call>`` was a stop string). A block whose body is not a
    JSON object with a string ``name`` is emitted verbatim as content: text is
    never lost.
    """

    OPEN = "<tool_call>"
    CLOSE = "</tool_call>"

    def __init__(self) -> None:
        self._buf = ""
        self._in_call = False  # True: _buf is the body after an OPEN tag
        self._index = 0
        self._content = _StrippedContent()
        self._finished = False

    def _emit_content(self, text: str, out: list[Event]) -> None:
        text = self._content.push(text)
        if text:
            out.append(ContentDelta(text))

    def _emit_block(self, body: str, closed: bool, out: list[Event]) -> None:
        call = self._parse_body(body)
        if call is None:
            self._emit_content(self.OPEN + body + (self.CLOSE if closed else ""), out)
            return
        name, arguments = call
        out.append(ToolCallStart(self._index, new_tool_call_id(), name))
        out.append(ToolCallArgumentsDelta(self._index, arguments))
        self._index += 1

    @staticmethod
    def _parse_body(body: str) -> tuple[str, str] | None:
        try:
            obj = parse_json(body)
        except ValueError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        args = obj.get("arguments", {})
        if isinstance(args, str):
            # Some models emit arguments pre-serialized; pass them through if valid JSON.
            try:
                parse_json(args)
            except ValueError:
                return None
            return obj["name"], args
        return obj["name"], json.dumps(args, ensure_ascii=False)

    def feed(self, text_delta: str) -> list[Event]:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        out: list[Event] = []
        self._buf += text_delta
        while True:
            if self._in_call:
                j = self._buf.find(self.CLOSE)
                if j < 0:
                    break
                self._emit_block(self._buf[:j], True, out)
                self._buf = self._buf[j + len(self.CLOSE) :]
                self._in_call = False
            else:
                i = self._buf.find(self.OPEN)
                if i < 0:
                    keep = _held_prefix_len(self._buf, self.OPEN)
                    self._emit_content(self._buf[: len(self._buf) - keep], out)
                    self._buf = self._buf[len(self._buf) - keep :]
                    break
                self._emit_content(self._buf[:i], out)
                self._buf = self._buf[i + len(self.OPEN) :]
                self._in_call = True
        return out

    def finish(self) -> list[Event]:
        if self._finished:
            return []
        self._finished = True
        out: list[Event] = []
        if self._in_call:
            self._emit_block(self._buf, False, out)
        else:
            self._emit_content(self._buf, out)
        self._buf = ""
        return out

    def forced_prefix(self, tool_name: str | None) -> str:
        """Text that, appended after the generation prompt, makes the model call a tool: the
        opening tag ('required'), with the name written for it (a named tool_choice)."""
        if tool_name is None:
            return self.OPEN + "\n"
        # JSON-escaped, and "<" ">" as \u escapes: whatever a front door let through, the name can
        # neither close the object nor the tag
        name = json.dumps(tool_name, ensure_ascii=False).replace("<", "\\u003c").replace(">", "\\u003e")
        return self.OPEN + '\n{"name": ' + name + ', "arguments": '


class NoToolParser:
    """Pass-through: all text is content, unmodified (no stripping)."""

    def feed(self, text_delta: str) -> list[Event]:
        return [ContentDelta(text_delta)] if text_delta else []

    def finish(self) -> list[Event]:
        return []

    def forced_prefix(self, tool_name: str | None) -> None:
        """No tool-call format, so nothing to force."""
        return None


_PARSERS = {"hermes": HermesToolParser, "qwen3": HermesToolParser, "none": NoToolParser}


def get_tool_parser(name: str | None) -> HermesToolParser | NoToolParser:
    """Return a fresh parser for ``name`` ("hermes", "qwen3", "none"; None = "none").

    Parsers are stateful: use one per request/choice.
    """
    key = (name or "none").lower()
    try:
        return _PARSERS[key]()
    except KeyError:
        raise ValueError(
            f"unknown tool parser {name!r}; choose from {sorted(_PARSERS)}"
        ) from None
