"""Typed keys for what the aiohttp application holds (aiohttp's AppKey style)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from sidecar.conversation.chat_template import ChatRenderer
from sidecar.engine.client import EngineClient
from sidecar.metrics import SidecarMetrics
from sidecar.conversation.store import SessionRegistry
from sidecar.settings import SidecarSettings

SETTINGS = web.AppKey("settings", SidecarSettings)
ENGINE = web.AppKey("engine", EngineClient)
RENDERER = web.AppKey("renderer", ChatRenderer)
REGISTRY = web.AppKey("registry", SessionRegistry)
POLICY = web.AppKey("policy", Any)
METRICS = web.AppKey("metrics", SidecarMetrics)
SERVER_INFO = web.AppKey("server_info", dict)
MODEL_NAME = web.AppKey("model_name", str)
PROMPT_LIMIT = web.AppKey("prompt_limit", int)
