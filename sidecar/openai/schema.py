"""The OpenAI chat-completions request as we accept it (pydantic), and the response shapes we emit.

Validation is strict where a wrong value would silently change what the model sees (roles,
content parts, n, tool_choice) and lenient for harmless client extras (unknown top-level keys are
ignored, as OpenAI-compatible servers commonly do).
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sidecar.errors import APIError


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
            out["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": _json_or_str(c.function.arguments)}}
                for c in self.tool_calls
            ]
        return out


def _json_or_str(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except (TypeError, ValueError):
        return arguments


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["function"]
    function: FunctionDef


class NamedToolChoiceFunction(BaseModel):
    name: str


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
    stop: str | list[str] | None = None
    seed: int | None = None
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
    top_k: int | None = None
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0)] | None = None
    min_tokens: Annotated[int, Field(ge=0)] | None = None
    stop_token_ids: list[int] | None = None
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


def completion_id() -> str:
    import uuid

    return f"chatcmpl-{uuid.uuid4().hex}"


def usage_dict(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def chunk(cid: str, model: str, created: int, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }


# json.dumps(x, ensure_ascii=False) builds a new encoder per call; a frame per token pays that
_UNICODE_JSON = json.JSONEncoder(ensure_ascii=False)


class ChunkFrames:
    """SSE frames of one streamed completion, byte for byte ``data: <json.dumps(chunk(...))>``.

    A stream sends a chunk per token; the part every chunk shares (id, model, ...) is serialized
    once here, so a frame costs only the JSON of its delta.
    """

    _DELTA, _FINISH = "\x00delta\x00", "\x00finish\x00"  # placeholders: JSON escapes NUL, no real value has it

    def __init__(self, cid: str, model: str, created: int, include_usage: bool):
        self._usage = {"usage": None} if include_usage else {}
        self._chunk_args = (cid, model, created)
        text = json.dumps(chunk(cid, model, created, self._DELTA, self._FINISH) | self._usage, ensure_ascii=False)  # type: ignore[arg-type]
        delta, finish = json.dumps(self._DELTA), json.dumps(self._FINISH)
        self._parts: tuple[bytes, bytes, bytes] | None = None
        if text.count(delta) == 1 and text.count(finish) == 1 and text.index(delta) < text.index(finish):
            head, rest = text.split(delta)
            middle, tail = rest.split(finish)
            self._parts = (b"data: " + head.encode(), middle.encode(), tail.encode() + b"\n\n")

    def delta(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        if self._parts is None:  # a model name holding a placeholder: serialize whole
            return sse_frame(chunk(*self._chunk_args, delta, finish_reason) | self._usage)
        head, middle, tail = self._parts
        finish = b"null" if finish_reason is None else _UNICODE_JSON.encode(finish_reason).encode()
        return head + _UNICODE_JSON.encode(delta).encode() + middle + finish + tail

    def usage(self, usage: dict[str, Any]) -> bytes:
        return sse_frame(usage_chunk(*self._chunk_args, usage))


def sse_frame(payload: dict[str, Any]) -> bytes:
    return b"data: " + _UNICODE_JSON.encode(payload).encode() + b"\n\n"


def usage_chunk(cid: str, model: str, created: int, usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": [],
        "usage": usage,
    }


def completion(cid: str, model: str, message: dict[str, Any], finish_reason: str, usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": cid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
        "usage": usage,
    }


def stream_error_event(err: APIError) -> dict[str, Any]:
    return err.body()
