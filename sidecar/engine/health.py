"""What is known about the engine's health: the last /health answer of its workers, shown as
``sidecar_engine_up``; each change (down, up again) is logged once."""

from __future__ import annotations

import logging

from sidecar.metrics import SidecarMetrics

log = logging.getLogger("sidecar")


class EngineHealth:
    def __init__(self, metrics: SidecarMetrics, url: str):
        self.metrics, self.url = metrics, url
        self.up: bool | None = None  # None: not asked yet

    def record(self, up: bool) -> None:
        self.metrics.engine_up.set(1 if up else 0)
        if self.up is True and not up:
            log.warning("SGLang at %s stopped answering /health", self.url)
        elif self.up is False and up:
            log.info("SGLang at %s answers /health again", self.url)
        self.up = up
