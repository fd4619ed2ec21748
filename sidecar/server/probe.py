"""Is SGLang up? A background probe of every worker's /health, so ``sidecar_engine_up`` and the
log show an engine outage before a request fails on it (/health requests record theirs too)."""

from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator

from aiohttp import web

from sidecar.server import keys

log = logging.getLogger("sidecar")

PROBE_INTERVAL_S = 5.0


async def engine_probe_context(app: web.Application) -> AsyncIterator[None]:
    health = app[keys.ENGINE_HEALTH]

    async def loop() -> None:
        while True:
            try:
                health.record(await app[keys.WORKERS].healthy())
            except Exception:  # noqa: BLE001 - the probe must never die
                log.exception("engine health probe failed")
            await asyncio.sleep(PROBE_INTERVAL_S)

    task = asyncio.create_task(loop())
    yield
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
