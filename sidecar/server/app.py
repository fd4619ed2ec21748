"""The aiohttp application: factory and startup/cleanup contexts.

Startup asks SGLang who it is (/server_info: model, tokenizer path, KV capacity), loads the
tokenizer and chat template, and builds the policy, the session store and the turn core. Beside
the requests run the background passes (``sidecar.server.background``): the session lifecycle and
the engine health probe.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
import time
from collections import Counter
from typing import Any, AsyncIterator

import aiohttp
from aiohttp import web

from sidecar.anthropic.shapes import error_body as anthropic_error_body
from sidecar.engine.capacity import EngineCapacity
from sidecar.engine.client import EngineClient
from sidecar.engine.fleet import engine_model_name
from sidecar.engine.health import EngineHealth
from sidecar.engine.worker import SmgGateway, Worker, Workers
from sidecar.errors import APIError
from sidecar.metrics import SidecarMetrics
from sidecar.server import keys, routes
from sidecar.server.auth import AuthConfigError, auth_middleware, build_key_store
from sidecar.server.background import background_contexts
from sidecar.server.connections import connection_guard
from sidecar.server.hosts import HostRule, host_middleware
from sidecar.server.middleware import error_middleware, metrics_middleware
from sidecar.server.summary import startup_summary
from sidecar.settings import SidecarSettings
from sidecar.turn.core import build_core

log = logging.getLogger("sidecar")


class StartupError(Exception):
    """The sidecar cannot start; the message says why in one line."""


def load_tokenizer(path: str):
    """The tokenizer of a local model folder, or of a Hugging Face repo id (``org/name``). A path
    that can only be a folder and is missing gets its own message: transformers would call it a
    malformed repo id."""
    from transformers import AutoTokenizer

    if not os.path.exists(path) and _is_folder_path(path):
        raise StartupError(f"cannot load a tokenizer from {path!r}: no such folder")
    try:
        return AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # transformers raises many kinds for a bad folder
        raise StartupError(f"cannot load a tokenizer from {path!r}: {exc}") from None


def _is_folder_path(path: str) -> bool:
    """Absolute, relative to . or ~, or with more than one separator: not an ``org/name`` repo id."""
    return os.path.isabs(path) or path.startswith((".", "~")) or path.count("/") > 1 or os.sep != "/" and os.sep in path


async def fetch_server_info(engine: EngineClient, wait_s: float, delay: float = 1.0) -> dict[str, Any] | None:
    """SGLang's /server_info, retried for up to ``wait_s`` (SGLang often starts after the sidecar)."""
    started = time.monotonic()
    deadline = started + wait_s
    waited = False
    while True:
        try:
            info = await engine.server_info()
        except APIError as exc:
            if time.monotonic() + delay > deadline:
                log.warning("SGLang /server_info failed (%s)", exc.message)
                return None
            if not waited:  # one line, not one per retry
                log.info("waiting up to %g s for SGLang at %s (%s)", wait_s, engine.base_url, exc.message)
            waited = True
            await asyncio.sleep(delay)
            continue
        if waited:
            log.info("SGLang answered after %.1f s", time.monotonic() - started)
        return info


async def _smg_worker_urls(gateway: SmgGateway | None, wait_s: float, delay: float = 1.0) -> list[str]:
    """The workers smg lists (waiting up to ``wait_s`` for it to list one); [] without smg."""
    if gateway is None:
        return []
    deadline = time.monotonic() + wait_s
    while True:
        try:
            listing = await gateway.read_listing()
            if listing:
                return [w.url for w in listing]
            why = "it lists no worker"
        except APIError as exc:
            why = exc.message
        if time.monotonic() + delay > deadline:
            raise StartupError(f"smg at {gateway.client.base_url} gave no workers ({why}); pass --worker-urls")
        await asyncio.sleep(delay)


def create_app(settings: SidecarSettings, tokenizer=None) -> web.Application:
    """Build the application; ``tokenizer`` may be preloaded (the CLI does, to fail early)."""
    try:
        key_store = build_key_store(settings.server)
    except AuthConfigError as exc:
        raise StartupError(str(exc)) from None
    app = web.Application(
        client_max_size=settings.server.max_body_bytes,
        # sidecar.server.request_body decodes bodies in bounded steps; a body left unread (refused, too
        # slow) is drained for at most 1 s before its connection closes (aiohttp's default: 10 s);
        # idle connections are closed by sidecar.server.connections (aiohttp's own timer just after)
        handler_args={"auto_decompress": False, "lingering_time": 1.0,
                      "keepalive_timeout": settings.server.keepalive_timeout + 1.0},
        middlewares=[
            metrics_middleware, error_middleware,
            host_middleware(HostRule(settings.server.allowed_hosts, settings.server.host)),
            auth_middleware(key_store, settings.server),
        ],
    )
    connection_guard(settings.server).install(app)
    app[keys.SETTINGS] = settings
    app[keys.METRICS] = metrics = SidecarMetrics()
    app[keys.ENGINE_HEALTH] = EngineHealth(metrics, settings.server.sglang_url)
    app[keys.BULK_BODIES] = asyncio.Semaphore(1)
    app.cleanup_ctx.append(_engine_context(tokenizer))
    app.cleanup_ctx.extend(background_contexts())
    app.router.add_post("/v1/chat/completions", routes.chat_completions)
    app.add_subapp("/v1/messages", _anthropic_api())  # Anthropic's Messages API (errors in its envelope)
    app.router.add_post("/v1/responses", routes.responses)
    app.router.add_get("/v1/models", routes.models)
    app.router.add_get("/", routes.root)  # and HEAD /: the clients' connectivity probe
    app.router.add_get("/health", routes.health)
    app.router.add_get("/metrics", routes.metrics)
    app.router.add_get("/v1/sessions", routes.sessions)
    app.router.add_delete("/v1/sessions/{session_id}", routes.close_session)
    app.router.add_post("/close_session", routes.close_session)  # SGLang's own route, for drop-in clients
    return app


def _anthropic_api() -> web.Application:
    """Anthropic's routes in a sub-application: an error on them, wherever raised (auth, body
    limits, the door, no such route), answers in Anthropic's envelope (``keys.ERROR_BODY``)."""
    api = web.Application()
    api[keys.ERROR_BODY] = anthropic_error_body
    api.router.add_post("", routes.messages)
    api.router.add_post("/count_tokens", routes.count_tokens)
    return api


def _engine_context(preloaded_tokenizer):
    async def context(app: web.Application) -> AsyncIterator[None]:
        settings = app[keys.SETTINGS].server
        http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=settings.engine_keepalive),
            cookie_jar=aiohttp.DummyCookieJar(),  # SGLang sets no cookies; skip matching them per request
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=settings.connect_timeout),
        )
        def client(url: str) -> EngineClient:
            return EngineClient(
                url,
                http,
                request_timeout=settings.request_timeout,
                connect_timeout=settings.connect_timeout,
                connect_retries=settings.connect_retries,
                api_key=settings.sglang_api_key,
            )

        try:
            gateway = SmgGateway(client(settings.smg_url)) if settings.smg_url else None
            urls = settings.worker_url_list() or await _smg_worker_urls(gateway, settings.startup_wait)
            engine = client(urls[0] if urls else settings.sglang_url)
            info = await fetch_server_info(engine, settings.startup_wait)
            tokenizer = preloaded_tokenizer
            if tokenizer is None:
                path = settings.tokenizer or (info or {}).get("tokenizer_path")
                if not path:
                    raise StartupError(
                        f"no tokenizer: SGLang at {settings.sglang_url} did not report one; pass --tokenizer DIR"
                    )
                tokenizer = await asyncio.get_running_loop().run_in_executor(None, load_tokenizer, path)
            if info is None:
                log.warning("starting without SGLang's /server_info: capacity and limits unknown until it answers")
            others = [Worker(client(url), EngineCapacity(0), gateway) for url in urls[1:]]
            infos = await asyncio.gather(*(fetch_server_info(w.client, min(settings.startup_wait, 5.0)) for w in others))
            for worker, other_info in zip(others, infos):  # placement knows every worker's room from the start
                worker.capacity = EngineCapacity.from_server_info(other_info or {})
            factory = (lambda url: Worker(client(url), EngineCapacity(0), gateway)) if gateway else None
            configure(app, engine, tokenizer, info or {}, others, gateway, factory)
            keep_the_loop_responsive()
        except BaseException:
            await http.close()
            raise
        yield
        app[keys.TURNS].offload.close()
        await http.close()

    return context


SWITCH_INTERVAL_S = 0.001  # how long a thread running Python holds the GIL while another waits


def keep_the_loop_responsive() -> None:
    """Two process-wide settings for the event loop's sake while the pool prepares large requests.

    What startup built (modules, the tokenizer, the template, pydantic's schemas: ~400K objects) is
    kept out of every later garbage collection: a collection walks every tracked object holding the
    GIL, from whichever thread allocates; over those it stalled the loop by up to half a second while
    large bodies were parsed on the pool. And a pool thread running Python hands the GIL to the
    waiting loop after 1 ms instead of 5: the loop waits once per turn, several turns a request, and
    with two pool threads busy (three keys' 12 MB bodies) it fell behind by hundreds of milliseconds."""
    gc.collect()
    gc.freeze()
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def configure(
    app: web.Application, engine: EngineClient, tokenizer, info: dict[str, Any],
    others: list[Worker] = (), gateway: SmgGateway | None = None, factory=None,
) -> None:
    """The workers (the SGLang server at --sglang-url, or --worker-urls / smg's, the first of
    which answered ``info``) and the turn core on them; the others tell their capacity through
    the background refresh."""
    settings = app[keys.SETTINGS]
    metrics = app[keys.METRICS]
    workers = Workers([Worker(engine, EngineCapacity.from_server_info(info), gateway), *others], factory)
    model_name = settings.server.model_name or engine_model_name(info)
    try:
        core = build_core(settings, tokenizer, workers, metrics, model_name)
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    metrics.sessions.set_function(lambda: len(core.sessions))
    metrics.count_session_states(lambda: Counter(s.state(time.monotonic()) for s in core.sessions.all()))
    metrics.session_bytes.set_function(lambda: core.sessions.nbytes)
    app[keys.WORKERS] = workers
    app[keys.SESSIONS] = core.sessions
    app[keys.TURNS] = core
    log.info("%s", startup_summary(settings, workers, model_name, getattr(tokenizer, "name_or_path", "")))
