"""The OpenAI chat-completions request as we accept it (pydantic); the answers' shapes are in
``sidecar.openai.shapes``.

Validation is strict where a wrong value would silently change what the model sees (roles,
content parts, n, tool_choice, types: ``max_tokens`` is an integer, not ``true`` or ``"5"``) and
lenient for harmless client extras (unknown top-level keys are ignored, as OpenAI-compatible
servers commonly do). Sampling values are held to the ranges SGLang 0.5.23 accepts
(``SamplingParams.verify``), so none reaches the engine that it would refuse or overflow on.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sidecar.frontdoor.request_model import MAX_STOP_COUNT, TOOL_NAME_PATTERN, TOP_K_ALL, check_counts, parse_body
from sidecar.frontdoor.canonical_messages import tool_call


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(min_length=1)
    arguments: str = "{}"


class ToolCallIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, content: Any) -> Any:
        """Name a content part the text-only engine cannot take (image_url, input_audio, file, ...)
        instead of letting the str | list union report that it is not a string."""
        if isinstance(content, list):
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if isinstance(kind, str) and kind != "text":
                    raise ValueError(f"content parts of type {kind!r} are not supported: the sidecar serves text only")
        return content

    @model_validator(mode="after")
    def _check_role_fields(self) -> "Message":
        if self.role != "assistant" and self.content is None:
            raise ValueError(f"a {self.role} message needs content")
        if self.role != "assistant" and self.tool_calls:
            raise ValueError("only assistant messages may carry tool_calls")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def to_template(self) -> dict[str, Any]:
        """The dict a Hugging Face chat template expects (arguments as objects, developer=system)."""
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.reasoning_content is not None:
            out["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            out["tool_calls"] = [tool_call(c.id, c.function.name, c.function.arguments) for c in self.tool_calls]
        return out


INT64 = 2**63


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: FunctionDef


class NamedToolChoiceFunction(BaseModel):
    name: str = Field(pattern=TOOL_NAME_PATTERN)


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedToolChoiceFunction


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP_COUNT)] | None = None
    seed: Annotated[int, Field(ge=-INT64, lt=INT64)] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    logprobs: bool | None = None
    user: str | None = None
    session_id: str | None = None
    # SGLang sampling extras, passed through to sampling_params.
    ignore_eos: bool | None = None
    top_k: Annotated[int, Field(ge=-1, le=TOP_K_ALL)] | None = None  # -1: the whole vocabulary
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0, le=2)] | None = None
    min_tokens: Annotated[int, Field(ge=0)] | None = None
    stop_token_ids: Annotated[list[Annotated[int, Field(ge=0, lt=2**31)]], Field(max_length=1024)] | None = None
    skip_special_tokens: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("n")
    @classmethod
    def _only_one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported")
        return n

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, stop):
        if isinstance(stop, str):
            stop = [stop]
        if stop is not None and any(not s for s in stop):
            raise ValueError("stop strings must not be empty")
        return stop

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, top_k):
        if top_k == 0:
            raise ValueError("top_k must be -1 (the whole vocabulary) or at least 1")
        return top_k

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, logprobs):
        if logprobs:
            raise ValueError("logprobs are not supported by the sidecar")
        return logprobs

    @model_validator(mode="after")
    def _check_tools(self) -> "ChatCompletionRequest":
        if isinstance(self.tool_choice, NamedToolChoice) or self.tool_choice == "required":
            if not self.tools:
                raise ValueError("tool_choice requires tools")
        if isinstance(self.tool_choice, NamedToolChoice):
            names = {t.function.name for t in self.tools or []}
            if self.tool_choice.function.name not in names:
                raise ValueError(f"tool_choice names unknown tool {self.tool_choice.function.name!r}")
        return self

    @property
    def wanted_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def template_tools(self) -> list[dict[str, Any]] | None:
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None


def parse_chat_request(body: Any, limits) -> ChatCompletionRequest:
    """The parsed body (strict JSON from ``sidecar.server.request_body``) as a ChatCompletionRequest,
    validated in strict mode (no coercion of strings or booleans into numbers) after its counts
    (``limits``: ServerSettings' max_messages, max_tools, max_content_parts); else one 400 naming
    the offending field."""
    check_counts(body, limits)
    return parse_body(ChatCompletionRequest, body)
