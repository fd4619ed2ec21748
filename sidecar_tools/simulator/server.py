"""``sglang-sidecar simulate --serve``: the simulated engine behind SGLang's HTTP contract.

The subset the sidecar (and ``sidecar_tools.benchmarks.replay --mode generate``) uses, as SGLang 0.5.23 answers
it when started with ``--skip-tokenizer-init --enable-metrics --enable-cache-report``:

* ``POST|PUT /generate`` - ``input_ids`` (text prompts are refused), ``sampling_params``
  (unknown keys refused), top-level ``session_id``, ``rid``, ``stream``; SSE chunks with
  *cumulative* ``output_ids`` and ``meta_info`` (``prompt_tokens``, ``completion_tokens``,
  ``cached_tokens``, ``finish_reason``, ...), ``data: [DONE]``; a client that hangs up aborts;
* ``custom_params.session_lease_ttl_s`` reaches the ``session_ttl`` plugin (when that is the policy);
* ``/abort_request``, ``/open_session``, ``/close_session``, ``/flush_cache`` (idle only),
  ``/server_info`` (``max_total_num_tokens``, ``max_req_input_len``, ...), ``/model_info``,
  ``/health``, ``/v1/models``, ``/metrics``.

Time: the engine is advanced to wall-clock targets (``time_scale`` virtual seconds per wall
second); a step's tokens are released when the wall clock reaches the step's end, so streams,
TTFT and gaps behave like the GPU's (at the cost model's speed). Generated ids are pseudo-random
plain tokens (never EOS), like SGLang's dummy weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import time
import uuid
from typing import Any

from aiohttp import web

from sidecar_tools.simulator.engine import SimEngine, SimRequest
from sidecar_tools.simulator.generate_request import VOCAB_SIZE, GenerateRequestError, SchemaError, check_prompt, check_sampling, check_schema
from sidecar_tools.simulator.http_contract import serve_in_thread, sglang_app

log = logging.getLogger(__name__)

SGLANG_VERSION = "0.5.23"
TOKEN_LOW, TOKEN_HIGH = 1000, 150000
class BadRequest(GenerateRequestError):
    """A request the simulator does not emulate (batches, n > 1, ...)."""


class SimServer:
    def __init__(self, engine: SimEngine, *, time_scale: float = 1.0, granularity_s: float = 0.02,
                 model_name: str = "simulated-qwen3-8b", tokenizer_path: str | None = None, seed: int = 0):
        self.engine = engine
        self.time_scale = time_scale
        self.granularity_s = granularity_s
        self.model_name = model_name
        self.tokenizer_path = tokenizer_path or model_name
        self.seed = seed
        self._pending: list[tuple[SimRequest, list[int], bool]] = []
        self._queues: dict[str, asyncio.Queue] = {}
        self._received: dict[str, float] = {}
        self._kick: asyncio.Event | None = None
        self._driver: asyncio.Task | None = None
        self._wall0 = 0.0
        self._v0 = 0.0
        self._startup = time.time()
        self.url: str | None = None
        self._runner: web.AppRunner | None = None

    # ------------------------------------------------------------------ clock
    def vnow(self) -> float:
        return self._v0 + (time.monotonic() - self._wall0) * self.time_scale

    def _wall_for(self, v: float) -> float:
        return self._wall0 + (v - self._v0) / self.time_scale

    # ------------------------------------------------------------------ lifecycle
    def build_app(self) -> web.Application:
        app = sglang_app(self)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        self._kick = asyncio.Event()
        self._wall0 = time.monotonic()
        self._v0 = self.engine.now
        self._driver = asyncio.create_task(self._drive())

    async def _on_cleanup(self, app: web.Application) -> None:
        if self._driver is not None:
            self._driver.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._driver

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self._runner = web.AppRunner(self.build_app(), shutdown_timeout=0.5, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await site.start()
        bound = self._runner.addresses[0][1]
        self.url = f"http://{host}:{bound}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ------------------------------------------------------------------ the engine driver
    async def _drive(self) -> None:
        engine = self.engine
        while True:
            try:
                if not engine.busy:
                    wake = engine.next_wakeup()
                    expiry = engine.next_lease_expiry()
                    targets = [x for x in (wake, expiry) if x is not None and x > engine.now]
                    timeout = None
                    if targets:
                        timeout = max(0.0, self._wall_for(min(targets)) - time.monotonic())
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._kick.wait(), timeout)
                    self._kick.clear()
                    engine.advance_idle(self.vnow())
                    continue
                engine.step(horizon=engine.now + self.granularity_s)
                delay = self._wall_for(engine.now) - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    await asyncio.sleep(0)
                self._flush()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("simulated engine step failed")
                await asyncio.sleep(0.1)

    def _on_update(self, sim: SimRequest) -> None:
        self._pending.append((sim, list(sim.output_ids), sim.finished))

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        for sim, output, finished in pending:
            q = self._queues.get(sim.rid)
            if q is not None:
                q.put_nowait((output, finished))

    def _kick_engine(self) -> None:
        self.engine.notify()
        if self._kick is not None:
            self._kick.set()

    # ------------------------------------------------------------------ /generate
    def _parse(self, body: dict) -> SimRequest:
        """A schema-checked body as the simulated request (SGLang's semantic checks first)."""
        ids = check_prompt(body)
        if not all(isinstance(t, int) for t in ids):
            raise BadRequest("a batch of prompts is not simulated: send one flat list of token ids")
        bad = next((t for t in ids if not 0 <= t < VOCAB_SIZE), None)
        if bad is not None:
            raise BadRequest(f"input id {bad} is outside [0, {VOCAB_SIZE})")
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise BadRequest("a batch of sampling_params is not simulated")
        check_sampling(params)
        if (params.get("n") or 1) != 1:
            raise BadRequest("n > 1 is not simulated")
        max_new = params.get("max_new_tokens", 128)
        if max_new is None:
            max_new = self.engine.context_length - len(ids)
        if not isinstance(max_new, int) or max_new < 1:
            raise BadRequest(f"max_new_tokens must be at least 1 in the simulator, got {max_new}.")
        custom = params.get("custom_params")
        rid = body.get("rid") or uuid.uuid4().hex
        if not isinstance(rid, str):
            raise BadRequest("rid must be a string")
        rng = random.Random(f"{self.seed}:{rid}")
        return SimRequest(
            rid=rid, input_ids=list(ids), max_new_tokens=int(max_new), session_id=body.get("session_id"),
            cache_salt=body.get("cache_salt") or None,
            ignore_eos=bool(params.get("ignore_eos", False)), custom_params=custom if isinstance(custom, dict) else None,
            output_source=lambda n: [rng.randrange(TOKEN_LOW, TOKEN_HIGH) for _ in range(n)],
            on_update=self._on_update, stream=bool(body.get("stream")),
        )

    def _meta(self, sim: SimRequest, output: list[int], finished: bool) -> dict[str, Any]:
        received = self._received.get(sim.rid, time.time())
        now = time.time()
        meta: dict[str, Any] = {
            "id": sim.rid,
            "finish_reason": sim.finish_reason if finished else None,
            "prompt_tokens": len(sim.input_ids),
            "weight_version": "default",
            "completion_tokens": len(output),
            "cached_tokens": sim.cached_tokens,
            "reasoning_tokens": 0,
            "num_retractions": sim.num_retractions,
            "e2e_latency": now - received,
            "request_received_ts": received,
        }
        if sim.cached_tokens > 0:
            meta["cached_tokens_details"] = {"device": sim.cached_tokens, "host": 0}
        if sim.first_token_s is not None:
            meta["queue_time"] = max(0.0, (sim.first_token_s - sim.arrival_s) / self.time_scale)
        return meta

    async def handle_generate(self, request: web.Request) -> web.StreamResponse:
        received = time.time()
        try:
            body = await request.json()
        except ValueError:
            return _json({"error": "request body is not valid JSON"}, 400)
        stream = isinstance(body, dict) and bool(body.get("stream"))
        try:
            check_schema(body)
        except SchemaError as exc:  # SGLang's schema gate answers before any stream starts
            return _json({"error": str(exc)}, 400)
        try:
            sim = self._parse(body)
            self._received[sim.rid] = received
            queue: asyncio.Queue = asyncio.Queue()
            self._queues[sim.rid] = queue
            try:
                self.engine.submit(sim)
            except ValueError:
                self._queues.pop(sim.rid, None)
                raise
        except ValueError as exc:
            if stream:
                resp = await _start_sse(request)
                await resp.write(_sse({"error": {"message": str(exc), "type": "invalid_request_error",
                                                 "code": 400, "retryable": False}}))
                await resp.write(b"data: [DONE]\n\n")
                return resp
            return _json({"error": {"message": str(exc)}}, 400)
        self._kick_engine()
        try:
            if stream:
                return await self._stream(request, sim, queue)
            return await self._once(sim, queue)
        finally:
            self._queues.pop(sim.rid, None)
            self._received.pop(sim.rid, None)

    async def _once(self, sim: SimRequest, queue: asyncio.Queue) -> web.Response:
        try:
            while True:
                output, finished = await queue.get()
                if finished:
                    return _json({"output_ids": output, "meta_info": self._meta(sim, output, True)}, 200)
        except asyncio.CancelledError:
            self.engine.abort(sim.rid)
            raise

    async def _stream(self, request: web.Request, sim: SimRequest, queue: asyncio.Queue) -> web.StreamResponse:
        resp = await _start_sse(request)
        try:
            while True:
                output, finished = await queue.get()
                await resp.write(_sse({"output_ids": output, "meta_info": self._meta(sim, output, finished)}))
                if finished:
                    break
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionError, asyncio.CancelledError):
            self.engine.abort(sim.rid)  # SGLang aborts a request whose client went away
            raise
        return resp

    # ------------------------------------------------------------------ other routes
    async def handle_abort(self, request: web.Request) -> web.Response:
        body = await _body(request)
        if body.get("abort_all"):
            for rid in list(self._queues):
                self.engine.abort(rid)
        elif body.get("rid"):
            self.engine.abort(str(body["rid"]))
        self._kick_engine()
        self._flush()
        return web.Response(status=200)

    async def handle_open_session(self, request: web.Request) -> web.Response:
        body = await _body(request)
        if "capacity_of_str_len" not in body:
            return _json({"error": "Object missing required field `capacity_of_str_len`"}, 400)
        return _json(body.get("session_id") or uuid.uuid4().hex, 200)

    async def handle_close_session(self, request: web.Request) -> web.Response:
        body = await _body(request)
        if "session_id" not in body:
            return _json({"error": "Object missing required field `session_id`"}, 400)
        self.engine.close_session(str(body["session_id"]))
        self._kick_engine()
        return web.Response(status=200)

    async def handle_flush_cache(self, request: web.Request) -> web.Response:
        if not self.engine.flush_cache():
            return web.Response(status=400, text="Flush cache failed.\n")
        return web.Response(status=200, text="Cache flushed.\nPlease check backend logs for more details. "
                            "(When there are running or waiting requests, the operation will not be performed.)\n")

    def server_info(self) -> dict[str, Any]:
        e = self.engine
        state: dict[str, Any] = {"memory_usage": {}, "last_gen_throughput": 0.0}
        if e.mgr is not None:
            state["session_ttl"] = e.mgr.snapshot()
        return {
            "model_path": self.model_name, "tokenizer_path": self.tokenizer_path,
            "served_model_name": self.model_name, "skip_tokenizer_init": True,
            "context_length": e.context_length, "max_total_tokens": e.kv_tokens, "page_size": 1,
            "enable_metrics": True, "enable_cache_report": True, "disable_radix_cache": False,
            "radix_eviction_policy": e.policy, "radix_eviction_policy_config": e.policy_config or None,
            "chunked_prefill_size": e.chunked_prefill_size, "max_prefill_tokens": e.max_prefill_tokens,
            "schedule_policy": "fcfs", "load_format": "dummy", "status": "ready",
            "max_total_num_tokens": e.kv_tokens, "max_req_input_len": e.max_req_input_len,
            "startup_time": self._startup, "internal_states": [state], "version": SGLANG_VERSION,
            "simulated": True, "time_scale": self.time_scale, "cost_model": e.cost.to_dict(),
        }

    async def handle_server_info(self, request: web.Request) -> web.Response:
        return _json(self.server_info(), 200)

    async def handle_model_info(self, request: web.Request) -> web.Response:
        return _json({"model_path": self.model_name, "served_model_name": self.model_name,
                      "tokenizer_path": self.tokenizer_path, "is_generation": True, "weight_version": "default",
                      "model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"]}, 200)

    async def handle_health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def handle_models(self, request: web.Request) -> web.Response:
        card = {"id": self.model_name, "object": "model", "created": int(self._startup), "owned_by": "sglang",
                "root": self.model_name, "parent": None, "max_model_len": self.engine.context_length}
        return _json({"object": "list", "data": [card]}, 200)

    async def handle_metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.engine.metrics_text(self.model_name).encode(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


# --------------------------------------------------------------------------------------------


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


def serve(engine: SimEngine, host: str, port: int, **kwargs: Any) -> None:
    """Serve until interrupted (``sglang-sidecar simulate --serve``)."""
    server = SimServer(engine, **kwargs)
    web.run_app(server.build_app(), host=host, port=port, access_log=None, handler_cancellation=True,
                print=lambda msg: log.warning("%s", msg))


def run_in_thread(server: SimServer, host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0):
    """Serve ``server`` from a background thread (see ``http_contract.serve_in_thread``); yields its URL."""
    return serve_in_thread(server, host, port, timeout, name="sim-sglang")
