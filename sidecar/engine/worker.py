"""The worker seam: the SGLang servers behind the sidecar, and which one a session lives on.

A session's KV is on the worker its requests went to, so a session stays on that worker
(``Session.worker``); capacity, and so admission, is per worker. Today there is one worker;
:meth:`Workers.place` is where a choice among several (or smg's routing key) would go.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sidecar.engine.capacity import EngineCapacity
from sidecar.engine.client import EngineClient
from sidecar.engine.generate import after_turn_body
from sidecar.engine.lease import LeaseRequest
from sidecar.errors import engine_error


@dataclass(eq=False)
class Worker:
    """One SGLang server: the client that reaches it and what it said it can hold."""

    client: EngineClient
    capacity: EngineCapacity

    async def read_info(self) -> dict[str, Any]:
        """The worker's /server_info (what it holds, its model, its limits); APIError when it does
        not answer with one."""
        try:
            info = await self.client.server_info()
        except ValueError:
            info = None
        if not isinstance(info, dict):
            raise engine_error("SGLang's /server_info did not answer a JSON object")
        return info

    def release(self, session_id: str) -> None:
        """End the session's lease on this worker, in the background (best effort: the plugin's
        lease table is the truth, and a lease the sidecar cannot release still expires)."""
        asyncio.ensure_future(self.client.close_session(session_id))

    def revise_lease(self, session_id: str, lease: LeaseRequest) -> None:
        """Tell the worker's plugin, in the background, the finished turn's revised lease (the
        plugin's after-turn channel); only where the plugin runs (SGLang refuses the keys else)."""
        if self.capacity.plugin:
            asyncio.ensure_future(self.client.set_internal_state(after_turn_body(session_id, lease)))


class Workers:
    def __init__(self, workers: Sequence[Worker]):
        if not workers:
            raise ValueError("at least one worker is needed")
        self._workers = list(workers)

    def __iter__(self) -> Iterator[Worker]:
        return iter(self._workers)

    def __len__(self) -> int:
        return len(self._workers)

    def place(self, session_id: str) -> Worker:
        """The worker a new session starts on (its requests stay there afterwards)."""
        return self._workers[0]

    async def healthy(self) -> bool:
        """Every worker answers its /health."""
        return all(await asyncio.gather(*(w.client.healthy() for w in self._workers)))
