"""The Responses request as we accept it (pydantic), and its conversion to canonical messages.

Stateless use only: the agent sends the whole conversation as ``input`` each turn, and its
sessions are recognised from that history as on every door. Stored responses (``store: true``,
``previous_response_id``, ``conversation``, ``background``) are refused with a 400 that says so.
Input items are ``message`` (text parts; ``developer`` and ``system`` messages are system turns),
``function_call`` and ``function_call_output``; any other item or content part is a 400 that names it.
Tools: ``function`` tools, and ``namespace`` tools (a named group of functions, as Codex sends its
sub-agent tools), flattened into their functions: the model sees each function by its own name and
a call comes back with its ``namespace``, as OpenAI answers. Hosted tools, which run on OpenAI's side
(``web_search``, ``file_search``, ...), are dropped with a logged note (Codex sends ``web_search``
by default); client tools of other kinds (``custom``, ``local_shell``) are a 400. Harmless extras
(``reasoning``, ``include``, ``prompt_cache_key``, ``client_metadata``, ``user``, ``truncation``,
``service_tier``) are ignored.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, field_validator

from sidecar.frontdoor.request_model import TOOL_NAME_PATTERN, check_counts, known_types, parse_body
from sidecar.frontdoor.canonical_messages import ToolCallLedger, function_tool, tool_call, tool_message

log = logging.getLogger("sidecar.responses")

# Tools OpenAI runs itself: no model behind the sidecar can call them, so they are left out
HOSTED_TOOLS = frozenset({
    "web_search", "web_search_preview", "web_search_preview_2025_03_11", "file_search", "code_interpreter",
    "image_generation", "computer_use_preview", "computer_use", "mcp", "tool_search",
})
_noted_hosted: set[str] = set()  # hosted tool types already logged (once per process each)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")  # annotations, logprobs of an echoed output_text
    type: Literal["input_text", "output_text"]
    text: str


_TEXT_PARTS = BeforeValidator(known_types(["input_text", "output_text"], "content part"))


def _text(content: str | list[TextPart]) -> str:
    return content if isinstance(content, str) else "".join(p.text for p in content)


class MessageItem(BaseModel):
    model_config = ConfigDict(extra="ignore")  # id, status of an echoed output message
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | Annotated[list[TextPart], _TEXT_PARTS]


class FunctionCallItem(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str


class FunctionCallOutputItem(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | Annotated[list[TextPart], _TEXT_PARTS]


_ITEM_TYPES = ["message", "function_call", "function_call_output"]


def _item_type(item: Any) -> str | None:
    if isinstance(item, dict):
        return item.get("type", "message")  # an easy input message has no type
    return getattr(item, "type", None)


InputItem = Annotated[
    Union[
        Annotated[MessageItem, Tag("message")],
        Annotated[FunctionCallItem, Tag("function_call")],
        Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    ],
    Discriminator(_item_type),
]


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    name: str = Field(pattern=TOOL_NAME_PATTERN)  # written into the prompt and the forced tool-call prefix
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamespaceTool(BaseModel):
    """A named group of function tools; its functions are offered to the model by their own names."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["namespace"]
    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str | None = None
    tools: Annotated[list[FunctionTool], BeforeValidator(known_types(["function"], "namespace tool"))]


def _drop_hosted_tools(tools: Any) -> Any:
    """Hosted tools out (each type noted in the log once), then only function and namespace tools."""
    if not isinstance(tools, list):
        return tools
    kept = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if isinstance(kind, str) and kind in HOSTED_TOOLS:
            if kind not in _noted_hosted:
                _noted_hosted.add(kind)
                log.info("tools[%d]: the hosted tool %r is left out (OpenAI runs it; the served model cannot)", i, kind)
            continue
        kept.append(tool)
    return known_types(["function", "namespace"], "tool")(kept)


ToolEntry = Annotated[
    Union[Annotated[FunctionTool, Tag("function")], Annotated[NamespaceTool, Tag("namespace")]],
    Discriminator(lambda t: t.get("type") if isinstance(t, dict) else getattr(t, "type", None)),
]


class NamedFunction(BaseModel):
    type: Literal["function"]
    name: str = Field(pattern=TOOL_NAME_PATTERN)


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")  # verbosity
    format: TextFormat | None = None


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    input: str | Annotated[list[InputItem], BeforeValidator(known_types(_ITEM_TYPES, "input item", default="message"))]
    instructions: str | None = None
    tools: Annotated[list[ToolEntry], BeforeValidator(_drop_hosted_tools)] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    stream: bool = False
    metadata: dict[str, str] | None = None
    text: TextConfig | None = None
    ignore_eos: bool | None = None  # an SGLang sampling extra, as on the chat-completions door
    # refused: the sidecar keeps no responses
    store: bool | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    background: bool | None = None
    top_logprobs: int | None = None

    @field_validator("store", "background")
    @classmethod
    def _nothing_kept(cls, value: bool | None, info) -> bool | None:
        if value:
            raise ValueError(f"{info.field_name}=true is not supported: the sidecar keeps no responses; send the whole conversation as input")
        return value

    @field_validator("previous_response_id", "conversation")
    @classmethod
    def _no_stored_history(cls, value: Any, info) -> Any:
        if value is not None:
            raise ValueError(
                f"{info.field_name} is not supported: the sidecar keeps no responses; send the whole conversation as input "
                "(its sessions recognise the history)"
            )
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _no_logprobs(cls, value: int | None) -> int | None:
        if value:
            raise ValueError("logprobs are not supported by the sidecar")
        return value

    @field_validator("tools")
    @classmethod
    def _unique_function_names(cls, tools: list | None) -> list | None:
        names = [f.name for f, _ in _flat(tools)]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ValueError(f"two tools are named {dup!r} (a namespace's functions are offered by their own names)")
        return tools

    @field_validator("tool_choice")
    @classmethod
    def _choice_needs_tools(cls, choice, info):
        tools = [f for f, _ in _flat(info.data.get("tools"))]
        if (isinstance(choice, NamedFunction) or choice == "required") and not tools:
            raise ValueError("tool_choice requires tools")
        if isinstance(choice, NamedFunction) and choice.name not in {t.name for t in tools}:
            raise ValueError(f"tool_choice names unknown tool {choice.name!r}")
        return choice

    def template_messages(self) -> list[dict[str, Any]]:
        """The canonical messages: instructions first, then the items in order. A run of assistant
        output items (messages and function calls) is one assistant turn, as the response that
        produced them was, so the reply the sidecar recorded is recognised when echoed back."""
        out: list[dict[str, Any]] = []
        if self.instructions:
            out.append({"role": "system", "content": self.instructions})
        items = [MessageItem(role="user", content=self.input)] if isinstance(self.input, str) else self.input
        ledger = ToolCallLedger()
        turn: dict[str, Any] | None = None  # the assistant turn the last item belongs to
        for i, item in enumerate(items):
            if isinstance(item, FunctionCallOutputItem):
                ledger.answer(item.call_id, f"input.{i}", "function_call", "function_call_output")
                out.append(tool_message(item.call_id, _text(item.output)))
                turn = None
                continue
            if isinstance(item, MessageItem) and item.role != "assistant":
                out.append({"role": "user" if item.role == "user" else "system", "content": _text(item.content)})
                ledger.called(out[-1])
                turn = None
                continue
            if turn is None:
                turn = {"role": "assistant", "content": ""}
                out.append(turn)
            if isinstance(item, MessageItem):
                turn["content"] += _text(item.content)
            else:
                turn.setdefault("tool_calls", []).append(tool_call(item.call_id, item.name, item.arguments))
            ledger.called(turn)
        return out

    def template_tools(self) -> list[dict[str, Any]] | None:
        flat = _flat(self.tools)
        return [function_tool(t.name, t.description, t.parameters) for t, _ in flat] if flat else None

    def namespaces(self) -> dict[str, str]:
        """Each namespaced function's namespace, by the function's name (what a call carries back)."""
        return {t.name: ns for t, ns in _flat(self.tools) if ns is not None}


def _flat(tools: list | None) -> list[tuple[FunctionTool, str | None]]:
    """Every function tool with its namespace (None at the top level), in the order given."""
    out: list[tuple[FunctionTool, str | None]] = []
    for tool in tools or ():
        if isinstance(tool, NamespaceTool):
            out += [(t, tool.name) for t in tool.tools]
        else:
            out.append((tool, None))
    return out


def parse_responses_request(body: Any, limits) -> ResponsesRequest:
    """The parsed body (strict JSON), its counts checked (input items as messages; ``limits``:
    ServerSettings), validated strictly."""
    check_counts(body, limits, messages="input")
    return parse_body(ResponsesRequest, body)
