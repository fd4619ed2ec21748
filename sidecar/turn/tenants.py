"""Fairness across API keys: no key may lock the others out.

A request rate per key (a token bucket: ``key_rate_limit`` requests/s, bursts of
``key_rate_burst``), 429 + Retry-After beyond it; only with auth on (a scope per key; without auth
there is one client). The admission queue's own fairness (keys served in turn, each within
``key_queue_share`` of the queue) is the policy's: ``sidecar.policy.admission``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sidecar.errors import APIError, retry_after


def too_many(message: str, retry_after_s: float, code: str) -> APIError:
    return APIError(
        429, message, type="rate_limit_error", code=code, headers=retry_after(retry_after_s)
    )


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
