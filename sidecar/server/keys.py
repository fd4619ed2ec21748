"""Typed keys for what the aiohttp application holds (aiohttp's AppKey style)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from sidecar.conversation.store import SessionStore
from sidecar.engine.health import EngineHealth
from sidecar.engine.worker import Workers
from sidecar.errors import APIError
from sidecar.metrics import SidecarMetrics
from sidecar.settings import SidecarSettings
from sidecar.turn.core import TurnCore

SETTINGS = web.AppKey("settings", SidecarSettings)
METRICS = web.AppKey("metrics", SidecarMetrics)
WORKERS = web.AppKey("workers", Workers)
SESSIONS = web.AppKey("sessions", SessionStore)
TURNS = web.AppKey("turns", TurnCore)
ENGINE_HEALTH = web.AppKey("engine_health", EngineHealth)
# an application's error envelope (set on a sub-application whose API shapes errors its own way)
ERROR_BODY = web.AppKey("error_body", Callable[[APIError], dict])
BULK_BODIES = web.AppKey("bulk_bodies", asyncio.Semaphore)  # large bodies' loop work, one step at a time
