"""SGLang 0.5.23's HTTP routes, its ``--api-key`` rule and its SSE framing, as one table.

``simulator/server.py`` answers this contract (``../shared/docs/sglang-0.5.23-internals.md``) for
``simulate --serve`` and for the tests' stand-in (``simulator/standin.py``); clients' tests read
its streams with ``parse_sse``. No sglang import.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from aiohttp import web

# SGLang accepts large bodies (a 200K-token history of ids is ~1.5 MB of JSON; batch requests more).
MAX_BODY_BYTES = 256 * 1024 * 1024
# sglang/srt/utils/auth.py decide_request_auth: probes and scrapes never need the key
OPEN_PATH_PREFIXES = ("/health", "/ready", "/metrics")


class SGLangRoutes(Protocol):
    """The handlers an SGLang stand-in provides, one per route of the contract."""

    async def handle_generate(self, request: web.Request) -> web.StreamResponse: ...
    async def handle_abort(self, request: web.Request) -> web.StreamResponse: ...
    async def handle_server_info(self, request: web.Request) -> web.StreamResponse: ...
    async def handle_model_info(self, request: web.Request) -> web.StreamResponse: ...
    async def handle_health(self, request: web.Request) -> web.StreamResponse: ...
    async def handle_open_session(self, request: web.Request) -> web.StreamResponse: ...
    async def handle_close_session(self, request: web.Request) -> web.StreamResponse: ...
    async def handle_flush_cache(self, request: web.Request) -> web.StreamResponse: ...
    async def handle_models(self, request: web.Request) -> web.StreamResponse: ...
    async def handle_metrics(self, request: web.Request) -> web.StreamResponse: ...
    async def handle_set_internal_state(self, request: web.Request) -> web.StreamResponse: ...


def sglang_app(routes: SGLangRoutes, middlewares: Sequence[Any] = ()) -> web.Application:
    """An aiohttp app routing SGLang's paths (and their aliases) to ``routes``."""
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=list(middlewares))
    app.router.add_route("POST", "/generate", routes.handle_generate)
    app.router.add_route("PUT", "/generate", routes.handle_generate)
    app.router.add_post("/abort_request", routes.handle_abort)
    for path in ("/server_info", "/get_server_info"):
        app.router.add_get(path, routes.handle_server_info)
    app.router.add_get("/model_info", routes.handle_model_info)
    for path in ("/health", "/health_generate", "/ready"):
        app.router.add_get(path, routes.handle_health)
    for method in ("GET", "POST"):
        app.router.add_route(method, "/open_session", routes.handle_open_session)
        app.router.add_route(method, "/close_session", routes.handle_close_session)
        app.router.add_route(method, "/flush_cache", routes.handle_flush_cache)
    app.router.add_get("/v1/models", routes.handle_models)
    app.router.add_get("/metrics", routes.handle_metrics)
    for method in ("POST", "PUT"):
        app.router.add_route(method, "/set_internal_state", routes.handle_set_internal_state)
    return app


def api_key_guard(api_key: str) -> Any:
    """SGLang's ``--api-key``: every route but the health, readiness and metrics ones needs
    ``Authorization: Bearer <key>``; otherwise ``401 {"error": "Unauthorized"}``."""

    @web.middleware
    async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method != "OPTIONS" and not request.path.startswith(OPEN_PATH_PREFIXES):
            scheme, _, token = (request.headers.get("Authorization") or "").partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(token, api_key):
                return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return guard


def parse_sse(raw: str | bytes) -> list[Any]:
    """An SSE body split into its decoded ``data:`` payloads; ``[DONE]`` stays a string."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    events: list[Any] = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                data = line[len("data: "):]
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


@contextlib.contextmanager
def serve_in_thread(server: Any, host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0,
                    name: str = "sglang-stand-in") -> Iterator[str]:
    """Serve a stand-in (``await server.start(host, port) -> url``, ``await server.stop()``) from a
    background thread with its own event loop; yields its URL. For synchronous callers (the official
    ``openai`` client, tests, notebooks); touch the server only from that thread while it runs."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name=name, daemon=True)
    thread.start()
    try:
        yield asyncio.run_coroutine_threadsafe(server.start(host, port), loop).result(timeout)
    finally:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(server.stop(), loop).result(timeout)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        loop.close()
