"""What runs beside the requests while the app serves: the session lifecycle pass (forget the
sessions the policy says are done, releasing their leases in SGLang), the engine health probe
(``sidecar_engine_up``, and a log line when SGLang stops answering or is back) and the engine info
refresh (/server_info read again: every second until SGLang told its capacity, then every few
seconds, so a restarted SGLang is read afresh) and, with smg in front, its worker listing every
second (workers joining, leaving, unhealthy); and the event loop's own lag
(``sidecar_event_loop_lag_seconds``: how late a 20 ms timer fires)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress
from typing import AsyncIterator

from aiohttp import web

from sidecar.server import keys

log = logging.getLogger("sidecar")

LIFECYCLE_INTERVAL_S = 1.0
PROBE_INTERVAL_S = 5.0
ENGINE_INFO_INTERVAL_S = 5.0
WORKERS_INTERVAL_S = 1.0
LOOP_PROBE_INTERVAL_S = 0.02


def every(interval_s: float, step: Callable[[web.Application], Awaitable[None] | None], what: str):
    """A cleanup context that runs ``step(app)`` every ``interval_s`` seconds while the app serves;
    a step that fails is logged and the next one runs anyway (housekeeping must never die)."""

    async def loop(app: web.Application) -> None:
        while True:
            try:
                result = step(app)
                if inspect.isawaitable(result):
                    await result
            except Exception:  # noqa: BLE001
                log.exception("%s failed", what)
            await asyncio.sleep(interval_s)

    return _while_serving(loop)


def _while_serving(run: Callable[[web.Application], Awaitable[None]]):
    """A cleanup context running ``run(app)`` as a task while the app serves, cancelled at shutdown."""

    async def context(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(run(app))
        yield
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task

    return context


def loop_lag_probe(interval_s: float = LOOP_PROBE_INTERVAL_S):
    """A cleanup context that sleeps ``interval_s`` over and over and records how late it woke: the
    lag every request on this loop saw then (50 wake-ups a second, a few microseconds each)."""

    async def probe(app: web.Application) -> None:
        lag, loop = app[keys.METRICS].loop_lag, asyncio.get_running_loop()
        while True:
            due = loop.time() + interval_s
            await asyncio.sleep(interval_s)
            lag.observe(max(loop.time() - due, 0.0))

    return _while_serving(probe)


def close_due_sessions(app: web.Application) -> None:
    app[keys.SESSIONS].close_due(time.monotonic())


async def probe_engine(app: web.Application) -> None:
    app[keys.ENGINE_HEALTH].record(await app[keys.WORKERS].healthy())
    app[keys.TURNS].fleet.sync_placeable()  # a worker back up takes new sessions again


async def refresh_workers(app: web.Application) -> None:
    """With smg in front: who its workers are now (a worker added to smg takes new sessions)."""
    await app[keys.TURNS].fleet.refresh_workers()


def refresh_engine_info() -> Callable[[web.Application], Awaitable[None]]:
    """A step for ``every(1 s)``: at once while a worker's capacity is unknown, else every
    ``ENGINE_INFO_INTERVAL_S``."""
    last = float("-inf")

    async def step(app: web.Application) -> None:
        nonlocal last
        now = time.monotonic()
        unknown = any(not worker.capacity.known for worker in app[keys.WORKERS])
        if unknown or now - last >= ENGINE_INFO_INTERVAL_S:
            last = now
            await app[keys.TURNS].fleet.refresh_engine_info()

    return step


def background_contexts() -> list:
    return [
        every(LIFECYCLE_INTERVAL_S, close_due_sessions, "session lifecycle pass"),
        every(PROBE_INTERVAL_S, probe_engine, "engine health probe"),
        every(1.0, refresh_engine_info(), "engine info refresh"),
        every(WORKERS_INTERVAL_S, refresh_workers, "smg worker listing refresh"),
        loop_lag_probe(),
    ]
