"""The middlewares every route goes through: request metrics and the access log, and errors in
the envelope of the API the route speaks: the one its (sub-)application names under
``keys.ERROR_BODY`` (Anthropic's sub-application at ``/v1/messages``), else OpenAI's."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

from aiohttp import web

from sidecar import logs
from sidecar.conversation.store import SESSION_ID_RE
from sidecar.errors import APIError, body_too_large, invalid_request
from sidecar.frontdoor.session_id import SESSION_HEADER
from sidecar.metrics import CLIENT_CLOSED
from sidecar.server import keys
from sidecar.server.auth import SCOPE

access_log = logging.getLogger("sidecar.access")

def error_envelope(request: web.Request) -> Callable[[APIError], dict]:
    """How errors of ``request`` are shaped: as the application its route is in says (the
    innermost one: a sub-application's routes, and paths under its prefix, speak its API)."""
    return request.match_info.apps[-1].get(keys.ERROR_BODY, APIError.body)


@web.middleware
async def error_middleware(request: web.Request, handler):
    """Turn APIError and aiohttp's own HTTP errors into the route's error envelope; never leak a traceback."""
    envelope = error_envelope(request)

    def error_response(err: APIError) -> web.Response:
        response = web.json_response(envelope(err), status=err.status, headers=err.headers)
        if err.headers.get("Connection") == "close":
            response.force_close()  # e.g. a body that came too slowly: the rest is not waited for
        return response

    try:
        return await handler(request)
    except APIError as err:
        logs.note_error(err.code or err.type)
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
        logs.note_error(kind)
        return error_response(APIError(exc.status, exc.reason or "error", type=kind))
    except ConnectionError:
        raise  # the client went away while its answer was written: nobody to answer (counted as 499)
    except Exception:  # noqa: BLE001 - the last line of defence: log, answer 500, keep serving
        request.app.logger.exception("unhandled error on %s %s", request.method, request.path)
        logs.note_error("server_error")
        return error_response(APIError(500, "internal error in the sidecar", type="server_error"))


@web.middleware
async def metrics_middleware(request: web.Request, handler):
    """Count every request by route and status (499: the client closed the connection before its
    answer ended, which is no server error) and log it (:func:`log_access`)."""
    start = time.monotonic()
    route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
    status = 500
    with logs.request_context():
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        except (asyncio.CancelledError, ConnectionError):
            status = CLIENT_CLOSED
            raise
        finally:
            elapsed = time.monotonic() - start
            m = request.app[keys.METRICS]
            m.requests.labels(route=route, status=str(status)).inc()
            m.latency.labels(route=route).observe(elapsed)
            log_access(request, status, elapsed, request.app[keys.SETTINGS].server.log_slow_requests)


def log_access(request: web.Request, status: int, elapsed_s: float, slow_s: float) -> None:
    """One line per request: at info for 4xx/5xx (a client gone: 499), for a stream that ended in
    an error event and for requests slower than ``slow_s`` (0: none), at debug for the rest. It
    names the session and the key's scope, never anything the messages hold."""
    slow = bool(slow_s) and elapsed_s >= slow_s
    error = logs.current_error()
    level = logging.INFO if status >= 400 or error or slow else logging.DEBUG
    if not access_log.isEnabledFor(level):
        return
    session = logs.current_session() or _session_header(request)
    fields = {
        "method": request.method,
        "path": request.path,
        "status": status,
        "duration_ms": round(1000 * elapsed_s, 1),
        "session": session,
        "scope": request.get(SCOPE) or None,
        "error": error,
        "slow": slow,
    }
    text = f"{request.method} {request.path} {status} {fields['duration_ms']:.1f} ms"
    for name in ("session", "scope", "error"):
        if fields[name]:
            text += f" {name}={fields[name]}"
    access_log.log(level, "%s%s", text, " (slow)" if slow else "", extra=fields)


def _session_header(request: web.Request) -> str | None:
    """An explicit session id from the header (for requests refused before the session was known)."""
    value = request.headers.get(SESSION_HEADER)
    return value if value and SESSION_ID_RE.match(value) else None
