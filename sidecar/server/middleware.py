"""The middlewares every route goes through: request metrics, and errors in OpenAI's envelope."""

from __future__ import annotations

import time

from aiohttp import web

from sidecar.errors import APIError, body_too_large, invalid_request
from sidecar.server import keys


def error_response(err: APIError) -> web.Response:
    response = web.json_response(err.body(), status=err.status, headers=err.headers)
    if err.headers.get("Connection") == "close":
        response.force_close()  # e.g. a body that came too slowly: the rest is not waited for
    return response


@web.middleware
async def error_middleware(request: web.Request, handler):
    """Turn APIError and aiohttp's own HTTP errors into the OpenAI envelope; never leak a traceback."""
    try:
        return await handler(request)
    except APIError as err:
        return error_response(err)
    # Hidden inside strings the sidecar parses itself (tool-call arguments): text with unpaired
    # surrogates, nesting past the recursion limit. The client's fault: 400, not 500.
    except UnicodeError:
        return error_response(invalid_request("request holds text that is not valid Unicode (an unpaired surrogate)"))
    except RecursionError:
        return error_response(invalid_request("request is nested too deeply"))
    except web.HTTPRequestEntityTooLarge as exc:
        return error_response(body_too_large(exc.text))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        kind = "not_found" if exc.status == 404 else "invalid_request_error"
        return error_response(APIError(exc.status, exc.reason or "error", type=kind))
    except Exception:  # noqa: BLE001 - the last line of defence: log, answer 500, keep serving
        request.app.logger.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(APIError(500, "internal error in the sidecar", type="server_error"))


@web.middleware
async def metrics_middleware(request: web.Request, handler):
    start = time.monotonic()
    route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        m = request.app[keys.METRICS]
        m.requests.labels(route=route, status=str(status)).inc()
        m.latency.labels(route=route).observe(time.monotonic() - start)
