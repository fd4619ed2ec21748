"""The worker seam: the SGLang servers behind the sidecar, and which one a session lives on.

A session's KV is on the worker its requests went to, so a session stays on that worker
(``Session.worker``); capacity, and so admission, is per worker. Which worker a new session goes
to is the policy's placement (``sidecar.policy.placement``); this module only knows how to reach
a worker: its own URL for what only it answers (``/server_info``, ``/health``, the plugin's
``/close_session`` and ``/set_internal_state``, aborts), and for ``/generate`` either that URL or
smg with the target-worker header (``sidecar.engine.smg``), so health checks and retries stay smg's.
A worker that stops answering is marked down; its sessions move on (``sidecar.engine.fleet`` re-homes
them, and keeps placement told which workers take new sessions).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from sidecar.engine.capacity import EngineCapacity
from sidecar.engine.client import EngineClient
from sidecar.engine.generate import after_turn_body
from sidecar.engine.lease import LeaseRequest
from sidecar.engine.smg import ROUTED_WORKER_HEADER, TARGET_WORKER_HEADER, SmgWorker, parse_workers, target_index
from sidecar.errors import APIError, engine_error, engine_unavailable

log = logging.getLogger("sidecar.engine")

# Answers that mean the worker (or smg's way to it) is gone, not that the request was bad.
_WORKER_GONE_CODES = {"engine_unavailable", "engine_overloaded"}


@dataclass(eq=False)
class Worker:
    """One SGLang server: the client that reaches it and what it said it can hold."""

    client: EngineClient
    capacity: EngineCapacity
    gateway: SmgGateway | None = None  # /generate goes through smg when set
    up: bool = True  # False once it failed a request or its /health, or smg stopped listing it
    removed: bool = False  # no longer one of the workers (smg dropped it)
    on_down: Callable[[Worker], None] | None = field(default=None, repr=False)
    others_usable: Callable[[], bool] = field(default=lambda: False, repr=False)  # the Workers set it

    @property
    def url(self) -> str:
        return self.client.base_url

    @property
    def usable(self) -> bool:
        return self.up and not self.removed

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

    def generation_route(self) -> WorkerRoute:
        """What a turn's Generation streams from: this worker, through smg if there is one."""
        return WorkerRoute(self)

    def mark_down(self, why: str) -> None:
        if self.up:
            moves = "its sessions move to another worker" if self.others_usable() else "its turns fail until it answers again"
            log.warning("worker %s is down (%s); %s", self.url, why, moves)
        self.up = False
        if self.on_down is not None:
            self.on_down(self)

    def release(self, session_id: str) -> None:
        """End the session's lease on this worker, in the background (best effort: the plugin's
        lease table is the truth, and a lease the sidecar cannot release still expires)."""
        if self.usable:
            asyncio.ensure_future(self.client.close_session(session_id))

    def revise_lease(self, session_id: str, lease: LeaseRequest) -> None:
        """Tell the worker's plugin, in the background, the finished turn's revised lease (the
        plugin's after-turn channel); only where the plugin runs (SGLang refuses the keys else)."""
        if self.capacity.plugin and self.usable:
            asyncio.ensure_future(self.client.set_internal_state(after_turn_body(session_id, lease)))


class SmgGateway:
    """smg in front of the workers: its client for ``/generate`` and its latest worker listing."""

    def __init__(self, client: EngineClient):
        self.client = client
        self.listing: list[SmgWorker] = []
        self.worker_at: Callable[[str], Worker | None] = lambda url: None  # the Workers set it
        self._warned_shift = False

    async def read_listing(self) -> list[SmgWorker]:
        try:
            self.listing = parse_workers(await self.client.get_json("/workers"))
        except ValueError as exc:
            raise engine_error(str(exc)) from None
        return self.listing

    def warn_unlisted_shift(self) -> None:
        """smg sent a request elsewhere although its listing did not change: its available set is
        not what the listing shows, which its circuit breaker does (it is not in the listing)."""
        if not self._warned_shift:
            self._warned_shift = True
            log.warning("smg routed a request to another worker than its listing says; start smg with "
                        "--disable-circuit-breaker so that X-SMG-Target-Worker indexes what GET /workers lists")

    def headers_for(self, url: str) -> dict[str, str]:
        index = target_index(self.listing, url)
        if index is None:
            raise engine_unavailable(f"smg lists no healthy worker at {url}")
        return {TARGET_WORKER_HEADER: str(index)}


class ServedElsewhere(Exception):
    """smg's answer came from another worker than the one the target header meant."""

    def __init__(self, url: str):
        super().__init__(url)
        self.url = url


class WorkerRoute:
    """``generate_batches`` and ``abort`` for one worker (the relay's engine): the stream goes
    through smg with the target header when smg fronts the workers, aborts to the worker that runs
    the request. A failure that means the worker is gone marks it down.

    Through smg the route checks, before reading any output, which worker smg says took the
    request, and when it is another one re-reads smg's listing. If the session's worker is no
    longer listed healthy, smg failed the request over to a live worker: it is served there (the
    worker is marked down; nothing is aborted, the client sees no error). If it still is, smg's
    available set shifted under the index since the last listing: the request is aborted there
    and sent once more. Should it land elsewhere again, it is served there. Either way
    ``served_by`` names that worker: the session's KV is there now, and the turn core moves it
    and counts the recompute."""

    def __init__(self, worker: Worker):
        self.worker = worker
        self.served_by: str | None = None  # the worker smg served it on, when not ``worker``
        self._rids: dict[str, str] = {}  # the rid a request was first sent with -> the one it runs under

    async def generate_batches(self, payload: dict[str, Any]) -> AsyncIterator[list[dict[str, Any]]]:
        """The worker's stream, as ``EngineClient.generate_batches`` yields it."""
        worker, gateway = self.worker, self.worker.gateway
        if gateway is None:
            try:
                async for batch in worker.client.generate_batches(payload):
                    yield batch
            except APIError as err:
                if _worker_gone(err):
                    worker.mark_down(err.message)
                raise
            return
        received = False
        for attempt in range(2):
            last = attempt == 1
            sent_with = gateway.listing
            check_routed = functools.partial(self._check_routed, gateway, accept=last)
            try:
                async for batch in gateway.client.generate_batches(payload, gateway.headers_for(worker.url), check_routed):
                    received = True
                    yield batch
                return
            except ServedElsewhere as elsewhere:
                log.warning("smg sent a request for %s to %s (its worker index shifted); sending it again",
                            worker.url, elsewhere.url)
                other = gateway.worker_at(elsewhere.url)
                if other is not None:
                    await other.client.abort(payload["rid"])
                if gateway.listing == sent_with:
                    gateway.warn_unlisted_shift()
                # a new rid: the aborted one may still be known where it landed
                payload = {**payload, "rid": self._resent_rid(payload["rid"])}
            except APIError as err:
                if not _worker_gone(err):
                    raise
                # smg's answer: the worker died, or smg's healthy set changed under the index;
                # its fresh listing tells which (a request that got nothing is sent once more)
                await self._reread_listing(gateway, err.message, err)
                if received or last:
                    raise

    def _resent_rid(self, rid: str) -> str:
        resent = f"{rid}-resent"
        self._rids[rid] = resent
        return resent

    async def _check_routed(self, gateway: SmgGateway, headers: Any, *, accept: bool) -> None:
        """Which worker took the request: another one is kept when smg failed the request over
        from a worker it no longer lists (or on the last attempt); else ServedElsewhere."""
        served = (headers.get(ROUTED_WORKER_HEADER) or "").rstrip("/")
        if not served or served == self.worker.url:
            return
        if not accept:
            await self._read_listing(gateway)
            if target_index(gateway.listing, self.worker.url) is not None:
                raise ServedElsewhere(served)
            self.worker.mark_down(f"smg failed its request over to {served}")
        self.served_by = served

    @staticmethod
    async def _read_listing(gateway: SmgGateway) -> None:
        """smg's listing again (the last one stays when smg does not answer)."""
        try:
            await gateway.read_listing()
        except APIError:
            pass

    async def _reread_listing(self, gateway: SmgGateway, why: str, err: APIError | None = None) -> None:
        """smg's listing again; if it no longer has the worker healthy, the worker is down."""
        await self._read_listing(gateway)
        if target_index(gateway.listing, self.worker.url) is None:
            self.worker.mark_down(why)
            raise err or engine_unavailable(f"smg lists no healthy worker at {self.worker.url}")

    async def abort(self, rid: str) -> None:
        """To the worker that runs ``rid``: smg does not know which of its workers that is."""
        gateway = self.worker.gateway
        other = gateway.worker_at(self.served_by) if gateway is not None and self.served_by else None
        await (other or self.worker).client.abort(self._rids.get(rid, rid))


def _worker_gone(err: APIError) -> bool:
    return err.code in _WORKER_GONE_CODES or err.status in (502, 503)


class Workers:
    """The workers, by URL; the set may change while the sidecar runs (smg adds and drops)."""

    def __init__(self, workers: Sequence[Worker], factory: Callable[[str], Worker] | None = None):
        """``factory`` makes the Worker of a URL that joins at runtime (smg listed it)."""
        if not workers:
            raise ValueError("at least one worker is needed")
        self._workers: dict[str, Worker] = {}
        for worker in workers:
            self._join(worker)
        self.gateway: SmgGateway | None = next((w.gateway for w in workers if w.gateway), None)
        if self.gateway is not None:
            self.gateway.worker_at = self.get
        self.factory = factory

    def apply_listing(self, listing: list[SmgWorker]) -> list[Worker]:
        """smg's view: a URL it newly lists joins (returned), one it no longer lists is removed,
        one it lists as unhealthy is down (back up only once its own /health answers)."""
        joined = []
        listed = {w.url: w.healthy for w in listing}
        for url, healthy in listed.items():
            worker = self._workers.get(url)
            if (worker is None or worker.removed) and self.factory is not None:
                worker = self.add(self.factory(url))
                joined.append(worker)
            if worker is not None and not healthy:
                worker.mark_down("smg lists it as unhealthy")
        for url in list(self._workers):
            if url not in listed:
                self.remove(url)
        return joined

    def __iter__(self) -> Iterator[Worker]:
        return iter(list(self._workers.values()))

    def __len__(self) -> int:
        return len(self._workers)

    def get(self, url: str | None) -> Worker | None:
        return self._workers.get(url) if url is not None else None

    def usable(self) -> list[Worker]:
        return [w for w in self._workers.values() if w.usable]

    def first(self) -> Worker:
        """A worker for what any of them can answer (limits, the model): a usable one if any."""
        return next(iter(self.usable()), None) or next(iter(self._workers.values()))

    def _join(self, worker: Worker) -> None:
        self._workers[worker.url] = worker
        worker.others_usable = lambda: any(w.usable for w in self._workers.values() if w is not worker)

    def add(self, worker: Worker) -> Worker:
        """A worker joined (smg lists it): it takes new sessions from now on."""
        self._join(worker)
        log.info("worker %s joined", worker.url)
        return worker

    def remove(self, url: str) -> None:
        """A worker left (smg no longer lists it): its sessions move on when they return."""
        worker = self._workers.get(url)
        if worker is not None and not worker.removed:
            worker.removed = True
            worker.mark_down("removed")

    async def healthy(self) -> bool:
        """Every usable worker answers its /health (each worker's answer marks it up or down)."""
        workers = [w for w in self._workers.values() if not w.removed]
        answers = await asyncio.gather(*(w.client.healthy() for w in workers))
        for worker, up in zip(workers, answers):
            if not up:
                worker.mark_down("its /health did not answer")
            elif not worker.up:
                log.info("worker %s answers /health again", worker.url)
                worker.up = True
        return bool(answers) and all(answers)
