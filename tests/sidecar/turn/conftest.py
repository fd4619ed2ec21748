"""The turn core on one stand-in worker, without any front door or HTTP server in front of it."""

from __future__ import annotations

import aiohttp
import pytest

from sidecar.engine.capacity import EngineCapacity
from sidecar.engine.client import EngineClient
from sidecar.engine.worker import Worker, Workers
from sidecar.metrics import SidecarMetrics
from sidecar.settings import load_settings
from sidecar.turn.core import build_core


@pytest.fixture
async def core(sglang_double, qwen3_tokenizer):
    settings = load_settings(overrides={"policy": {"mode": "fixed", "fixed_ttl": 20.0}})
    async with aiohttp.ClientSession() as http:
        engine = EngineClient(sglang_double.url, http)
        worker = Worker(engine, EngineCapacity.from_server_info(await engine.server_info()))
        yield build_core(settings, qwen3_tokenizer, Workers([worker]), SidecarMetrics(), "test-model")
