"""OpenAI-style errors: one exception type carries status, type, message, param and code.

Every failure the agent sees goes through :func:`error_response`, so clients that parse OpenAI's
error envelope (``{"error": {"message", "type", "param", "code"}}``) handle ours unchanged.
"""

from __future__ import annotations

from aiohttp import web


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


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def engine_unavailable(message: str) -> APIError:
    return APIError(503, message, type="engine_unavailable", code="engine_unavailable")


def engine_error(message: str) -> APIError:
    return APIError(502, message, type="engine_error", code="engine_error")


def engine_timeout(message: str) -> APIError:
    return APIError(504, message, type="timeout", code="engine_timeout")


def error_response(err: APIError) -> web.Response:
    return web.json_response(err.body(), status=err.status, headers=err.headers)


@web.middleware
async def error_middleware(request: web.Request, handler):
    """Turn APIError and aiohttp's own HTTP errors into the OpenAI envelope; never leak a traceback."""
    try:
        return await handler(request)
    except APIError as err:
        return error_response(err)
    except web.HTTPRequestEntityTooLarge as exc:
        return error_response(APIError(413, f"request body too large: {exc.text}", code="body_too_large"))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kind = "not_found" if exc.status == 404 else "invalid_request_error"
        return error_response(APIError(exc.status, exc.reason or "error", type=kind))
    except Exception:  # noqa: BLE001 - the last line of defence: log, answer 500, keep serving
        request.app.logger.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(APIError(500, "internal error in the sidecar", type="server_error"))
