"""The aiohttp application: factory, startup/cleanup contexts, and the small routes.

Startup asks SGLang who it is (/server_info: model, tokenizer path, KV capacity), loads the
tokenizer and chat template, and builds the policy. A background task closes sessions the policy
(or, without one, the idle grace period) says are done.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, AsyncIterator

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from sidecar.server import keys
from sidecar.server.auth import AuthConfigError, auth_middleware, build_key_store, request_scope
from sidecar.openai.chat_completions import handle as chat_handler
from sidecar.conversation.chat_template import ChatRenderer
from sidecar.engine.client import EngineClient
from sidecar.errors import APIError, error_middleware
from sidecar.openai.request_checks import read_json_body
from sidecar.metrics import SidecarMetrics
from sidecar.policy import EngineCapacity, build_policy
from sidecar.conversation.store import SessionRegistry, scoped_id
from sidecar.settings import SidecarSettings

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
        middlewares=[metrics_middleware, error_middleware, auth_middleware(key_store, settings.server)],
    )
    app[keys.SETTINGS] = settings
    app[keys.METRICS] = SidecarMetrics()
    app.cleanup_ctx.append(_engine_context(tokenizer))
    app.cleanup_ctx.append(_lifecycle_context)
    app.router.add_post("/v1/chat/completions", chat_handler)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/sessions", sessions)
    app.router.add_delete("/v1/sessions/{session_id}", close_session)
    app.router.add_post("/close_session", close_session)  # SGLang's own route, for drop-in clients
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
        await http.close()

    return context


def configure(app: web.Application, engine: EngineClient, tokenizer, info: dict[str, Any]) -> None:
    settings = app[keys.SETTINGS]
    try:
        renderer = ChatRenderer(tokenizer)
    except ValueError as exc:
        raise StartupError(str(exc)) from None
    app[keys.ENGINE] = engine
    app[keys.RENDERER] = renderer
    app[keys.SERVER_INFO] = info
    app[keys.MODEL_NAME] = settings.server.model_name or info.get("served_model_name") or info.get("model_path") or "default"
    app[keys.PROMPT_LIMIT] = settings.server.max_prompt_tokens or int(info.get("max_req_input_len") or 0)
    capacity = EngineCapacity(max_total_num_tokens=int(info.get("max_total_num_tokens") or 0))
    app[keys.POLICY] = build_policy(settings, capacity, registry=app[keys.METRICS].registry)
    app[keys.REGISTRY] = SessionRegistry(settings.server.max_sessions, on_forget=lambda s: _closed(app, s.id, "capacity"))


def _closed(app: web.Application, session_id: str, reason: str) -> None:
    """A session was forgotten: release its lease in SGLang and tell the policy."""
    app[keys.POLICY].on_session_closed(session_id)
    app[keys.METRICS].sessions_closed.labels(reason=reason).inc()
    asyncio.ensure_future(app[keys.ENGINE].close_session(session_id))


async def close_due_sessions(app: web.Application) -> int:
    """Close what the policy says is done (idle past lease + grace, or over the table bound)."""
    registry = app[keys.REGISTRY]
    closed = 0
    for sid in app[keys.POLICY].sessions_to_close(time.monotonic()):
        session = registry.get(sid)
        if session is not None and session.inflight:
            continue
        registry.forget(sid)
        _closed(app, sid, "idle")
        closed += 1
    return closed


async def _lifecycle_context(app: web.Application) -> AsyncIterator[None]:
    async def loop() -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                await close_due_sessions(app)
                app[keys.METRICS].sessions.set(len(app[keys.REGISTRY]))
            except Exception:  # noqa: BLE001 - housekeeping must never die
                log.exception("session lifecycle pass failed")

    task = asyncio.create_task(loop())
    yield
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass


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


async def models(request: web.Request) -> web.Response:
    name = request.app[keys.MODEL_NAME]
    return web.json_response({"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "sglang"}]})


async def health(request: web.Request) -> web.Response:
    up = await request.app[keys.ENGINE].healthy()
    body = {"status": "ok" if up else "engine_unavailable", "sglang": up, "sessions": len(request.app[keys.REGISTRY])}
    return web.json_response(body, status=200 if up else 503)


async def metrics(request: web.Request) -> web.Response:
    request.app[keys.METRICS].sessions.set(len(request.app[keys.REGISTRY]))
    body = generate_latest(request.app[keys.METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def sessions(request: web.Request) -> web.Response:
    policy = request.app[keys.POLICY]
    data = [s.describe(policy.lease_expiry(s.id)) for s in request.app[keys.REGISTRY].all(request_scope(request))]
    return web.json_response({"object": "list", "data": data})


async def close_session(request: web.Request) -> web.Response:
    sid = request.match_info.get("session_id")
    if sid is None:
        body = await read_json_body(request) if request.can_read_body else {}
        sid = body.get("session_id") if isinstance(body, dict) else None
        if not isinstance(sid, str):
            raise APIError(400, "session_id is required", param="session_id")
    registry = request.app[keys.REGISTRY]
    session = registry.get(scoped_id(request_scope(request) or "", sid))
    if session is None:
        raise APIError(404, f"no session {sid!r}", type="not_found", code="session_not_found")
    if session.inflight:
        raise APIError(409, f"session {sid!r} has a request in flight", code="session_busy")
    registry.forget(session.id)
    _closed(request.app, session.id, "client")
    return web.json_response({"id": sid, "object": "session.deleted", "deleted": True})
