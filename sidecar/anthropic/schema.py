"""The Messages API request as we accept it (pydantic), and its conversion to canonical messages.

``messages`` may hold ``system`` turns besides ``user`` and ``assistant`` ones (Claude Code sends
its agent listing so); each is a system message where it stands. Content blocks are strict: a user turn holds ``text`` and ``tool_result`` blocks, an assistant turn
``text`` and ``tool_use`` blocks, anything else (images, documents, thinking) is a 400 that names
it, as is a ``tool_result`` that answers no ``tool_use`` of the assistant turn before it. Harmless
client extras (``cache_control``, ``citations``, ``metadata``, ``thinking``, beta fields) are
ignored; Claude Code sends many.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from sidecar.errors import invalid_request
from sidecar.frontdoor.request_model import MAX_STOP_COUNT, TOOL_NAME_PATTERN, TOP_K_ALL, check_counts, known_types, parse_body
from sidecar.frontdoor.canonical_messages import ToolCallLedger, assistant_message, function_tool, tool_call, tool_message


class TextBlock(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ToolUseBlock(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]


_TEXT_ONLY = BeforeValidator(known_types(["text"], "content block"))


class ToolResultBlock(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | Annotated[list[TextBlock], _TEXT_ONLY] = ""
    is_error: bool | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(b.text for b in self.content)


UserBlock = Annotated[Union[TextBlock, ToolResultBlock], Field(discriminator="type")]
AssistantBlock = Annotated[Union[TextBlock, ToolUseBlock], Field(discriminator="type")]


class UserMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["user"]
    content: str | Annotated[list[UserBlock], BeforeValidator(known_types(["text", "tool_result"], "content block"))]


class AssistantMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["assistant"]
    content: str | Annotated[list[AssistantBlock], BeforeValidator(known_types(["text", "tool_use"], "content block"))]


class SystemMessage(BaseModel):
    """A system turn inside ``messages`` (Claude Code's beta ``mid-conversation-system``): rendered
    where it stands, as the chat template renders a system message that is not the first."""

    model_config = ConfigDict(extra="ignore")
    role: Literal["system"]
    content: str | Annotated[list[TextBlock], _TEXT_ONLY]


def _known_role(value: Any) -> Any:
    if isinstance(value, dict) and isinstance(value.get("role"), str) and value["role"] not in ("user", "assistant", "system"):
        # worded as Anthropic words it, which is what clients match to fall back
        raise ValueError(f"Unexpected role {value['role']!r}: the input message role must be 'user', 'assistant' or 'system'")
    return value


Message = Annotated[Union[UserMessage, AssistantMessage, SystemMessage], Field(discriminator="role"), BeforeValidator(_known_role)]


class ToolDef(BaseModel):
    """A client tool (``type`` absent or ``custom``); Anthropic's server tools run on Anthropic's side."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["custom"] | None = None
    name: str = Field(pattern=TOOL_NAME_PATTERN)  # written into the prompt and the forced tool-call prefix
    description: str | None = None
    input_schema: dict[str, Any]


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="ignore")  # disable_parallel_tool_use: the parser reads every call
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = Field(default=None, pattern=TOOL_NAME_PATTERN)

    @model_validator(mode="after")
    def _named(self) -> "ToolChoice":
        if (self.type == "tool") != (self.name is not None):
            raise ValueError("a tool_choice of type 'tool' (and only that) names the tool")
        return self


class CountTokensRequest(BaseModel):
    """What ``/v1/messages/count_tokens`` reads: the prompt, nothing about sampling."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    system: str | Annotated[list[TextBlock], _TEXT_ONLY] | None = None
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None

    @model_validator(mode="after")
    def _check_tools(self) -> "CountTokensRequest":
        choice = self.tool_choice
        if choice is not None and choice.type in ("any", "tool") and not self.tools:
            raise ValueError(f"tool_choice {choice.type!r} requires tools")
        if choice is not None and choice.type == "tool" and choice.name not in {t.name for t in self.tools or []}:
            raise ValueError(f"tool_choice names unknown tool {choice.name!r}")
        return self

    def template_messages(self) -> list[dict[str, Any]]:
        """The canonical messages: system first; each turn's blocks in order, a tool result as a
        tool message, consecutive text blocks as one message. Consecutive turns of one role are one
        turn (as Anthropic combines them), so a reply the client split is still the reply."""
        out: list[dict[str, Any]] = []
        if self.system:
            out.append({"role": "system", "content": _text(self.system)})
        ledger = ToolCallLedger()
        for role, blocks in _turns(self.messages):
            out += _turn_messages(role, blocks, ledger)
        if self.messages[-1].role == "assistant":
            raise invalid_request(
                "the last message is an assistant turn (prefill), which the sidecar does not continue", param="messages"
            )
        return out

    def template_tools(self) -> list[dict[str, Any]] | None:
        return [function_tool(t.name, t.description, t.input_schema) for t in self.tools] if self.tools else None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    temperature: Annotated[float, Field(ge=0, le=1)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=1, le=TOP_K_ALL)] | None = None
    stop_sequences: Annotated[list[str], Field(max_length=MAX_STOP_COUNT)] | None = None
    stream: bool = False
    ignore_eos: bool | None = None  # an SGLang sampling extra, as on the chat-completions door

    @field_validator("stop_sequences")
    @classmethod
    def _no_empty_stop(cls, stop: list[str] | None) -> list[str] | None:
        if stop is not None and any(not s for s in stop):
            raise ValueError("stop sequences must not be empty")
        return stop or None


def _text(content: str | list[TextBlock]) -> str:
    return content if isinstance(content, str) else "".join(b.text for b in content)


def _turns(messages: list[UserMessage | AssistantMessage | SystemMessage]) -> list[tuple[str, list[tuple[str, Any]]]]:
    """(role, [(where, block)]) of each turn, consecutive same-role messages merged; ``where`` is
    the block's place in the request (``messages.3.content.1``), for errors."""
    turns: list[tuple[str, list[tuple[str, Any]]]] = []
    for i, m in enumerate(messages):
        blocks = [TextBlock(type="text", text=m.content)] if isinstance(m.content, str) else m.content
        located = [(f"messages.{i}.content.{n}", b) for n, b in enumerate(blocks)]
        if turns and turns[-1][0] == m.role and m.role != "system":
            turns[-1][1].extend(located)
        else:
            turns.append((m.role, located))
    return turns


def _turn_messages(role: str, blocks: list[tuple[str, Any]], ledger: ToolCallLedger) -> list[dict[str, Any]]:
    if role == "system":
        message = {"role": "system", "content": "".join(b.text for _, b in blocks)}
        ledger.called(message)
        return [message]
    if role == "assistant":
        text = "".join(b.text for _, b in blocks if isinstance(b, TextBlock))
        calls = [tool_call(b.id, b.name, b.input) for _, b in blocks if isinstance(b, ToolUseBlock)]
        message = assistant_message(text, calls)
        ledger.called(message)
        return [message]
    out: list[dict[str, Any]] = []
    for where, block in blocks:
        if isinstance(block, ToolResultBlock):
            ledger.answer(block.tool_use_id, where, "tool_use", "tool_result")
            out.append(tool_message(block.tool_use_id, block.text()))
        elif out and out[-1]["role"] == "user":
            out[-1]["content"] += block.text
        else:
            out.append({"role": "user", "content": block.text})
            ledger.called(out[-1])
    return out


def parse_messages_request(body: Any, limits) -> MessagesRequest:
    """The parsed body (strict JSON), its counts checked (``limits``: ServerSettings), validated strictly."""
    check_counts(body, limits)
    return parse_body(MessagesRequest, body)


def parse_count_tokens_request(body: Any, limits) -> CountTokensRequest:
    check_counts(body, limits)
    return parse_body(CountTokensRequest, body)
