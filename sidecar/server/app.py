"""The aiohttp application: factory, startup/cleanup contexts, and the session lifecycle pass.

Startup asks SGLang who it is (/server_info: model, tokenizer path, KV capacity), loads the
tokenizer and chat template, and builds the policy, the session store and the turn core. A
background task forgets the sessions the policy says are done (releasing their leases in SGLang).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator

import aiohttp
from aiohttp import web

from sidecar.engine.capacity import EngineCapacity
from sidecar.engine.client import EngineClient
from sidecar.engine.worker import Worker, Workers
from sidecar.errors import APIError
from sidecar.metrics import SidecarMetrics
from sidecar.server import keys, routes
from sidecar.server.auth import AuthConfigError, auth_middleware, build_key_store
from sidecar.server.middleware import error_middleware, metrics_middleware
from sidecar.settings import SidecarSettings
from sidecar.turn.core import build_core

log = logging.getLogger("sidecar")


class StartupError(Exception):
    """The sidecar cannot start; the message says why in one line."""


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # transformers raises many kinds for a bad folder
        raise StartupError(f"cannot load a tokenizer from {path!r}: {exc}") from None


async def fetch_server_info(engine: EngineClient, wait_s: float, delay: float = 1.0) -> dict[str, Any] | None:
    """SGLang's /server_info, retried for up to ``wait_s`` (SGLang often starts after the sidecar)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return await engine.server_info()
        except APIError as exc:
            if time.monotonic() + delay > deadline:
                log.warning("SGLang /server_info failed (%s); starting without it", exc.message)
                return None
            log.info("waiting for SGLang at %s (%s)", engine.base_url, exc.message)
            await asyncio.sleep(delay)


def create_app(settings: SidecarSettings, tokenizer=None) -> web.Application:
    """Build the application; ``tokenizer`` may be preloaded (the CLI does, to fail early)."""
    try:
        key_store = build_key_store(settings.server)
    except AuthConfigError as exc:
        raise StartupError(str(exc)) from None
    app = web.Application(
        client_max_size=settings.server.max_body_bytes,
        # sidecar.server.body decodes bodies in bounded steps; a body left unread (refused, too
        # slow) is drained for at most 1 s before its connection closes (aiohttp's default: 10 s)
        handler_args={"auto_decompress": False, "lingering_time": 1.0},
        middlewares=[metrics_middleware, error_middleware, auth_middleware(key_store, settings.server)],
    )
    app[keys.SETTINGS] = settings
    app[keys.METRICS] = SidecarMetrics()
    app[keys.BULK_BODIES] = asyncio.Semaphore(1)
    app.cleanup_ctx.append(_engine_context(tokenizer))
    app.cleanup_ctx.append(_lifecycle_context)
    app.router.add_post("/v1/chat/completions", routes.chat_completions)
    app.router.add_get("/v1/models", routes.models)
    app.router.add_get("/health", routes.health)
    app.router.add_get("/metrics", routes.metrics)
    app.router.add_get("/v1/sessions", routes.sessions)
    app.router.add_delete("/v1/sessions/{session_id}", routes.close_session)
    app.router.add_post("/close_session", routes.close_session)  # SGLang's own route, for drop-in clients
    return app


def _engine_context(preloaded_tokenizer):
    async def context(app: web.Application) -> AsyncIterator[None]:
        settings = app[keys.SETTINGS].server
        http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=settings.engine_keepalive),
            cookie_jar=aiohttp.DummyCookieJar(),  # SGLang sets no cookies; skip matching them per request
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=settings.connect_timeout),
        )
        engine = EngineClient(
            settings.sglang_url,
            http,
            request_timeout=settings.request_timeout,
            connect_timeout=settings.connect_timeout,
            connect_retries=settings.connect_retries,
            api_key=settings.sglang_api_key,
        )
        try:
            info = await fetch_server_info(engine, settings.startup_wait)
            tokenizer = preloaded_tokenizer
            if tokenizer is None:
                path = settings.tokenizer or (info or {}).get("tokenizer_path")
                if not path:
                    raise StartupError(
                        f"no tokenizer: SGLang at {settings.sglang_url} did not report one; pass --tokenizer DIR"
                    )
                tokenizer = await asyncio.get_running_loop().run_in_executor(None, load_tokenizer, path)
            configure(app, engine, tokenizer, info or {})
        except BaseException:
            await http.close()
            raise
        yield
        app[keys.TURNS].offload.close()
        await http.close()

    return context


def configure(app: web.Application, engine: EngineClient, tokenizer, info: dict[str, Any]) -> None:
    """One worker (the SGLang server at --sglang-url) and the turn core on it."""
    settings = app[keys.SETTINGS]
    metrics = app[keys.METRICS]
    workers = Workers([Worker(engine, EngineCapacity.from_server_info(info))])
    model_name = settings.server.model_name or info.get("served_model_name") or info.get("model_path") or "default"
    try:
        core = build_core(settings, tokenizer, workers, metrics, model_name)
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    metrics.sessions.set_function(lambda: len(core.sessions))
    metrics.session_bytes.set_function(lambda: core.sessions.nbytes)
    app[keys.WORKERS] = workers
    app[keys.RENDERER] = core.renderer
    app[keys.POLICY] = core.policy
    app[keys.SESSIONS] = core.sessions
    app[keys.TURNS] = core


async def _lifecycle_context(app: web.Application) -> AsyncIterator[None]:
    async def loop() -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                app[keys.SESSIONS].close_due(time.monotonic())
            except Exception:  # noqa: BLE001 - housekeeping must never die
                log.exception("session lifecycle pass failed")

    task = asyncio.create_task(loop())
    yield
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
