"""The waiting queue's order: leased continuations first, with aging for everyone else.

A request whose session holds a hard lease needs only its new tokens; one whose history must be
recomputed would stall them at the head of SGLang's FCFS queue. But while leased agents keep
returning, an unleased request behind them could wait without bound (116 s in the simulator with
40K-token sessions). So an unleased or recomputing request waits behind leased ones at most
``max_priority_wait_s`` of the lease clock; after that it takes its place in arrival order.

Time is the lease clock (broadcast ticks) and arrival order is first sight in the queue, so every
TP rank computes the same order. No sglang import here.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any


class WaitingOrder:
    """Reorders SGLang's waiting queue in place once per prefill pass."""

    def __init__(self, max_priority_wait_s: float):
        self.max_priority_wait_s = max_priority_wait_s
        self._seen: dict[Any, tuple[float | None, int]] = {}  # rid -> (lease clock, arrival number) at first sight
        self._arrivals = itertools.count()

    def reorder(self, waiting_queue: list, now: float | None, leased: Callable[[Any], bool]) -> None:
        """Stable in place: leased requests and requests queued ``max_priority_wait_s`` or longer
        first, in arrival order; then the others, in arrival order. ``now`` is None before the
        lease clock's first tick (nobody ages yet)."""
        seen: dict[Any, tuple[float | None, int]] = {}
        for req in waiting_queue:
            rid = getattr(req, "rid", id(req))
            since, arrival = self._seen.get(rid) or (now, next(self._arrivals))
            seen[rid] = (now if since is None else since, arrival)
        self._seen = seen  # forget requests that left the queue
        if len(waiting_queue) < 2:
            return

        def key(req: Any) -> tuple[int, int]:
            since, arrival = seen[getattr(req, "rid", id(req))]
            first = leased(req) or (since is not None and now - since >= self.max_priority_wait_s)
            return (0 if first else 1, arrival)

        waiting_queue.sort(key=key)
