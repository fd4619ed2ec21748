"""Fixtures for the benchmark tests: a fake SGLang served by pytest-aiohttp."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fake_engine import FakeEngine  # noqa: E402


@pytest.fixture
def make_engine(aiohttp_server):
    """``await make_engine(**FakeEngine kwargs)`` -> (engine, base_url)."""

    async def start(**kwargs):
        engine = FakeEngine(**kwargs)
        server = await aiohttp_server(engine.app)
        return engine, str(server.make_url("")).rstrip("/")

    return start
