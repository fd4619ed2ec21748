"""The routes: each reads what the request carries and hands it on (to a front door, the session
store, the workers); none decides anything itself. They read the app's keys through
``request.config_dict``: a route may sit in a sub-application (Anthropic's, for its error envelope)."""

from __future__ import annotations

import functools
import time
from typing import Any, Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from sidecar.anthropic import messages as anthropic_messages
from sidecar.errors import APIError
from sidecar.openai import chat_completions as openai_chat
from sidecar.responses import responses as openai_responses
from sidecar.server import keys
from sidecar.frontdoor.request_model import RequestBody
from sidecar.server.request_body import BodyLimits, read_json_body, read_json_text
from sidecar.server.auth import request_scope
from sidecar.turn.core import TurnCore
from sidecar.turn.offload import Prepare

Door = Callable[[web.Request, RequestBody, TurnCore, str], Awaitable[web.StreamResponse]]


def _limits(request: web.Request) -> BodyLimits:
    config = request.config_dict
    return BodyLimits.of(config[keys.SETTINGS].server, config[keys.BULK_BODIES])


async def read_json(request: web.Request) -> Any:
    """The body as strict JSON within the configured limits (``sidecar.server.request_body``),
    parsed on the pool when it is large."""
    return await read_json_body(request, _limits(request), request.config_dict[keys.TURNS].offload, request_scope(request) or "")


def door_route(door: Door) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The route of a front door's handler: the body read but not parsed (a RequestBody whose
    steps run inline or on the pool as its bytes and values weigh), the turn core and the key's
    scope handed to ``door``."""

    async def route(request: web.Request) -> web.StreamResponse:
        limits = _limits(request)
        text = await read_json_text(request, limits)
        core, scope = request.config_dict[keys.TURNS], request_scope(request) or ""
        body = RequestBody(functools.partial(text.parse, limits.max_json_values), Prepare(core.offload, scope, text.weight))
        return await door(request, body, core, scope)

    return route


chat_completions = door_route(openai_chat.handle)
messages = door_route(anthropic_messages.handle)
count_tokens = door_route(anthropic_messages.count_tokens)
responses = door_route(openai_responses.handle)


async def models(request: web.Request) -> web.Response:
    """The served model; 503 while no engine has named it (a client would otherwise pick a
    placeholder name and get 404s once the engine is up)."""
    name = await request.config_dict[keys.TURNS].fleet.require_model_name()
    return web.json_response({"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "sglang"}]})


ROOT_TEXT = "sglang-sidecar: /v1/chat/completions, /v1/messages, /v1/responses\n"


async def root(request: web.Request) -> web.Response:
    """``GET``/``HEAD /``: clients probe it to see the base URL answers (Claude Code sends a HEAD)."""
    return web.Response(text=ROOT_TEXT)


async def health(request: web.Request) -> web.Response:
    workers = request.config_dict[keys.WORKERS]
    up = await workers.healthy()
    request.config_dict[keys.ENGINE_HEALTH].record(up)
    capacity = [
        {"gpu_tokens": w.capacity.max_total_num_tokens, "host_tokens": w.capacity.host_tokens, "plugin": w.capacity.plugin}
        for w in workers
    ]
    body = {
        "status": "ok" if up else "engine_unavailable",
        "sglang": up,
        "sessions": len(request.config_dict[keys.SESSIONS]),
        "capacity": capacity[0] if len(capacity) == 1 else capacity,
    }
    return web.json_response(body, status=200 if up else 503)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.config_dict[keys.METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def sessions(request: web.Request) -> web.Response:
    now = time.monotonic()
    data = [s.describe(now) for s in request.config_dict[keys.SESSIONS].all(request_scope(request))]
    return web.json_response({"object": "list", "data": data})


async def close_session(request: web.Request) -> web.Response:
    sid = request.match_info.get("session_id")
    if sid is None:
        body = await read_json(request) if request.can_read_body else {}
        sid = body.get("session_id") if isinstance(body, dict) else None
        if not isinstance(sid, str):
            raise APIError(400, "session_id is required", param="session_id")
    request.config_dict[keys.SESSIONS].close(sid, request_scope(request) or "")
    return web.json_response({"id": sid, "object": "session.deleted", "deleted": True})
