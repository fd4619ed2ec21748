"""A request body into a front door's pydantic model, every failure one 400 in the door's words."""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable, TypeVar

from pydantic import BaseModel, ValidationError

from sidecar.errors import invalid_json, invalid_request

M = TypeVar("M", bound=BaseModel)


def parse_body(model: type[M], raw: bytes) -> M:
    """Parse and validate the raw body in one pass: pydantic-core's JSON parser builds the model
    directly, without the intermediate dicts of ``json.loads``. It rejects malformed JSON, nesting
    past its recursion limit and unpaired surrogate escapes itself; each becomes one 400 that names
    the offending field."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        err = errors[0]
        if err["type"] == "json_invalid":
            raise invalid_json(raw, err["msg"].removeprefix("Invalid JSON: ")) from None
        if err["type"] == "model_type" and not err["loc"]:
            raise invalid_request("request body must be a JSON object") from None
        err, loc = _most_telling(errors, raw)
        msg = err["msg"].removeprefix("Value error, ")
        raise invalid_request(f"{loc}: {msg}" if loc else msg, param=loc or None) from None


def _most_telling(errors: list[dict[str, Any]], raw: bytes) -> tuple[dict[str, Any], str]:
    """Of the errors pydantic found (one per member of a union the value failed), the one that says
    most, with its place in the body as the client wrote it. A value that is neither a string nor a
    list of blocks fails both; the list's own complaint (a block's missing field) is the one to
    show, not that it is no string. A wrong type tells least; among the rest the deepest wins."""
    try:
        body = json.loads(raw)
    except ValueError:  # not JSON that the stdlib reads (pydantic-core did): the path as pydantic gives it
        body = None
    ranked = []
    for n, err in enumerate(errors):
        path = _body_path(body, err) if body is not None else [str(p) for p in err["loc"]]
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
