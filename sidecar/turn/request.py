"""What a front door hands the core for one turn, in no wire format's words."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from sidecar.engine.generate import Sampling


@dataclass
class TurnRequest:
    messages: list[dict[str, Any]]  # chat-template shape: role, content text, tool_calls, name, tool_call_id
    tools: list[dict[str, Any]] | None = None  # chat-template shape ({"type": "function", "function": {...}})
    tool_choice: Literal["auto", "none", "required"] | None = None
    forced_tool: str | None = None  # with tool_choice "required": the one tool to call (a named choice)
    template_kwargs: dict[str, Any] | None = None  # chat template variables (enable_thinking, ...)
    session_id: str | None = None  # the client's explicit session id, unchecked (None: recognise it)
    scope: str = ""  # whose sessions these are (the API key's scope; "" without auth)
    stop: list[str] | None = None  # stop strings (the sidecar enforces them)
    sampling: Sampling = field(default_factory=Sampling)
