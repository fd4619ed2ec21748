"""SGLang 0.5.23's HTTP routes, as one table for the two stand-ins that serve them.

``simulator/server.py`` (the simulated engine behind ``simulate --serve``) and
``tests/sglang_double.py`` (the CI double with fault injection) answer the same contract
(``../shared/docs/sglang-0.5.23-internals.md``); one route table keeps their paths and methods
from drifting apart. No sglang import, so the double stays sglang-free.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Any, Protocol

from aiohttp import web

# SGLang accepts large bodies (a 200K-token history of ids is ~1.5 MB of JSON; batch requests more).
MAX_BODY_BYTES = 256 * 1024 * 1024



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


def sglang_app(routes: SGLangRoutes) -> web.Application:
    """An aiohttp app routing SGLang's paths (and their aliases) to ``routes``."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
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
    return app


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
