"""OpenAI-style errors: one exception type carries status, type, message, param and code.

Every layer raises :class:`APIError`; the server's error middleware answers it in OpenAI's
envelope (``{"error": {"message", "type", "param", "code"}}``), so clients that parse OpenAI's
errors handle ours unchanged (routes of another API answer in that API's envelope, built from the
same fields). No aiohttp here: any layer may import this module.
"""

from __future__ import annotations

import logging
import math
import re

_log = logging.getLogger("sidecar.engine")


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def retry_after(seconds: float) -> dict[str, str]:
    """The Retry-After header of an answer that asks the client to come back later: whole seconds,
    rounded up and at least 1 (a client told to retry before the wait is over is refused again)."""
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def engine_unavailable(message: str, cause: BaseException | None = None, code: str = "engine_unavailable") -> APIError:
    """503 with a stable code and a short message: the cause's kind, never its text (which is
    aiohttp's, may be long and says nothing the client can act on); the text goes to the log."""
    if cause is not None:
        _log.warning("%s: %s", message, cause)
        message = f"{message} ({type(cause).__name__})"
    return APIError(503, message, type="engine_unavailable", code=code)


def engine_error(message: str) -> APIError:
    return APIError(502, message, type="engine_error", code="engine_error")


def engine_timeout(message: str) -> APIError:
    return APIError(504, message, type="timeout", code="engine_timeout")


MODEL_NAME_SHOWN = 80  # characters of an unknown model name an error repeats


def model_not_found(model: str) -> APIError:
    """OpenAI's answer to a ``model`` it does not serve (the name shown escaped and cut short: it is
    the client's text, a NUL or a megabyte of it included)."""
    shown = model if len(model) <= MODEL_NAME_SHOWN else model[:MODEL_NAME_SHOWN] + "..."
    shown = shown.encode("unicode_escape").decode("ascii") if not shown.isprintable() else shown
    return APIError(
        404, f"The model `{shown}` does not exist or you do not have access to it.", param="model", code="model_not_found"
    )


def body_too_large(detail: str = "") -> APIError:
    return APIError(413, f"request body too large{': ' + detail if detail else ''}", code="body_too_large")


# A \uD800-\uDFFF escape without its pair: JSON allows it, UTF-8 (and so the tokenizer) does not.
LONE_SURROGATE = re.compile(
    rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}"
)


def invalid_json(raw: bytes, detail: str) -> APIError:
    """The 400 for a body pydantic-core's JSON parser refused; an unpaired surrogate escape gets its
    own words. (The regex only runs when a \\uD escape is there at all: a memchr-speed find first.)"""
    if (b"\\ud" in raw or b"\\uD" in raw) and LONE_SURROGATE.search(raw):
        return invalid_request("request body holds an unpaired surrogate escape (not valid Unicode)")
    return invalid_request(f"request body is not valid JSON: {detail}")
