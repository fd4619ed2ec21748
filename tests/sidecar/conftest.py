"""Fixtures of the sidecar's tests: a sidecar test client in front of the SGLang double."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from sidecar.server.app import create_app
from sidecar.settings import load_settings


@pytest.fixture
def make_sidecar(aiohttp_client, sglang_double, qwen3_tokenizer_dir, qwen3_tokenizer) -> Callable[..., Any]:
    """``await make_sidecar(double=None, admission=None, **server)``: a test client of a sidecar with
    those [server] (and [admission]) settings, in front of ``double`` (default: ``sglang_double``)."""

    async def make(double=None, admission: dict | None = None, **server):
        double = double or sglang_double
        settings = load_settings(overrides={
            "server": {"sglang_url": double.url, "tokenizer": str(qwen3_tokenizer_dir), **server},
            "admission": admission or {},
        })
        return await aiohttp_client(create_app(settings, tokenizer=qwen3_tokenizer))

    return make
