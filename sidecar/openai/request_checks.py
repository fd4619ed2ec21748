"""Request-level input checks that run before a request touches sessions or the engine.

Body size and JSON well-formedness (413/400), session ids (length and charset), and template
variables that may not replace the chat template itself. Schema validation lives in schema.py.
"""

from __future__ import annotations

import functools
import inspect
import re
from typing import Any

from aiohttp import web
from pydantic import ValidationError
from pydantic_core import from_json

from sidecar.server import keys
from sidecar.errors import APIError, invalid_request
from sidecar.openai.schema import ChatCompletionRequest

SESSION_ID_RE = re.compile(r"^[A-Za-z0-9._:@\-]{1,128}$")
# A \uD800-\uDFFF escape without its pair: JSON allows it, UTF-8 (and so the tokenizer) does not.
_LONE_SURROGATE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)


async def read_body(request: web.Request) -> bytes:
    """The raw body, within the configured size (413 beyond it)."""
    if request.content_length is not None and request.content_length > request.app[keys.SETTINGS].server.max_body_bytes:
        raise APIError(413, "request body too large", code="body_too_large")
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise APIError(413, "request body too large", code="body_too_large") from None


async def read_json_body(request: web.Request) -> Any:
    """The body decoded as JSON (any JSON value); 400 for malformed JSON or unpaired surrogates."""
    raw = await read_body(request)
    try:
        return from_json(raw)
    except ValueError as exc:
        raise _invalid_json(raw, str(exc)) from None


def parse_chat_request(raw: bytes) -> ChatCompletionRequest:
    """Parse and validate the raw body in one pass: pydantic-core's JSON parser builds the model
    directly, without the intermediate dicts of ``json.loads``. It rejects malformed JSON, nesting
    past its recursion limit and unpaired surrogate escapes itself; each becomes one 400."""
    try:
        return ChatCompletionRequest.model_validate_json(raw)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        if err["type"] == "json_invalid":
            raise _invalid_json(raw, err["msg"].removeprefix("Invalid JSON: ")) from None
        if err["type"] == "model_type" and not err["loc"]:
            raise invalid_request("request body must be a JSON object") from None
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        raise invalid_request(f"{loc}: {msg}" if loc else msg, param=loc or None) from None


def _invalid_json(raw: bytes, detail: str) -> APIError:
    """pydantic-core's parser refused the body; an unpaired surrogate escape gets its own words.
    (The regex only runs when a \\uD escape is there at all: a memchr-speed find first.)"""
    if (b"\\ud" in raw or b"\\uD" in raw) and _LONE_SURROGATE.search(raw):
        return invalid_request("request body holds an unpaired surrogate escape (not valid Unicode)")
    return invalid_request(f"request body is not valid JSON: {detail}")


def explicit_session_id(request: web.Request, req: ChatCompletionRequest) -> str | None:
    sid = request.headers.get("X-Session-Id") or req.session_id or req.user
    if sid is None:
        return None
    if not SESSION_ID_RE.match(sid):
        raise invalid_request("session id must be 1-128 characters of A-Z a-z 0-9 . _ : @ -", param="session_id")
    return sid


@functools.cache
def _template_call_params(tokenizer_type: type) -> frozenset[str]:
    """apply_chat_template's own parameters (chat_template, tokenize, ...): never template variables."""
    params = inspect.signature(tokenizer_type.apply_chat_template).parameters.values()
    return frozenset(p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)) - {"self"}


def check_template_kwargs(kwargs: dict[str, Any] | None, tokenizer) -> None:
    """chat_template_kwargs are template variables (enable_thinking, ...); they may not swap the
    template itself, whose Jinja loops would run on the event loop and stall every session."""
    reserved = sorted(set(kwargs or ()) & _template_call_params(type(tokenizer)))
    if reserved:
        raise invalid_request(f"chat_template_kwargs may not set {', '.join(reserved)}", param="chat_template_kwargs")
