"""Fairness across API keys: no key may lock the others out.

Two bounds, both only with auth on (a scope per key; without auth there is one client):

* a key's share of the admission queue: new sessions of one key waiting for admission are held
  to ``key_queue_share`` of the queue, so a key opening hundreds of sessions gets 429 for its own
  while another key's new session still queues (the queue itself stays FIFO across keys);
* a request rate per key (a token bucket: ``key_rate_limit`` requests/s, bursts of
  ``key_rate_burst``), 429 + Retry-After beyond it.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable

from sidecar.errors import APIError


def too_many(message: str, retry_after_s: float, code: str) -> APIError:
    return APIError(
        429, message, type="rate_limit_error", code=code, headers={"Retry-After": str(max(1, math.ceil(retry_after_s)))}
    )


class QueueShares:
    """How many new sessions of each key are in admission; ``enter`` refuses past the share."""

    def __init__(self, share: float, max_queue: int, retry_after_s: float):
        self.limit = max(1, math.floor(share * max_queue))
        self.retry_after_s = retry_after_s
        self._waiting: defaultdict[str, int] = defaultdict(int)

    def enter(self, scope: str) -> None:
        if scope and self._waiting[scope] >= self.limit:
            raise too_many(
                f"this key already has {self._waiting[scope]} new sessions waiting for admission (its share of the queue)",
                self.retry_after_s,
                "key_queue_share_exceeded",
            )
        self._waiting[scope] += 1

    def leave(self, scope: str) -> None:
        self._waiting[scope] -= 1
        if self._waiting[scope] <= 0:
            del self._waiting[scope]


class RateLimits:
    """A token bucket per key: ``take(scope)`` or 429 with when the next request may come."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self.rate, self.burst, self.clock = rate, max(1, burst), clock
        self._buckets: dict[str, tuple[float, float]] = {}  # scope -> (tokens, at)

    def take(self, scope: str) -> None:
        if not scope or self.rate <= 0:
            return
        now = self.clock()
        tokens, at = self._buckets.get(scope, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate)
        if tokens < 1.0:
            self._buckets[scope] = (tokens, now)
            raise too_many(
                f"this key sends more than {self.rate:g} requests/s", (1.0 - tokens) / self.rate, "rate_limit_exceeded"
            )
        self._buckets[scope] = (tokens - 1.0, now)
