"""smg (Shepherd Model Gateway) as the way to the workers: which workers it has, and the header that
sends a request to one of them.

smg keeps the workers healthy (health checks, retries, registration); the sidecar only says which
worker a session's request must reach. smg 1.13's ``X-SMG-Target-Worker`` is a 0-based index into
the workers smg considers available (healthy and, unless smg runs with ``--disable-circuit-breaker``,
circuit closed: start it with that flag, as the listing shows health only), in its ``GET /workers`` order
(``consistent_hashing`` and ``manual`` policies honour it; an index with no healthy worker is
answered 503). So the header is computed from the latest listing; between a worker's death and the
next listing the index may shift, which is why a failed request refreshes the listing at once.
smg names the worker that took each request in the ``x-smg-routed-worker-id`` response header (its
URL), before any output: the route checks it, so a shifted index is caught before that worker
computes anything (``sidecar.engine.worker.WorkerRoute``). smg routes neither ``/close_session`` nor ``/set_internal_state``: those go to the worker's own URL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TARGET_WORKER_HEADER = "X-SMG-Target-Worker"
ROUTED_WORKER_HEADER = "x-smg-routed-worker-id"  # in smg's answer: the URL of the worker that took it


@dataclass(frozen=True)
class SmgWorker:
    url: str
    healthy: bool


def parse_workers(listing: Any) -> list[SmgWorker]:
    """smg's ``GET /workers`` answer as (url, healthy) in smg's order; ValueError if it is not one."""
    if not isinstance(listing, dict) or not isinstance(listing.get("workers"), list):
        raise ValueError("smg's /workers did not answer {'workers': [...]}")
    out = []
    for entry in listing["workers"]:
        if isinstance(entry, dict) and isinstance(entry.get("url"), str):
            out.append(SmgWorker(entry["url"].rstrip("/"), bool(entry.get("is_healthy", True))))
    return out


def target_index(workers: list[SmgWorker], url: str) -> int | None:
    """``url``'s index among smg's healthy workers (what ``X-SMG-Target-Worker`` means); None when
    smg does not list it as healthy."""
    healthy = [w.url for w in workers if w.healthy]
    url = url.rstrip("/")
    return healthy.index(url) if url in healthy else None
