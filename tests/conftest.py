"""Shared pytest fixtures: an offline Qwen3 tokenizer and the SGLang stand-in.

Async tests run under pytest-asyncio (brought in by pytest-aiohttp) with
``asyncio_mode = "auto"`` from pyproject, so ``async def`` tests and fixtures
need no markers. The stand-in is ``sidecar_tools.simulator.standin.SGLangStandIn``
(SGLang's HTTP contract over its real radix cache; its replies and fault knobs are
documented there). This file puts ``tests/`` on ``sys.path`` for the helper modules
that live there. Do not ``import conftest`` from tests:
``tests/sidecar_tools/benchmarks/conftest.py`` makes that name ambiguous.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
TESTS_DIR = Path(__file__).resolve().parent
for _path in (str(REPO_ROOT), str(TESTS_DIR)):
    if _path not in sys.path:  # `pytest` (unlike `python -m pytest`) omits the repo root
        sys.path.insert(0, _path)

from sidecar_tools.simulator.http_contract import parse_sse  # noqa: E402
from sidecar_tools.simulator.standin import SGLangStandIn, run_in_thread  # noqa: E402

# --------------------------------------------------------------------------- tokenizer


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Qwen3 tokenizer folder (tokenizer.json + config with the real chat template), built once."""
    from sidecar_tools.benchmarks.qwen3_tokenizer import build_qwen3_tokenizer

    return build_qwen3_tokenizer(tmp_path_factory.mktemp("qwen3-tokenizer"))


@pytest.fixture(scope="session")
def qwen3_tokenizer(qwen3_tokenizer_dir: Path):
    """``AutoTokenizer`` loaded from :func:`qwen3_tokenizer_dir` (session-wide; treat as read-only)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir))


# --------------------------------------------------------------------------- the SGLang stand-in


@pytest.fixture
async def sglang_double() -> AsyncIterator[SGLangStandIn]:
    """A started :class:`SGLangStandIn` on a free port (defaults), stopped afterwards."""
    double = SGLangStandIn()
    await double.start()
    try:
        yield double
    finally:
        await double.stop()


@pytest.fixture
async def make_sglang_double() -> AsyncIterator[Callable[..., Any]]:
    """Factory: ``double = await make_sglang_double(max_total_num_tokens=64, ...)``;
    every double it starts is stopped at teardown."""
    started: list[SGLangStandIn] = []

    async def factory(**kwargs: Any) -> SGLangStandIn:
        double = SGLangStandIn(**kwargs)
        await double.start()
        started.append(double)
        return double

    try:
        yield factory
    finally:
        for double in started:
            await double.stop()


@pytest.fixture
def sglang_double_thread() -> Iterator[SGLangStandIn]:
    """A :class:`SGLangStandIn` served from a background thread (for sync tests).

    ``double.url`` is set; drive async methods with ``double.call_threadsafe(...)``.
    """
    double = SGLangStandIn()
    with run_in_thread(double):
        yield double


# --------------------------------------------------------------------------- helpers


@pytest.fixture
def sse() -> Callable[[str | bytes], list[Any]]:
    """The :func:`parse_sse` helper as a fixture (avoids importing conftest)."""
    return parse_sse
