"""The fleet: the workers as a turn sees them, and what keeps placement's view of them true.

``sidecar.engine.worker`` knows how to reach one worker; this module knows the set as the turns
use it: which worker a session's request goes to (the one holding its KV, or placement's choice),
a session re-homed when its worker is lost or smg served it elsewhere, and each worker's engine
info (/server_info: capacity, model, limits) read, re-read and handed to placement. Placement
itself is the policy's (``sidecar.policy.placement``); the fleet only tells it what it saw
(:class:`Placement`), so the engine layer still imports no policy.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from sidecar.engine.capacity import EngineCapacity
from sidecar.engine.worker import Worker, Workers
from sidecar.errors import APIError, retry_after
from sidecar.metrics import SidecarMetrics

log = logging.getLogger("sidecar")


class Placement(Protocol):
    """What the fleet tells placement (the policy) and asks it."""

    def set_capacity(self, capacity: EngineCapacity, worker: str | None = None) -> None: ...

    def set_placeable(self, worker: str, placeable: bool) -> None: ...

    def relocate(self, session_id: str, worker: str | None) -> None: ...

    def worker_of(self, session_id: str) -> str | None: ...


class Homed(Protocol):
    """A session as the fleet moves it: its id, the worker its requests go to, its re-homes."""

    id: str
    public_id: str
    worker: Worker | None
    rehomed: int


class Fleet:
    """The workers behind the sidecar, placement's view of them, and the model they serve."""

    def __init__(self, workers: Workers, placement: Placement, metrics: SidecarMetrics, model_name: str,
                 model_fixed: bool = False):
        """``model_fixed``: the model name was given (--model-name), SGLang's does not replace it."""
        self.workers = workers
        self.placement = placement
        self.metrics = metrics
        self.model_name = model_name  # what the doors call the model
        self._model_fixed = model_fixed
        self.model_known = model_fixed or model_name != UNKNOWN_MODEL  # named by --model-name or SGLang
        self._refreshing: asyncio.Task | None = None
        self._info_errors: dict[Worker, APIError] = {}  # why a worker's last /server_info failed
        for worker in workers:
            self.watch(worker)
            self._show_capacity(worker.capacity)

    # ---------------------------------------------------------------- which worker
    def watch(self, worker: Worker) -> None:
        """Placement hears when ``worker`` goes down (with several workers: one alone stays placeable)."""
        worker.on_down = lambda w: len(self.workers) > 1 and self.placement.set_placeable(w.url, False)

    def sync_placeable(self) -> None:
        """Placement's view of which workers take new sessions, after health and listing changed."""
        if len(self.workers) > 1:
            for worker in self.workers:
                self.placement.set_placeable(worker.url, worker.usable and worker.capacity.known)

    def home(self, session: Homed) -> Worker | None:
        """The worker holding the session's KV; None when placement must choose: a new session,
        or one whose worker was lost while another is usable (it is re-homed: see
        :meth:`rehome_if_lost`)."""
        if self.rehome_if_lost(session):
            return None
        return session.worker or self.workers.get(self.placement.worker_of(session.id))

    def rehome_if_lost(self, session: Homed) -> bool:
        """A session whose worker is lost while another is usable leaves it: its next request is
        placed afresh, and its new worker reads its history back (shared L3 storage) or recomputes it."""
        worker = session.worker
        if worker is None or worker.usable or not any(w.usable for w in self.workers if w is not worker):
            return False
        session.worker = None
        session.rehomed += 1
        self.placement.relocate(session.id, None)
        self.metrics.sessions_rehomed.inc()
        log.warning("session %s: worker %s lost; it continues on another worker (its history is read back "
                    "where the workers share L3 storage, else recomputed)", session.public_id, worker.url)
        return True

    async def placed(self, session_id: str) -> Worker:
        """The worker admission placed a new (or re-homed) session on, once it told its capacity."""
        worker = self.workers.get(self.placement.worker_of(session_id))
        if worker is None:
            raise APIError(503, "no SGLang worker is available", type="engine_unavailable",
                           code="no_worker", headers=retry_after(2))
        await self.require_engine_info(worker)
        return worker

    def served_elsewhere(self, session: Homed, url: str, history_tokens: int) -> None:
        """smg served the turn on another worker than the session's (see ``WorkerRoute``): its KV
        is there now, so the session moves there; its history, sent to a worker that did not hold
        it, counts as a re-home's recompute, and the old worker's lease is let go."""
        worker = self.workers.get(url)
        self.metrics.turns_served_elsewhere.inc()
        self.metrics.rehomed_recompute_tokens.inc(history_tokens)
        if worker is None:
            log.warning("session %s: smg served a turn on %s, a worker the sidecar does not know", session.public_id, url)
            return
        log.warning("session %s: smg served its turn on %s instead of %s; the session moves there",
                    session.public_id, url, session.worker.url)
        session.worker.release(session.id)
        session.worker = worker
        session.rehomed += 1
        self.metrics.sessions_rehomed.inc()
        self.placement.relocate(session.id, url)

    def count_rehome(self, history_tokens: int, cached_tokens: int, prefilled: bool) -> None:
        """What the new worker of a re-homed session did with its history: what it found cached
        (read back from L3 storage the workers share, or a prefix it held) is restored, the rest
        recomputed; a turn that failed before its prefill counts it all as recomputed."""
        restored = min(cached_tokens, history_tokens) if prefilled else 0
        self.metrics.rehomed_restored_tokens.inc(restored)
        self.metrics.rehomed_recompute_tokens.inc(history_tokens - restored)

    # ---------------------------------------------------------------- engine info
    async def refresh_engine_info(self) -> None:
        """Ask every worker (again) what it holds, its model and limits. Until a worker has told
        its capacity it admits no new session (503), so protections never lapse because SGLang
        started after the sidecar; a restarted SGLang (new startup time) is read afresh. One
        refresh at a time: concurrent callers wait for the same one."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._refresh())
        await asyncio.shield(self._refreshing)

    async def refresh_workers(self) -> None:
        """With smg in front: its worker listing (joined, removed, unhealthy workers), then the
        engine info of any worker that has not told its capacity yet."""
        gateway = self.workers.gateway
        if gateway is None:
            return
        try:
            listing = await gateway.read_listing()
        except APIError as exc:
            log.warning("smg's /workers failed: %s", exc.message)
            return
        for worker in self.workers.apply_listing(listing):
            self.watch(worker)
        healthy = {w.url for w in listing if w.healthy}
        for worker in self.workers:  # smg has it healthy again: back once its own /health answers
            if not worker.up and not worker.removed and worker.url in healthy and await worker.client.healthy():
                log.info("worker %s is up again", worker.url)
                worker.up = True
        self.sync_placeable()
        if any(not w.capacity.known for w in self.workers if not w.removed):
            await self.refresh_engine_info()

    async def _refresh(self) -> None:
        for worker in self.workers:
            if worker.removed:
                continue
            try:
                self.engine_info(worker, await worker.read_info())
                self._info_errors.pop(worker, None)
            except APIError as exc:
                self._info_errors[worker] = exc

    async def require_engine_info(self, worker: Worker) -> None:
        """Return once ``worker`` has told its capacity (asking it now if it has not); else the
        503 that keeps new sessions out, or the error SGLang answered with (e.g. its API key)."""
        if worker.capacity.known:
            return
        await self.refresh_engine_info()
        if worker.capacity.known:
            return
        error = self._info_errors.get(worker)
        if error is not None and error.status != 503:
            raise error
        raise APIError(
            503,
            "SGLang has not told its KV capacity yet (is it up?); no session is admitted without it",
            type="engine_unavailable",
            code="engine_info_unknown",
            headers=retry_after(2),
        )

    async def require_model_name(self) -> str:
        """The served model id; asks the workers again while none has named it, else 503."""
        if not self.model_known:
            await self.refresh_engine_info()
        if not self.model_known:
            refused = [e for e in self._info_errors.values() if e.status != 503]
            if refused:  # SGLang answered, with an error of its own (e.g. its API key): that error
                raise refused[0]
            raise APIError(
                503,
                "SGLang has not told which model it serves yet (is it up?)",
                type="engine_unavailable",
                code="engine_info_unknown",
                headers=retry_after(2),
            )
        return self.model_name

    def engine_info(self, worker: Worker, info: dict) -> None:
        """What ``worker``'s /server_info says, taken into account."""
        capacity = EngineCapacity.from_server_info(info)
        if not self._model_fixed and engine_model_name(info, "") != "":
            self.model_name = engine_model_name(info)
            self.model_known = True
        if capacity == worker.capacity:
            return
        worker.capacity = capacity
        self.placement.set_capacity(capacity, worker.url)
        self.sync_placeable()
        self._show_capacity(capacity)
        log.info(
            "engine at %s: GPU KV %d tokens, host tier %d tokens, L3 storage %s, prompt limit %d, session_ttl plugin %s",
            worker.client.base_url, capacity.max_total_num_tokens, capacity.host_tokens,
            capacity.storage_backend or "none", capacity.max_req_input_len, "on" if capacity.plugin else "off",
        )
        if capacity.storage_backend == "file" and capacity.storage_waits and len(self.workers) > 1:
            log.warning("engine at %s: a re-homed session waits for its history from the file L3 store "
                        "(--hicache-storage-prefetch-policy %s), which was measured 3-25x slower than "
                        "recomputing it on an H200; best_effort recomputes at once",
                        worker.client.base_url, capacity.storage_prefetch_policy)

    def _show_capacity(self, capacity: EngineCapacity) -> None:
        self.metrics.engine_capacity.labels(tier="gpu").set(capacity.max_total_num_tokens)
        self.metrics.engine_capacity.labels(tier="host").set(capacity.host_tokens)
        self.metrics.engine_info_known.set(1 if capacity.known else 0)


UNKNOWN_MODEL = "default"  # what the doors call the model until an engine names it


def engine_model_name(info: dict, default: str = UNKNOWN_MODEL) -> str:
    """The model id SGLang serves, as its /server_info names it."""
    return info.get("served_model_name") or info.get("model_path") or default
