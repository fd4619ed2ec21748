"""A request body into a front door's pydantic model, every failure one 400 in the door's words.

The body arrives read (:class:`RequestBody`): ``sidecar.server.request_body`` took it within its
limits; its strict JSON (no duplicate keys, no NaN/Infinity) is parsed in the same step as the
door validates it, inline or on the fair pool as the body's weight says. Here its lists are
counted (messages, tools, content parts) before anything is validated, and it is validated in
strict mode: no coercion of strings or booleans into numbers (``max_tokens`` is an integer, not
``true`` or ``"5"``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterable, TypeVar

from pydantic import BaseModel, ValidationError

from sidecar.errors import APIError, invalid_request
from sidecar.turn.offload import Prepare
from sidecar.turn.request import check_counts as check_turn_counts

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

# What a tool name may be: it is written into the prompt and into the forced tool-call prefix.
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_.:\-]{1,128}$"
# SGLang's ranges (SamplingParams.verify), for every door that passes these values on
TOP_K_ALL = 1 << 30  # SGLang's "whole vocabulary"; top_k is an int32 on the GPU
MAX_STOP_COUNT = 32  # stop strings per request


@dataclass(frozen=True)
class RequestBody:
    """A request's body, read within its limits but not parsed yet, and where its steps run.

    :meth:`parse` parses its JSON (``decode``: a 400 unless strict), validates it and converts it
    into what the door serves, in one step: inline while the body is light, else on the pool in its
    key's turn (``sidecar.turn.offload``, ``prepare``). A body of megabytes never holds the loop,
    and its validated model (objects the garbage collector would walk while the request waits for
    its tokens) is gone before the step ends."""

    decode: Callable[[], Any]
    prepare: Prepare

    async def parse(self, parser: Callable[..., M], *args, convert: Callable[[M], T]) -> tuple[str | None, Converted[T]]:
        """``parser(json, *args)``, then ``convert`` of it: the validated body's ``model`` and its
        conversion, a 400 of which is raised only by :meth:`Converted.value` (after the door
        checked the model name, as the door always has: the order of errors a client sees stays)."""
        return await self.prepare(_parsed, self.decode, parser, args, convert)


@dataclass(frozen=True)
class Converted(Generic[T]):
    """A validated body's conversion, or the APIError it raised."""

    result: T | None
    error: APIError | None

    def value(self) -> T:
        if self.error is not None:
            raise self.error
        return self.result


def _parsed(decode: Callable[[], Any], parser: Callable[..., M], args: tuple, convert: Callable[[M], T]) -> tuple[str | None, Converted[T]]:
    validated = parser(decode(), *args)
    try:
        return validated.model, Converted(convert(validated), None)
    except APIError as exc:
        return validated.model, Converted(None, exc.with_traceback(None))


def check_counts(body: Any, limits, messages: str = "messages", parts: str = "content") -> None:
    """Messages (``body[messages]``), tools and their content parts (a message's ``body[..][parts]``
    list) counted on the parsed JSON, before any is validated (``limits``: ServerSettings'
    max_messages, max_tools, max_content_parts)."""
    if not isinstance(body, dict):
        return
    items, tools = body.get(messages), body.get("tools")
    items = items if isinstance(items, list) else []
    check_turn_counts(len(items), len(tools) if isinstance(tools, list) else 0, limits, messages)
    n = sum(len(c) for m in items if isinstance(m, dict) and isinstance(c := m.get(parts), list))
    if n > limits.max_content_parts:
        raise invalid_request(f"too many content parts ({n} > {limits.max_content_parts})", param=messages)


def parse_body(model: type[M], body: Any) -> M:
    """Validate the parsed body in strict mode; a failure is one 400 that names the offending field
    (the most telling of pydantic's errors, at its place in the body as the client wrote it)."""
    try:
        return model.model_validate(body, strict=True)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        err = errors[0]
        if err["type"] == "model_type" and not err["loc"]:
            raise invalid_request("request body must be a JSON object") from None
        err, loc = _most_telling(errors, body)
        msg = err["msg"].removeprefix("Value error, ")
        raise invalid_request(f"{loc}: {msg}" if loc else msg, param=loc or None) from None


def _most_telling(errors: list[dict[str, Any]], body: Any) -> tuple[dict[str, Any], str]:
    """Of the errors pydantic found (one per member of a union the value failed), the one that says
    most, with its place in the body as the client wrote it. A value that is neither a string nor a
    list of blocks fails both; the list's own complaint (a block's missing field) is the one to
    show, not that it is no string. A wrong type tells least; among the rest the deepest wins."""
    ranked = []
    for n, err in enumerate(errors):
        path = _body_path(body, err)
        ranked.append((not err["type"].endswith("_type"), len(path), -n, err, ".".join(path)))
    _, _, _, err, loc = max(ranked, key=lambda r: r[:3])
    return err, loc


def _body_path(body: Any, err: dict[str, Any]) -> list[str]:
    """``err``'s location as keys and indexes of the body: pydantic also names the union member it
    tried (``str``, ``list[TextBlock]``, a tag), which the client never wrote."""
    path, node = [], body
    loc = err["loc"]
    for i, part in enumerate(loc):
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif not (i == len(loc) - 1 and err["type"] == "missing"):
            continue  # a union member's name
        path.append(str(part))
    return path


def known_types(supported: Iterable[str], what: str, default: str | None = None) -> Callable[[Any], Any]:
    """A before-validator for a list of tagged objects (content blocks, input items): an object whose
    ``type`` is not one of ``supported`` (or anything but an object) is refused by name, before
    pydantic tries each shape of the union and reports all of them. ``default``: the type of an
    object that has none."""
    allowed = tuple(supported)
    names = ", ".join(allowed)

    def check(items: Any) -> Any:
        if isinstance(items, list):
            for i, item in enumerate(items):
                if not isinstance(item, dict):
                    raise ValueError(f"{what} {i} must be an object with a type")
                kind = item.get("type", default)
                if kind not in allowed:
                    raise ValueError(f"{what} {i} has type {kind!r}; supported: {names}")
        return items

    return check
