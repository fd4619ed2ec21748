"""SGLang 0.5.23's HTTP contract over the simulated engine: ``simulate --serve`` and the tests' stand-in.

The subset the sidecar (and ``sidecar_tools.benchmarks.replay --mode generate``) uses, as SGLang
answers it when started with ``--skip-tokenizer-init --enable-metrics --enable-cache-report``:

* ``POST|PUT /generate`` - ``input_ids`` (text prompts are refused), ``sampling_params``
  (unknown keys refused), top-level ``session_id``, ``session_params``, ``rid``, ``stream``,
  ``extra_key`` / ``cache_salt``; SSE chunks with *cumulative* ``output_ids`` (every
  ``stream_interval`` tokens) and ``meta_info`` (``prompt_tokens``, ``completion_tokens``,
  ``cached_tokens``, ``finish_reason``, ...), ``data: [DONE]``; a client that hangs up aborts;
* the reply is the ``responder``'s (``replies.py``) cut by SGLang's stop rules (EOS ids,
  ``stop_token_ids``, ``ignore_eos``, ``max_new_tokens``); ``cached_tokens`` are the real radix
  cache's; ``custom_params.session_lease_ttl_s`` reaches the ``session_ttl`` plugin;
* ``/abort_request``, ``/open_session``, ``/close_session``, ``/flush_cache`` (idle only),
  ``/server_info`` (``max_total_num_tokens``, ``max_req_input_len``, ...), ``/model_info``,
  ``/health``, ``/v1/models``, ``/metrics``; ``--api-key`` when ``api_key`` is set.

Test controls (see ``standin.py`` for the stand-in the tests start): ``faults`` (``faults.py``),
``healthy``, ``freeze()``/``thaw()``, ``stop()``/``start()`` (killed, then back with the same
state) and ``restart()`` (a new process: empty cache, no sessions), ``server_info_overrides``, and
records of what arrived (``requests``, ``results``, ``aborts``, sessions, ``calls``...).

Time: the engine is advanced to wall-clock targets (``time_scale`` virtual seconds per wall
second); a step's tokens are released when the wall clock reaches the step's end, so streams,
TTFT and gaps behave like the GPU's (at the cost model's speed).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import inspect
import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from sidecar_tools.simulator.engine import SimEngine, SimRequest
from sidecar_tools.simulator.faults import Faults
from sidecar_tools.simulator.generate_request import (
    VOCAB_SIZE,
    GenerateRequestError,
    SchemaError,
    check_lengths,
    check_prompt,
    check_sampling,
    check_schema,
)
from sidecar_tools.simulator.http_contract import api_key_guard, serve_in_thread, sglang_app
from sidecar_tools.simulator.nocache_engine import NoCacheEngine
from sidecar_tools.simulator.replies import DEFAULT_EOS_IDS, Responder, plan_reply, random_responder
from sidecar_tools.simulator.standin_storage import SharedStorage

log = logging.getLogger(__name__)

Engine = SimEngine | NoCacheEngine  # what the server drives (the same interface)

SGLANG_VERSION = "0.5.23"
ABORT_MESSAGE = "Aborted by AbortReq."
TIMINGS_PATH = "/simulator/request_timings"
_DROPPED = object()  # the server was stopped under a request: its connection is gone


class BadRequest(GenerateRequestError):
    """A request the simulator does not emulate (batches, n > 1, ...)."""


@dataclass
class _Flight:
    """One /generate request from arrival to its last byte."""

    rid: str
    body: dict[str, Any]
    input_ids: list[int]
    params: dict[str, Any]
    max_new_tokens: int
    received: float
    transport: Any
    updates: asyncio.Queue = field(default_factory=asyncio.Queue)
    aborted: asyncio.Event = field(default_factory=asyncio.Event)
    abort_requested: bool = False  # an /abort_request named it
    sim: SimRequest | None = None
    dropped: bool = False  # the server was stopped under it: its connection is gone
    finish: dict[str, Any] | None = None  # the planned finish (stop/length), or an abort before the engine
    timing: list[float | None] | None = None  # [received, first token sent, last token sent]
    first_token_at: float | None = None  # wall time the engine released the first token
    storage_hit: int = 0  # prompt tokens found in the shared L3 store on arrival


class SimServer:
    def __init__(self, engine: Engine, *, time_scale: float = 1.0, granularity_s: float = 0.02,
                 model_name: str = "simulated-qwen3-8b", model_path: str | None = None,
                 tokenizer_path: str | None = None, seed: int = 0, responder: Responder | None = None,
                 eos_token_ids: tuple[int, ...] = DEFAULT_EOS_IDS, api_key: str | None = None,
                 enable_streaming_session: bool = False, server_info_overrides: dict[str, Any] | None = None,
                 record: bool = True, record_timings: bool = False,
                 engine_factory: Callable[[], Engine] | None = None, l3: SharedStorage | None = None,
                 stream_interval: int = 1):
        self.engine = engine
        self.stream_interval = max(1, stream_interval)  # SGLang's --stream-interval (a request's own wins)
        self.l3 = l3  # HiCache L3 storage shared with other workers (standin_storage.py)
        self.engine_factory = engine_factory  # restart() builds the new process's engine with it
        self.time_scale = time_scale
        self.granularity_s = granularity_s
        self.model_name = model_name
        self.model_path = model_path or model_name
        self.tokenizer_path = tokenizer_path or self.model_path
        self.responder: Responder = responder or random_responder(seed)
        self.eos_token_ids = tuple(eos_token_ids)
        self.api_key = api_key
        self.enable_streaming_session = enable_streaming_session
        self.server_info_overrides: dict[str, Any] = dict(server_info_overrides or {})
        self.record = record
        self.record_timings = record_timings
        self.faults = Faults()
        self.healthy = True
        self.frozen = False
        self.open_sessions: dict[str, dict[str, Any]] = {}
        self.timings: dict[str, list[list[float | None]]] = {}
        self.url: str | None = None
        self.host: str | None = None
        self.port: int | None = None
        self._flights: dict[str, _Flight] = {}
        self._pending: list[tuple[SimRequest, list[int], bool]] = []
        self._kick: asyncio.Event | None = None
        self._driver: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._wall0 = 0.0
        self._v0 = 0.0
        self._startup = time.time()
        self.clear_records()

    # ------------------------------------------------------------------ records
    def clear_records(self) -> None:
        """Forget what arrived so far (not the engine's state)."""
        self.requests: list[Any] = []  # every body POSTed to /generate, in order (deep copies)
        # the final payload of every generation that ended by stop, length or /abort_request (not
        # of one the server aborted itself because its client went away)
        self.results: list[dict[str, Any]] = []
        self.aborts: list[dict[str, Any]] = []  # /abort_request bodies
        self.opened_sessions: list[dict[str, Any]] = []
        self.closed_sessions: list[dict[str, Any]] = []
        self.internal_state_updates: list[dict[str, Any]] = []  # bodies of /set_internal_state
        self.flushes = 0
        self.client_disconnects: list[str] = []  # rids whose client hung up mid-stream
        self.calls: list[tuple[str, str, str | None]] = []  # (method, path, Authorization) of every call

    def generate_requests(self) -> list[Any]:
        return self.requests

    @property
    def running_rids(self) -> list[str]:
        """Requests being answered now (arrived, not yet finished)."""
        return list(self._flights)

    async def wait_for_requests(self, count: int, timeout: float = 5.0) -> list[Any]:
        """Wait until ``count`` /generate bodies have arrived."""
        await _wait_until(lambda: len(self.requests) >= count, timeout, f"{count} requests")
        return self.requests

    async def wait_for_running(self, rid: str | None = None, timeout: float = 5.0) -> None:
        """Wait until request ``rid`` (or any request) is being answered."""
        await _wait_until(lambda: rid in self._flights if rid else bool(self._flights), timeout, f"running {rid}")

    def _keep(self, records: list[Any], item: Any) -> None:
        if self.record:
            records.append(copy.deepcopy(item))

    # ------------------------------------------------------------------ clock
    def vnow(self) -> float:
        return self._v0 + (time.monotonic() - self._wall0) * self.time_scale

    def _wall_for(self, v: float) -> float:
        return self._wall0 + (v - self._v0) / self.time_scale

    def _anchor(self) -> None:
        self._wall0 = time.monotonic()
        self._v0 = self.engine.now

    # ------------------------------------------------------------------ lifecycle
    def build_app(self) -> web.Application:
        middlewares = [self._note_call] + ([api_key_guard(self.api_key)] if self.api_key else [])
        app = sglang_app(self, middlewares=middlewares)
        if self.record_timings:
            app.router.add_get(TIMINGS_PATH, self.handle_timings)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        self._loop = asyncio.get_running_loop()
        self._kick = asyncio.Event()
        self._anchor()
        self._driver = asyncio.create_task(self._drive())

    async def _on_cleanup(self, app: web.Application) -> None:
        if self._driver is not None:
            self._driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._driver

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Bind and serve; returns (and sets) ``url``."""
        self._runner = web.AppRunner(self.build_app(), shutdown_timeout=0.5, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await site.start()
        self.host, self.port = host, self._runner.addresses[0][1]
        self.url = f"http://{host}:{self.port}"
        return self.url

    async def stop(self) -> None:
        """The process is killed: in-flight connections drop at once (the engine's requests are
        aborted); ``start()`` later serves again with the same engine state."""
        for flight in list(self._flights.values()):
            flight.dropped = True
            flight.updates.put_nowait(_DROPPED)
            flight.aborted.set()
            if flight.transport is not None:
                flight.transport.close()
            if flight.sim is not None:
                self.engine.abort(flight.rid)
        self._pending.clear()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def restart(self, downtime: float = 0.0) -> None:
        """SGLang restarted on the same port: in-flight requests are dropped, and the new process
        has an empty cache, no sessions, fresh metrics (records of what arrived are kept)."""
        if self.engine_factory is None:
            raise RuntimeError("restart() needs an engine_factory to build the new process's engine")
        host, port = self.host or "127.0.0.1", self.port or 0
        await self.stop()
        self.engine = self.engine_factory()
        self.open_sessions.clear()
        self._startup = time.time()
        if downtime:
            await asyncio.sleep(downtime)
        await self.start(host, port)

    def freeze(self) -> None:
        """The engine stops stepping (a wedged scheduler): requests are accepted, no token comes."""
        self.frozen = True

    def thaw(self) -> None:
        """The engine goes on at its own pace from where it stopped."""
        self.frozen = False
        self._anchor()
        self._kick_engine()

    def call_threadsafe(self, coro: Any, timeout: float = 10.0) -> Any:
        """Run a coroutine on the server's loop from another thread (e.g. ``restart()``)."""
        if self._loop is None:
            raise RuntimeError("server not started")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def __aenter__(self) -> SimServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    # ------------------------------------------------------------------ the engine driver
    async def _drive(self) -> None:
        while True:
            engine = self.engine
            try:
                if self.frozen or not engine.busy:
                    timeout = None if self.frozen else self._idle_timeout(engine)
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._kick.wait(), timeout)
                    self._kick.clear()
                    if not self.frozen:
                        engine.advance_idle(self.vnow())
                    continue
                engine.step(horizon=engine.now + self.granularity_s)
                delay = self._wall_for(engine.now) - time.monotonic()
                await asyncio.sleep(max(0.0, delay))
                self._flush()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("simulated engine step failed")
                await asyncio.sleep(0.1)

    def _idle_timeout(self, engine: Engine) -> float | None:
        targets = [x for x in (engine.next_wakeup(), engine.next_lease_expiry()) if x is not None and x > engine.now]
        return max(0.0, self._wall_for(min(targets)) - time.monotonic()) if targets else None

    def _on_update(self, sim: SimRequest) -> None:
        self._pending.append((sim, list(sim.output_ids), sim.finished))

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        for sim, output, finished in pending:
            flight = self._flights.get(sim.rid)
            if flight is not None and flight.sim is sim:
                flight.updates.put_nowait((output, finished))

    def _kick_engine(self) -> None:
        self.engine.notify()
        if self._kick is not None:
            self._kick.set()

    # ------------------------------------------------------------------ /generate
    async def handle_generate(self, request: web.Request) -> web.StreamResponse:
        received = time.time()
        if self.faults.take_hang_up():
            _drop_connection(request)
            return web.Response(status=500)  # never reaches the client
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            self._keep(self.requests, raw.decode("utf-8", "replace"))
            return _json({"error": "request body is not valid JSON"}, 400)
        self._keep(self.requests, body)
        if self.faults.take_failure():
            return _json(self.faults.fail_body, self.faults.fail_status)
        try:
            check_schema(body)
        except SchemaError as exc:  # SGLang's schema gate answers before any stream starts
            return _json({"error": str(exc)}, 400)
        stream = bool(body.get("stream"))
        try:
            flight = self._parse(body, received, request.transport)
        except GenerateRequestError as exc:
            return await _refuse(request, str(exc), stream)
        drop = self.faults.take_drop()
        self._flights[flight.rid] = flight
        try:
            if stream:
                return await self._stream(request, flight, drop)
            return await self._once(request, flight, drop)
        finally:
            self._flights.pop(flight.rid, None)

    def _parse(self, body: dict[str, Any], received: float, transport: Any) -> _Flight:
        """SGLang's semantic checks, then what the simulator does not emulate."""
        ids = check_prompt(body)
        if not all(isinstance(t, int) for t in ids) or any(isinstance(body.get(k), list)
                                                            for k in ("rid", "extra_key", "cache_salt")):
            raise BadRequest("a batch of prompts is not simulated: send one flat list of token ids")
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise BadRequest("a batch of sampling_params is not simulated")
        check_sampling(params)
        check_lengths(ids, params, self.engine.context_length)
        bad = next((t for t in ids if not 0 <= t < VOCAB_SIZE), None)
        if bad is not None:  # real SGLang fails later, less politely
            raise BadRequest(f"input id {bad} is outside [0, {VOCAB_SIZE})")
        if (params.get("n") or 1) != 1:
            raise BadRequest("n > 1 is not simulated")
        rid = body.get("rid") or uuid.uuid4().hex
        if rid in self._flights:
            raise BadRequest(f"request id {rid} is already running")
        # Scheduler.init_req_max_new_tokens: None means "up to the context", and never past it
        room = min(self.engine.context_length - 1, self.engine.kv_tokens - 1) - len(ids) - 1
        asked = params.get("max_new_tokens", 128)
        max_new = max(0, room if asked is None else min(asked, room))
        flight = _Flight(rid=rid, body=body, input_ids=list(ids), params=dict(params), max_new_tokens=max_new,
                         received=received, transport=transport)
        if self.record_timings:
            flight.timing = [received, None, None]
            self.timings.setdefault(str(body.get("session_id")), []).append(flight.timing)
        return flight

    async def _start_generation(self, flight: _Flight) -> None:
        """Wait out an injected first-token delay, plan the reply and hand it to the engine."""
        if self.faults.first_token_delay:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(flight.aborted.wait(), self.faults.first_token_delay)
        if flight.aborted.is_set():
            flight.finish = _abort_reason(ABORT_MESSAGE)
            return
        session = flight.body.get("session_params")
        if isinstance(session, dict) and session.get("id") is not None and session["id"] not in self.open_sessions:
            flight.finish = _abort_reason(f"Invalid request: session id {session['id']} does not exist", 400)
            return
        if len(flight.input_ids) >= self.engine.max_req_input_len:  # scheduler's validate_input_length
            flight.finish = _abort_reason(
                f"Input length ({len(flight.input_ids)} tokens) exceeds the maximum allowed length "
                f"({self.engine.max_req_input_len} tokens). Use a shorter input or enable --allow-auto-truncate.", 400)
            return
        reply = self.responder(list(flight.input_ids), dict(flight.params))
        if inspect.isawaitable(reply):
            reply = await reply
        planned, flight.finish = plan_reply(reply, flight.params, flight.max_new_tokens, self.eos_token_ids)
        if not planned:  # nothing to generate: SGLang answers after the prefill alone
            return
        custom = flight.params.get("custom_params")
        # The engine generates exactly the planned reply: a stop token ends it like a length limit
        # would (the same release of prompt + output[:-1]); admission reserves that many tokens.
        sim = SimRequest(
            rid=flight.rid, input_ids=flight.input_ids, max_new_tokens=len(planned),
            session_id=flight.body.get("session_id"), ignore_eos=bool(flight.params.get("ignore_eos", False)),
            custom_params=custom if isinstance(custom, dict) else None, extra_key=flight.body.get("extra_key"),
            cache_salt=flight.body.get("cache_salt"), output_source=lambda n: planned[:n],
            on_update=self._on_update, stream=True,  # every step, so an abort reports the partial output
        )
        try:
            self.engine.submit(sim)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None
        flight.sim = sim
        if self.l3 is not None:  # SGLang prefetches what storage holds beyond the worker's own cache
            flight.storage_hit = min(self.l3.read(flight.input_ids, sim.cache_salt), len(flight.input_ids) - 1)
        self._kick_engine()

    async def _updates(self, flight: _Flight):
        """(output_ids, finished) as the engine releases them; stops early if the server dies."""
        if flight.dropped:
            raise _Dropped
        if flight.sim is None:
            yield [], True
            return
        while True:
            update = await flight.updates.get()
            if update is _DROPPED:
                raise _Dropped
            if flight.first_token_at is None and update[0]:
                flight.first_token_at = time.time()
            yield update
            if update[1]:
                return

    async def _once(self, request: web.Request, flight: _Flight, drop: bool) -> web.StreamResponse:
        try:
            await self._start_generation(flight)
            async for output, finished in self._updates(flight):
                if finished:
                    final = self._final(flight, output)
                    if flight.finish["type"] == "abort" and flight.finish.get("status_code") == 400:
                        return _json({"error": {"message": flight.finish["message"]}}, 400)
                    if drop:
                        break
                    return _json(final, 200)
        except GenerateRequestError as exc:
            return _json({"error": {"message": str(exc)}}, 400)
        except _Dropped:
            pass
        except asyncio.CancelledError:  # the client went away (a server with handler cancellation)
            self._client_gone(flight)
            raise
        _drop_connection(request)
        return web.Response(status=500)  # never reaches the client

    async def _stream(self, request: web.Request, flight: _Flight, drop: bool) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
        interval, sent = max(1, flight.params.get("stream_interval") or self.stream_interval), -1
        try:
            if flight.dropped:
                raise _Dropped
            await resp.prepare(request)  # SGLang's StreamingResponse sends its headers at once
            try:
                await self._start_generation(flight)
            except GenerateRequestError as exc:
                await resp.write(_sse(_error_event(str(exc))))
                await resp.write(b"data: [DONE]\n\n")
                return resp
            async for output, finished in self._updates(flight):
                if drop and len(output) > self.faults.drop_after_tokens:
                    self._abort(flight.rid)
                    _drop_connection(request)
                    return resp
                # OutputStreamer: the first token at once, then every `stream_interval` unsent tokens
                if not finished and sent >= 0 and len(output) - sent < interval:
                    continue
                chunk = self._final(flight, output) if finished else self._chunk(flight, output, None)
                await resp.write(_sse(chunk))
                sent = len(output)
                self._note_sent(flight, output, finished)
            await resp.write(b"data: [DONE]\n\n")
        except _Dropped:
            if not resp.prepared:
                return web.Response(status=500)  # never reaches the client
        except (ConnectionError, asyncio.CancelledError):
            self.client_disconnects.append(flight.rid)
            self._client_gone(flight)
        return resp

    def _client_gone(self, flight: _Flight) -> None:
        """SGLang aborts a request whose client went away. Its answer is not a result, unless an
        /abort_request for it came first (the engine had answered that abort, to nobody)."""
        self._abort(flight.rid)
        if not flight.abort_requested:
            return
        while not flight.updates.empty():
            update = flight.updates.get_nowait()
            if update is not _DROPPED and update[1]:
                self._final(flight, update[0])
                return

    def _final(self, flight: _Flight, output: list[int]) -> dict[str, Any]:
        """The last payload of a generation: from here on it no longer runs."""
        self._flights.pop(flight.rid, None)
        sim = flight.sim
        reason = flight.finish
        if sim is not None and sim.finish_reason is not None and sim.finish_reason.get("type") == "abort":
            reason = sim.finish_reason
        final = self._chunk(flight, output, reason)
        self._keep(self.results, final)
        if self.l3 is not None and sim is not None and sim.first_token_s is not None:
            self.l3.write(list(flight.input_ids) + list(output[:-1]), sim.cache_salt)  # written through
        return final

    def _chunk(self, flight: _Flight, output: list[int], finish: dict[str, Any] | None) -> dict[str, Any]:
        sim = flight.sim
        cached = sim.cached_tokens if sim is not None else 0
        storage = max(flight.storage_hit - cached, 0) if sim is not None and sim.first_token_s is not None else 0
        cached += storage
        now = time.time()
        meta: dict[str, Any] = {
            "id": flight.rid,
            "finish_reason": finish,
            "prompt_tokens": len(flight.input_ids),
            "weight_version": "default",
            "completion_tokens": len(output),
            "cached_tokens": cached,
            "reasoning_tokens": 0,
            "num_retractions": sim.num_retractions if sim is not None else 0,
            "e2e_latency": now - flight.received,
            "request_received_ts": flight.received,
        }
        if cached > 0:
            host = sim.cached_tokens_host if sim is not None else 0
            meta["cached_tokens_details"] = {"device": cached - host - storage, "host": host}
            if self.l3 is not None:
                meta["cached_tokens_details"]["storage"] = storage
        if sim is not None and sim.first_token_s is not None:
            meta["queue_time"] = max(0.0, (sim.first_token_s - sim.arrival_s) / self.time_scale)
        if flight.first_token_at is not None:
            meta["first_token_latency"] = flight.first_token_at - flight.received
        return {"output_ids": list(output), "meta_info": meta}

    def _note_sent(self, flight: _Flight, output: list[int], finished: bool) -> None:
        if flight.timing is not None:
            if flight.timing[1] is None and output:
                flight.timing[1] = time.time()
            if finished:
                flight.timing[2] = time.time()

    def _abort(self, rid: str) -> None:
        flight = self._flights.get(rid)
        if flight is None:
            return
        flight.aborted.set()
        if flight.sim is not None and self.engine.abort(rid):
            self._kick_engine()
            self._flush()

    # ------------------------------------------------------------------ other routes
    async def handle_abort(self, request: web.Request) -> web.Response:
        body = await _body(request)
        self._keep(self.aborts, body)
        rids = list(self._flights) if body.get("abort_all") else [str(body["rid"])] if body.get("rid") else []
        for rid in rids:
            if rid in self._flights:
                self._flights[rid].abort_requested = True
                self._abort(rid)
        return web.Response(status=200)

    async def handle_open_session(self, request: web.Request) -> web.Response:
        body = await _body(request)
        self._keep(self.opened_sessions, body)
        if "capacity_of_str_len" not in body:
            return _json({"error": "Object missing required field `capacity_of_str_len`"}, 400)
        if body.get("streaming") and not self.enable_streaming_session:
            message = "Streaming sessions are disabled. Please relaunch with --enable-streaming-session."
            return _json({"error": {"message": message}}, 400)
        session_id = body.get("session_id") or uuid.uuid4().hex
        if session_id in self.open_sessions:
            message = "Failed to open the session. Check if a session with the same id is still open."
            return _json({"error": {"message": message}}, 400)
        self.open_sessions[session_id] = body
        return _json(session_id, 200)

    async def handle_close_session(self, request: web.Request) -> web.Response:
        body = await _body(request)
        self._keep(self.closed_sessions, body)
        if "session_id" not in body:
            return _json({"error": "Object missing required field `session_id`"}, 400)
        self.open_sessions.pop(str(body["session_id"]), None)
        self.engine.close_session(str(body["session_id"]))
        self._kick_engine()
        return web.Response(status=200)

    async def handle_set_internal_state(self, request: web.Request) -> web.Response:
        """SGLang's answer: one ``updated`` flag per DP rank; msgspec's refusal for a bad body."""
        body = await _body(request)
        self._keep(self.internal_state_updates, body)
        args = body.get("server_args")
        if not isinstance(args, dict):
            return _json({"error": "Object missing required field `server_args`"}, 400)
        for key, value in args.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                return _json({"error": f"Expected `int | float`, got `{type(value).__name__}` - at `$.server_args[{key!r}]`"}, 400)
        return _json([self.engine.set_internal_state(args)], 200)

    async def handle_flush_cache(self, request: web.Request) -> web.Response:
        if self.record:
            self.flushes += 1
        if self._flights or not self.engine.flush_cache():
            return web.Response(status=400, text="Flush cache failed.\n")
        return web.Response(status=200, text="Cache flushed.\nPlease check backend logs for more details. "
                            "(When there are running or waiting requests, the operation will not be performed.)\n")

    def server_info(self) -> dict[str, Any]:
        """Flat resolved server args + scheduler info + version (0.5.23's layout, abridged), then
        ``server_info_overrides`` (a test's lie about the engine, e.g. a bigger KV pool)."""
        e = self.engine
        state: dict[str, Any] = {"memory_usage": {}, "last_gen_throughput": 0.0}
        if e.mgr is not None:
            state["session_ttl"] = e.mgr.snapshot()
        info = {
            "model_path": self.model_path, "tokenizer_path": self.tokenizer_path,
            "served_model_name": self.model_name, "skip_tokenizer_init": True,
            "context_length": e.context_length, "max_total_tokens": e.kv_tokens, "page_size": 1,
            "host": self.host, "port": self.port, "enable_metrics": True, "enable_cache_report": True,
            "disable_radix_cache": getattr(e, "disable_radix_cache", False),
            "enable_session_radix_cache": e.session_radix_cache,
            "enable_streaming_session": self.enable_streaming_session,
            "radix_eviction_policy": e.policy, "radix_eviction_policy_config": e.policy_config or None,
            "chunked_prefill_size": e.chunked_prefill_size, "max_prefill_tokens": e.max_prefill_tokens,
            "max_running_requests": e.max_running_requests, "schedule_policy": "fcfs", "load_format": "dummy",
            "launch_command": f"python -m sglang.launch_server --model-path {self.model_path} "
                              "--skip-tokenizer-init --enable-metrics --enable-cache-report",
            "status": "ready", "max_total_num_tokens": e.kv_tokens, "max_req_input_len": e.max_req_input_len,
            "startup_time": self._startup, "internal_states": [state], "version": SGLANG_VERSION,
            "frontend": "python", **e.hicache_server_args(),
            "simulated": True, "time_scale": self.time_scale, "cost_model": e.cost.to_dict(),
            "simulated_host_pool_tokens": e.host_pool_tokens(),
        }
        if self.l3 is not None:
            info.update(hicache_storage_backend="file", hicache_storage_prefetch_policy="wait_complete")
        return {**info, **self.server_info_overrides}

    async def handle_server_info(self, request: web.Request) -> web.Response:
        return _json(self.server_info(), 200)

    async def handle_model_info(self, request: web.Request) -> web.Response:
        return _json({"model_path": self.model_path, "served_model_name": self.model_name,
                      "tokenizer_path": self.tokenizer_path, "is_generation": True, "weight_version": "default",
                      "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}, 200)

    async def handle_health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def handle_models(self, request: web.Request) -> web.Response:
        card = {"id": self.model_name, "object": "model", "created": int(self._startup), "owned_by": "sglang",
                "root": self.model_name, "parent": None, "max_model_len": self.engine.context_length}
        return _json({"object": "list", "data": [card]}, 200)

    async def handle_metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.engine.metrics_text(self.model_name).encode(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def handle_timings(self, request: web.Request) -> web.Response:
        """Not SGLang's: per session, [received, first token sent, last token sent] of each request."""
        return _json(self.timings, 200)

    @web.middleware
    async def _note_call(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self.record:
            self.calls.append((request.method, request.path, request.headers.get("Authorization")))
        return await handler(request)


# --------------------------------------------------------------------------------------------


class _Dropped(Exception):
    """The server was stopped under a request."""


def _abort_reason(message: str, status_code: int | None = None) -> dict[str, Any]:
    """FINISH_ABORT.to_json(); ``set_finish_with_abort`` (a refused request) sets status 400."""
    return {"type": "abort", "message": message, "status_code": status_code,
            "err_type": "BadRequestError" if status_code == 400 else None}


async def _refuse(request: web.Request, message: str, stream: bool) -> web.StreamResponse:
    """A semantic error: 400 with an error object, or (streaming) an SSE error event with 200."""
    if not stream:
        return _json({"error": {"message": message}}, 400)
    resp = await _start_sse(request)
    await resp.write(_sse(_error_event(message)))
    await resp.write(b"data: [DONE]\n\n")
    return resp


def _error_event(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": 400, "retryable": False}}


def _json(payload: Any, status: int) -> web.Response:
    return web.Response(status=status, body=json.dumps(payload).encode(), content_type="application/json")


async def _body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw:
        return dict(request.query)
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


async def _start_sse(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    return resp


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def _drop_connection(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()


async def _wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"simulated SGLang: timed out waiting for {what}")
        await asyncio.sleep(0.005)


def serve(engine: SimEngine, host: str, port: int, **kwargs: Any) -> None:
    """Serve until interrupted (``sglang-sidecar simulate --serve``)."""
    server = SimServer(engine, **kwargs)
    web.run_app(server.build_app(), host=host, port=port, access_log=None, handler_cancellation=True,
                print=lambda msg: log.warning("%s", msg))


def run_in_thread(server: SimServer, host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0):
    """Serve ``server`` from a background thread (see ``http_contract.serve_in_thread``); yields its URL."""
    return serve_in_thread(server, host, port, timeout, name="sim-sglang")
