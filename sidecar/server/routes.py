"""The routes: each reads what the request carries and hands it on (to a front door, the session
store, the workers); none decides anything itself."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from sidecar.conversation.store import scoped_id
from sidecar.anthropic import messages as anthropic_messages
from sidecar.errors import APIError
from sidecar.openai import chat_completions as openai_chat
from sidecar.responses import responses as openai_responses
from sidecar.server import keys
from sidecar.server.body import BodyLimits, read_json_body
from sidecar.server.auth import request_scope


async def read_json(request: web.Request) -> Any:
    """The body as strict JSON within the configured limits (``sidecar.server.body``)."""
    app = request.app
    return await read_json_body(request, BodyLimits.of(app[keys.SETTINGS].server, app[keys.BULK_BODIES]))


async def chat_completions(request: web.Request) -> web.StreamResponse:
    body = await read_json(request)
    return await openai_chat.handle(request, body, request.app[keys.TURNS], request_scope(request) or "")


async def messages(request: web.Request) -> web.StreamResponse:
    body = await read_json(request)
    return await anthropic_messages.handle(request, body, request.app[keys.TURNS], request_scope(request) or "")


async def count_tokens(request: web.Request) -> web.Response:
    body = await read_json(request)
    return await anthropic_messages.count_tokens(request, body, request.app[keys.TURNS], request_scope(request) or "")


async def responses(request: web.Request) -> web.StreamResponse:
    body = await read_json(request)
    return await openai_responses.handle(request, body, request.app[keys.TURNS], request_scope(request) or "")


async def models(request: web.Request) -> web.Response:
    """The served model; 503 while no engine has named it (a client would otherwise pick a
    placeholder name and get 404s once the engine is up)."""
    name = await request.app[keys.TURNS].fleet.require_model_name()
    return web.json_response({"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "sglang"}]})


ROOT_TEXT = "sglang-sidecar: /v1/chat/completions, /v1/messages, /v1/responses\n"


async def root(request: web.Request) -> web.Response:
    """``GET``/``HEAD /``: clients probe it to see the base URL answers (Claude Code sends a HEAD)."""
    return web.Response(text=ROOT_TEXT)


async def health(request: web.Request) -> web.Response:
    workers = request.app[keys.WORKERS]
    up = await workers.healthy()
    request.app[keys.ENGINE_HEALTH].record(up)
    capacity = [
        {"gpu_tokens": w.capacity.max_total_num_tokens, "host_tokens": w.capacity.host_tokens, "plugin": w.capacity.plugin}
        for w in workers
    ]
    body = {
        "status": "ok" if up else "engine_unavailable",
        "sglang": up,
        "sessions": len(request.app[keys.SESSIONS]),
        "capacity": capacity[0] if len(capacity) == 1 else capacity,
    }
    return web.json_response(body, status=200 if up else 503)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[keys.METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def sessions(request: web.Request) -> web.Response:
    now = time.monotonic()
    data = [s.describe(now) for s in request.app[keys.SESSIONS].all(request_scope(request))]
    return web.json_response({"object": "list", "data": data})


async def close_session(request: web.Request) -> web.Response:
    sid = request.match_info.get("session_id")
    if sid is None:
        body = await read_json(request) if request.can_read_body else {}
        sid = body.get("session_id") if isinstance(body, dict) else None
        if not isinstance(sid, str):
            raise APIError(400, "session_id is required", param="session_id")
    store = request.app[keys.SESSIONS]
    session = store.get(scoped_id(request_scope(request) or "", sid))
    if session is None:
        raise APIError(404, f"no session {sid!r}", type="not_found", code="session_not_found")
    if session.inflight:
        raise APIError(409, f"session {sid!r} has a request in flight", code="session_busy")
    store.forget(session, "client")
    return web.json_response({"id": sid, "object": "session.deleted", "deleted": True})
