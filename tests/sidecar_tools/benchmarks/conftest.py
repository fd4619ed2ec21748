"""Fixtures for the benchmark tests: the replay's OpenAI mode goes through the real sidecar.

``/generate`` mode talks to the SGLang stand-in directly (``make_sglang_double`` of
``tests/conftest.py``); ``/v1/chat/completions`` is what the sidecar serves, so OpenAI mode
runs against a sidecar in front of the stand-in, which notes every chat body it received.
"""

from __future__ import annotations

import contextlib
import json

import pytest

from sidecar.server import routes
from sidecar.server.app import create_app
from sidecar.settings import load_settings


@pytest.fixture
def make_sidecar_front(aiohttp_server, qwen3_tokenizer_dir, qwen3_tokenizer, monkeypatch):
    """``await make_sidecar_front(engine)`` -> (base URL of a sidecar in front of ``engine``,
    the chat bodies it received, each with its request headers under ``"headers"``)."""

    async def start(engine):
        received: list[dict] = []
        read_json_text = routes.read_json_text

        async def note_body(request, limits):
            """The body as the route's own reader read it (the stream is read once, by that reader)."""
            text = await read_json_text(request, limits)
            if request.path == "/v1/chat/completions":
                with contextlib.suppress(ValueError):
                    body = json.loads(b"".join(text.pieces))
                    if isinstance(body, dict):
                        received.append({**body, "headers": dict(request.headers)})
            return text

        monkeypatch.setattr(routes, "read_json_text", note_body)
        settings = load_settings(overrides={"server": {"sglang_url": engine.url, "tokenizer": str(qwen3_tokenizer_dir)}})
        app = create_app(settings, tokenizer=qwen3_tokenizer)
        server = await aiohttp_server(app)
        return str(server.make_url("")).rstrip("/"), received

    return start
