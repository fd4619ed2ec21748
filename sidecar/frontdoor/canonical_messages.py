"""The canonical messages every front door converts its wire format to: the chat-template shape
(role, content text, tool_calls with name + arguments, tool_call_id). Session recognition
fingerprints exactly these, so a tool call must become the same dict whichever door it came
through, and the reply an agent echoes back matches the reply the sidecar recorded."""

from __future__ import annotations

import json
from typing import Any

from pydantic_core import from_json

from sidecar.errors import invalid_request
from sidecar.frontdoor.json_slices import LONG_STRING_BYTES, parse_json


def json_or_str(arguments: str) -> Any:
    """Tool-call arguments as the template renders them: the parsed JSON, or the string as sent.
    Long arguments are parsed with their long strings a slice at a time (``json_slices``: no
    call holds the GIL for long); what the parser returns is the same."""
    try:
        if len(arguments) >= LONG_STRING_BYTES:
            return parse_json(arguments.encode(), from_json)  # an unpaired surrogate: UnicodeEncodeError
        return from_json(arguments)  # pydantic-core's parser: every call of the history, every request
    except (TypeError, ValueError):
        pass
    try:
        return json.loads(arguments)  # what it refuses (an escaped lone surrogate, say) as before
    except (TypeError, ValueError):
        return arguments


def tool_call(call_id: str | None, name: str, arguments: Any) -> dict[str, Any]:
    """One call of an assistant message; ``arguments`` a JSON string (parsed here) or an object."""
    args = json_or_str(arguments) if isinstance(arguments, str) else arguments
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def assistant_message(text: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return message


def tool_message(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def function_tool(name: str, description: str | None, parameters: dict[str, Any] | None) -> dict[str, Any]:
    """A tool definition in the chat-template shape (the chat-completions door's ``tools`` entry)."""
    function: dict[str, Any] = {"name": name}
    if description is not None:
        function["description"] = description
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


class ToolCallLedger:
    """Which calls a tool result may answer: those of the latest assistant turn, until anything but
    a tool result follows it. A result for any other id is refused, because the template would
    render it as the answer to a call the model never made."""

    def __init__(self) -> None:
        self._open: set[str] = set()

    def called(self, message: dict[str, Any]) -> None:
        """A message was appended; an assistant turn opens its calls, any other turn closes them."""
        if message["role"] == "assistant":
            self._open = {c["id"] for c in message.get("tool_calls") or () if c.get("id")}
        elif message["role"] != "tool":
            self._open = set()

    def answer(self, call_id: str, where: str, call_word: str, result_word: str) -> None:
        if call_id not in self._open:
            raise invalid_request(
                f"{where}: {result_word} answers {call_id!r}, which is not a {call_word} of the assistant turn before it",
                param=where,
            )
