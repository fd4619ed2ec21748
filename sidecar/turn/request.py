"""What a front door hands the core for one turn, in no wire format's words."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from sidecar.errors import invalid_request


@dataclass(frozen=True)
class Sampling:
    """What a turn asks of the sampler (None: SGLang's default)."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    seed: int | None = None
    stop_token_ids: list[int] | None = None


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


def check_counts(messages: int, tools: int, limits: Any, messages_param: str = "messages") -> None:
    """The one rule on how many messages and tools a turn carries (``limits``: ServerSettings'
    max_messages, max_tools): a 400 past either. The doors apply it to the body as sent, before
    validating it (``sidecar.frontdoor.request_model.check_counts``), the core to the turn a door made of it."""
    if messages > limits.max_messages:
        raise invalid_request(f"too many {messages_param} ({messages} > {limits.max_messages})", param=messages_param)
    if tools > limits.max_tools:
        raise invalid_request(f"too many tools ({tools} > {limits.max_tools})", param="tools")
