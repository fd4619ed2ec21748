"""In-process test double for an SGLang 0.5.23 HTTP server.

Why: the sidecar talks to SGLang only over HTTP, and CI has no GPU, so tests
need a server that speaks SGLang's native contract faithfully enough that a
sidecar passing against it also works against the real thing. The double
emulates a server launched with::

    --skip-tokenizer-init --enable-metrics --enable-cache-report

i.e. ``input_ids`` are required, responses carry ``output_ids`` and no
``text``, ``/metrics`` exists and ``meta_info.cached_tokens`` is reported.
Behaviour was taken from the 0.5.23 wheel (``srt/entrypoints/http_server.py``,
``srt/managers/tokenizer_manager.py``, ``srt/sampling/sampling_params.py``,
``api/v1/api_types.py``); see ``/work/shared/docs/sglang-0.5.23-internals.md``.

The "model" is a pluggable ``responder(input_ids, sampling_params) -> ids``
(may be async). The double applies SGLang's stop rules (EOS ids,
``stop_token_ids``, ``ignore_eos``, ``max_new_tokens``) to whatever the
responder returns and streams the result token by token.

Prefix caching is a real token-level radix tree with a capacity in tokens and
LRU leaf eviction, so ``cached_tokens`` grows across turns of a session and
drops after eviction, like the real radix cache (page size 1).

Usage (asyncio)::

    double = SGLangDouble(max_total_num_tokens=4096)
    await double.start()
    ... POST f"{double.url}/generate" ...
    await double.stop()

Usage (plain thread, e.g. synchronous ``openai`` client tests)::

    with run_in_thread(SGLangDouble()) as url:
        ...
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import heapq
import inspect
import itertools
import json
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterator, Optional, Union

from aiohttp import web

from sidecar_tools.simulator.generate_request import VOCAB_SIZE as QWEN3_VOCAB_SIZE
from sidecar_tools.simulator.generate_request import GenerateRequestError, SchemaError, check_prompt, check_sampling, check_schema
from sidecar_tools.simulator.http_contract import serve_in_thread, sglang_app

SGLANG_VERSION = "0.5.23"

IM_END_ID = 151645
ENDOFTEXT_ID = 151643
DEFAULT_EOS_IDS = (IM_END_ID, ENDOFTEXT_ID)
QWEN3_NUM_BPE_TOKENS = 151643  # ids below this are plain BPE tokens

Responder = Callable[[list, dict], Union[list, Awaitable[list]]]

ABORT_MESSAGE = "Aborted by AbortReq."


# --------------------------------------------------------------------------- model


def make_random_responder(seed: int = 0, vocab: tuple[int, int] = (0, QWEN3_NUM_BPE_TOKENS)) -> Responder:
    """Deterministic pseudo-random "model": same input + seed -> same output.

    Emits ``max_new_tokens`` ids in ``[vocab[0], vocab[1])`` and never a
    special id, so by default generation finishes with ``length``.
    """
    low, high = vocab

    def responder(input_ids: list, sampling_params: dict) -> list:
        digest = hashlib.sha256(f"{seed}:{input_ids}".encode()).digest()
        rng = random.Random(int.from_bytes(digest[:8], "big"))
        count = sampling_params.get("max_new_tokens")
        count = 128 if count is None else count
        return [rng.randrange(low, high) for _ in range(count)]

    return responder


def scripted_responder(*outputs: list) -> Responder:
    """Return the given id lists in order (the last one repeats).

    E.g. ``scripted_responder(tok.encode('<tool_call>...</tool_call>') + [151645])``.
    """
    queue = [list(o) for o in outputs]

    def responder(input_ids: list, sampling_params: dict) -> list:
        return list(queue.pop(0) if len(queue) > 1 else queue[0])

    return responder


# --------------------------------------------------------------------------- prefix cache


class _Node:
    __slots__ = ("children", "parent", "token", "last_access")

    def __init__(self, parent: Optional["_Node"], token: Any):
        self.children: dict[Any, _Node] = {}
        self.parent = parent
        self.token = token
        self.last_access = 0


class PrefixCache:
    """Token-level radix tree with a token capacity and LRU leaf eviction.

    Mirrors what matters of SGLang's radix cache for a sidecar: a request's
    ``cached_tokens`` is the longest cached prefix of its prompt, finished
    sequences are inserted, and when the pool is full the least recently used
    leaves are evicted first (so a shared system prompt outlives old tails).
    ``namespace`` models ``extra_key``/``cache_salt`` (disjoint prefixes).
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._roots: dict[Any, _Node] = {}
        self._size = 0
        self._clock = itertools.count(1)
        self.evicted_tokens_total = 0
        self._lock = threading.Lock()

    @property
    def size(self) -> int:
        return self._size

    def match(self, tokens: list, namespace: Any = None) -> int:
        """Length of the longest cached prefix; touches the matched path (LRU)."""
        with self._lock:
            node = self._roots.get(namespace)
            now = next(self._clock)
            length = 0
            for token in tokens:
                if node is None or token not in node.children:
                    break
                node = node.children[token]
                node.last_access = now
                length += 1
            return length

    def insert(self, tokens: list, namespace: Any = None) -> None:
        """Insert a sequence, then evict LRU leaves beyond capacity."""
        with self._lock:
            node = self._roots.setdefault(namespace, _Node(None, None))
            now = next(self._clock)
            path = set()
            for token in tokens:
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = _Node(node, token)
                    self._size += 1
                child.last_access = now
                path.add(id(child))
                node = child
            self._evict(protect=path)

    def reset(self) -> None:
        with self._lock:
            self._roots.clear()
            self._size = 0

    def _evict(self, protect: set) -> None:
        if self._size <= self.capacity:
            return
        heap = [(n.last_access, id(n), n) for n in self._leaves() if id(n) not in protect]
        heapq.heapify(heap)
        while self._size > self.capacity and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            del parent.children[leaf.token]
            self._size -= 1
            self.evicted_tokens_total += 1
            if parent.parent is not None and not parent.children and id(parent) not in protect:
                heapq.heappush(heap, (parent.last_access, id(parent), parent))
        if self._size > self.capacity:  # the protected sequence alone is too long
            self._evict_protected_tail(protect)

    def _evict_protected_tail(self, protect: set) -> None:
        leaves = sorted((n for n in self._leaves()), key=lambda n: n.last_access)
        for leaf in leaves:
            while self._size > self.capacity and leaf.parent is not None and not leaf.children:
                parent = leaf.parent
                del parent.children[leaf.token]
                self._size -= 1
                self.evicted_tokens_total += 1
                leaf = parent
                if leaf.parent is None:
                    break

    def _leaves(self) -> Iterator[_Node]:
        stack = [child for root in self._roots.values() for child in root.children.values()]
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                yield node


# --------------------------------------------------------------------------- faults


@dataclass
class Faults:
    """Fault injection knobs; each ``*_next`` counter is consumed per /generate.

    * ``fail_next``: that many requests answer ``fail_status`` with ``fail_body``.
    * ``drop_next``: that many requests lose their connection after
      ``drop_after_tokens`` streamed tokens (non-streaming: no response at all).
    * ``first_token_delay``: seconds to wait before the first token (all requests).
    * ``hang_up_next``: that many requests find their connection closed before any response
      line, as when SGLang's uvicorn drops a keep-alive connection idle for 5 s
      (SGLANG_TIMEOUT_KEEP_ALIVE) just as the client reuses it. Nothing was processed.
    """

    fail_next: int = 0
    fail_status: int = 503
    fail_body: Any = field(default_factory=lambda: {"error": {"message": "Service Unavailable (injected)"}})
    drop_next: int = 0
    drop_after_tokens: int = 0
    first_token_delay: float = 0.0
    hang_up_next: int = 0

    def take_hang_up(self) -> bool:
        if self.hang_up_next > 0:
            self.hang_up_next -= 1
            return True
        return False

    def take_failure(self) -> bool:
        if self.fail_next > 0:
            self.fail_next -= 1
            return True
        return False

    def take_drop(self) -> bool:
        if self.drop_next > 0:
            self.drop_next -= 1
            return True
        return False


@dataclass
class _Running:
    rid: str
    abort: asyncio.Event
    transport: Any
    drop_now: bool = False


# --------------------------------------------------------------------------- the double


class SGLangDouble:
    """aiohttp server following SGLang 0.5.23's HTTP contract (see module doc).

    Test-facing attributes:

    * ``url`` - ``http://host:port`` once started.
    * ``requests`` - every JSON body POSTed to /generate (deep copies, in order).
    * ``results`` - final response payload of every finished generation.
    * ``aborts`` / ``opened_sessions`` / ``closed_sessions`` / ``flushes`` -
      what the double received on those routes; ``open_sessions`` the live ones.
    * ``client_disconnects`` - rids whose client hung up mid-stream.
    * ``responder`` - the model; swap at any time.
    * ``faults`` - a :class:`Faults` instance.
    * ``token_delay`` - seconds between streamed tokens (0 still yields).
    * ``healthy`` - /health and /health_generate answer 503 when False.
    * ``cache`` - the :class:`PrefixCache`.
    """

    def __init__(
        self,
        *,
        responder: Optional[Responder] = None,
        seed: int = 0,
        max_total_num_tokens: int = 200_000,
        context_length: int = 40960,
        eos_token_ids: tuple = DEFAULT_EOS_IDS,
        model_path: str = "Qwen/Qwen3-8B",
        served_model_name: Optional[str] = None,
        tokenizer_path: Optional[str] = None,
        token_delay: float = 0.0,
        enable_session_radix_cache: bool = False,
        enable_streaming_session: bool = False,
        cache_last_output_token: bool = False,
    ):
        self.responder: Responder = responder or make_random_responder(seed)
        self.max_total_num_tokens = max_total_num_tokens
        self.context_length = context_length
        self.eos_token_ids = tuple(eos_token_ids)
        self.model_path = model_path
        self.served_model_name = served_model_name or model_path
        self.tokenizer_path = tokenizer_path or model_path
        self.token_delay = token_delay
        self.enable_session_radix_cache = enable_session_radix_cache
        self.enable_streaming_session = enable_streaming_session
        # SGLang commits KV for prompt + output[:-1]: the last sampled token is
        # never fed back, so it is not in the radix tree.
        self.cache_last_output_token = cache_last_output_token
        self.cache = PrefixCache(max_total_num_tokens)
        self.faults = Faults()
        self.healthy = True
        self.url: Optional[str] = None
        self.host: Optional[str] = None
        self.port: Optional[int] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._runner: Optional[web.AppRunner] = None
        self._running: dict[str, _Running] = {}
        self._metrics: dict[str, float] = {}
        self._startup_time = time.time()
        self.clear_records()

    # ------------------------------------------------------------------ lifecycle

    @property
    def max_req_input_len(self) -> int:
        return min(self.context_length - 1, self.max_total_num_tokens - 1)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Bind and serve; returns and sets ``self.url``."""
        self._loop = asyncio.get_running_loop()
        self._runner = web.AppRunner(self._build_app(), shutdown_timeout=0.5, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True)
        await site.start()
        bound_host, bound_port = self._runner.addresses[0][:2]
        self.host, self.port = host, bound_port
        self.url = f"http://{host}:{bound_port}"
        return self.url

    async def stop(self) -> None:
        """Stop serving; in-flight connections are dropped."""
        self._drop_all_running()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def restart(self, downtime: float = 0.0) -> None:
        """Simulate a server restart on the same port: in-flight requests are
        dropped, the cache and sessions are forgotten, metrics reset."""
        host, port = self.host or "127.0.0.1", self.port or 0
        await self.stop()
        self.reset_cache()
        self.open_sessions.clear()
        self._metrics.clear()
        if downtime:
            await asyncio.sleep(downtime)
        await self.start(host, port)

    async def __aenter__(self) -> "SGLangDouble":
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    async def wait_for_requests(self, count: int, timeout: float = 5.0) -> list[dict]:
        """Wait until ``count`` /generate bodies have been received."""
        await _wait_until(lambda: len(self.requests) >= count, timeout, f"{count} requests")
        return self.requests

    async def wait_for_running(self, rid: Optional[str] = None, timeout: float = 5.0) -> None:
        """Wait until request ``rid`` (or any request) is generating."""
        await _wait_until(lambda: rid in self._running if rid else bool(self._running), timeout, f"running {rid}")

    def reset_cache(self) -> None:
        """Forget every cached prefix (like /flush_cache, but always succeeds)."""
        self.cache.reset()

    def clear_records(self) -> None:
        """Forget recorded requests/results/aborts/sessions (not the cache)."""
        self.requests: list[dict] = []
        self.results: list[dict] = []
        self.aborts: list[dict] = []
        self.opened_sessions: list[dict] = []
        self.closed_sessions: list[dict] = []
        self.flushes: int = 0
        self.client_disconnects: list[str] = []
        self.open_sessions: dict[str, dict] = {}

    def call_threadsafe(self, coro: Awaitable, timeout: float = 10.0) -> Any:
        """Run a coroutine on the double's loop from another thread (e.g. restart)."""
        if self._loop is None:
            raise RuntimeError("double not started")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @property
    def running_rids(self) -> list[str]:
        return list(self._running)

    def generate_requests(self) -> list[dict]:
        """Alias of ``requests`` (bodies POSTed to /generate)."""
        return self.requests

    # ------------------------------------------------------------------ app

    def _build_app(self) -> web.Application:
        return sglang_app(self)

    # ------------------------------------------------------------------ /generate

    async def handle_generate(self, request: web.Request) -> web.StreamResponse:
        received = time.time()
        if self.faults.take_hang_up():
            _drop_connection(request)
            return web.Response(status=500)  # never reaches the client
        body = await _read_json(request)
        self.requests.append(copy.deepcopy(body))
        if self.faults.take_failure():
            return _json_response(self.faults.fail_body, self.faults.fail_status)
        try:
            check_schema(body)
        except SchemaError as e:
            return _json_response({"error": str(e)}, 400)
        stream = bool(body.get("stream"))
        try:
            req = self._normalize(body)
        except GenerateRequestError as e:
            if stream:
                return await self._stream_error(request, e)
            return _json_response({"error": {"message": str(e)}}, e.status)
        drop = self.faults.take_drop()
        if stream:
            return await self._serve_stream(request, req, received, drop)
        return await self._serve_once(request, req, received, drop)

    def _normalize(self, body: dict) -> dict:
        """Semantic checks SGLang does after the schema gate (ValueError -> 400), then the double's own limits."""
        input_ids = check_prompt(body)
        if input_ids and isinstance(input_ids[0], list) or isinstance(body.get("rid"), list):
            raise GenerateRequestError("SGLangDouble: batch requests are not supported")
        if isinstance(body.get("sampling_params"), list):
            raise GenerateRequestError("SGLangDouble: batch sampling_params are not supported")
        params = dict(body.get("sampling_params") or {})
        check_sampling(params)
        self._check_lengths(input_ids, params)
        if (params.get("n") or 1) != 1:
            raise GenerateRequestError("SGLangDouble: n > 1 (parallel sampling) is not supported")
        return {
            "rid": body.get("rid") or uuid.uuid4().hex,
            "input_ids": list(input_ids),
            "params": params,
            "session_id": body.get("session_id"),
            "session_params": body.get("session_params"),
            "namespace": (body.get("extra_key"), body.get("cache_salt")),
        }

    def _check_lengths(self, input_ids: list, params: dict) -> None:
        bad = next((t for t in input_ids if not 0 <= t < QWEN3_VOCAB_SIZE), None)
        if bad is not None:  # double-only guard: real SGLang fails later, less politely
            raise GenerateRequestError(f"SGLangDouble: input id {bad} is outside [0, {QWEN3_VOCAB_SIZE})")
        n_in = len(input_ids)
        if n_in >= self.context_length:
            raise GenerateRequestError(
                f"The input ({n_in} tokens) is longer than the model's context length ({self.context_length} tokens)."
            )
        max_new = params.get("max_new_tokens", 128)
        if max_new is not None and max_new + n_in > self.context_length:
            raise GenerateRequestError(
                "Requested token count exceeds the model's maximum context length "
                f"of {self.context_length} tokens. You requested a total of {max_new + n_in} "
                f"tokens: {n_in} tokens from the input messages and {max_new} tokens for "
                "the completion. Please reduce the number of tokens in the input messages "
                "or the completion to fit within the limit."
            )

    async def _serve_once(self, request, req, received, drop) -> web.StreamResponse:
        final = None
        async with contextlib.aclosing(self._generate(request, req, received, drop_after=None)) as chunks:
            async for chunk in chunks:
                final = chunk
        if drop or final is None:
            _drop_connection(request)
            return web.Response(status=500)  # never reaches the client
        return _json_response(final, 200)

    async def _serve_stream(self, request, req, received, drop) -> web.StreamResponse:
        resp = await _start_sse(request)
        drop_after = self.faults.drop_after_tokens if drop else None
        try:
            async with contextlib.aclosing(self._generate(request, req, received, drop_after)) as chunks:
                async for chunk in chunks:
                    if chunk is None:  # injected drop / restart
                        _drop_connection(request)
                        return resp
                    await resp.write(_sse(chunk))
            await resp.write(b"data: [DONE]\n\n")
        except ConnectionError:
            # Client went away: SGLang aborts the request (the generator is closed above).
            self.client_disconnects.append(req["rid"])
        return resp

    async def _stream_error(self, request, error: GenerateRequestError) -> web.StreamResponse:
        """SGLang streams validation errors as an SSE error event with HTTP 200."""
        resp = await _start_sse(request)
        payload = {
            "error": {
                "message": str(error),
                "type": "invalid_request_error",
                "code": error.status,
                "retryable": False,
            }
        }
        await resp.write(_sse(payload))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def _generate(self, request, req, received, drop_after):
        """Yield cumulative chunks (the last one finished); ``None`` means drop the connection."""
        rid, params = req["rid"], req["params"]
        running = _Running(rid, asyncio.Event(), request.transport)
        self._running[rid] = running
        try:
            cached = self._admit(req)
            if self.faults.first_token_delay:
                await _sleep_or_abort(running, self.faults.first_token_delay)
            planned = await self._plan_output(req)
            first_token_at = None
            output: list[int] = []
            interval, sent = max(1, params.get("stream_interval") or 1), 0
            finish = self._session_finish(req)
            for token, token_finish in [] if finish else planned:
                if running.abort.is_set() or running.drop_now:
                    break
                output.append(token)
                first_token_at = first_token_at or time.time()
                finish = token_finish
                if drop_after is not None and len(output) > drop_after:
                    yield None
                    return
                # SGLang's OutputStreamer: the first token at once, then every
                # `stream_interval` unsent tokens; the finishing token always.
                if finish is None and (sent == 0 or len(output) - sent >= interval):
                    sent = len(output)
                    yield self._chunk(req, output, cached, None, received, first_token_at)
                if finish is not None:
                    break
                await _sleep_or_abort(running, self.token_delay)
            if running.drop_now:
                yield None
                return
            if running.abort.is_set():
                finish = {"type": "abort", "message": ABORT_MESSAGE, "status_code": None, "err_type": None}
            if finish is None:  # responder ran dry without a stop token
                finish = {"type": "length", "length": len(output)}
            final = self._chunk(req, output, cached, finish, received, first_token_at)
            self._finish(req, output, final)
            yield final
        finally:
            self._running.pop(rid, None)

    def _admit(self, req: dict) -> int:
        """Prefix-match the prompt (at most len-1 tokens, as SGLang always
        computes the last prompt token) and publish the prompt to the cache."""
        input_ids, namespace = req["input_ids"], req["namespace"]
        cached = min(self.cache.match(input_ids, namespace), max(len(input_ids) - 1, 0))
        self.cache.insert(input_ids, namespace)
        self._count("sglang:num_requests_total", 1)
        self._count("sglang:prompt_tokens_total", len(input_ids))
        self._count("sglang:cached_tokens_total", cached)
        return cached

    def _session_finish(self, req: dict) -> Optional[dict]:
        """Classic session_params sessions must have been opened (else abort)."""
        params = req["session_params"]
        if not isinstance(params, dict) or params.get("id") is None:
            return None
        if params["id"] not in self.open_sessions:
            return {
                "type": "abort",
                "message": f"Invalid request: session id {params['id']} does not exist",
                "status_code": None,
                "err_type": None,
            }
        return None

    async def _plan_output(self, req: dict) -> list[tuple[int, Optional[dict]]]:
        """Ask the responder, then apply SGLang's stop rules token by token."""
        params = req["params"]
        raw = self.responder(list(req["input_ids"]), dict(params))
        if inspect.isawaitable(raw):
            raw = await raw
        max_new = params.get("max_new_tokens", 128)
        if max_new is None:
            max_new = self.context_length - len(req["input_ids"])
        stop_ids = set()
        if not params.get("ignore_eos"):
            stop_ids = set(self.eos_token_ids) | set(params.get("stop_token_ids") or [])
        planned: list[tuple[int, Optional[dict]]] = []
        for token in list(raw)[:max_new]:
            finish = None
            if token in stop_ids:
                finish = {"type": "stop", "matched": token}
            elif len(planned) + 1 == max_new:
                finish = {"type": "length", "length": max_new}
            planned.append((int(token), finish))
            if finish is not None:
                break
        return planned

    def _chunk(self, req, output, cached, finish, received, first_token_at) -> dict:
        now = time.time()
        meta = {
            "id": req["rid"],
            "finish_reason": finish,
            "prompt_tokens": len(req["input_ids"]),
            "weight_version": "default",
            "completion_tokens": len(output),
            "cached_tokens": cached,
            "reasoning_tokens": 0,
            "num_retractions": 0,
            "e2e_latency": now - received,
            "queue_time": 0.0,
            "request_received_ts": received,
        }
        if cached > 0:
            meta["cached_tokens_details"] = {"device": cached, "host": 0}
        if first_token_at is not None:
            meta["first_token_latency"] = first_token_at - received
        return {"output_ids": list(output), "meta_info": meta}

    def _finish(self, req: dict, output: list, final: dict) -> None:
        committed = req["input_ids"] + (output if self.cache_last_output_token else output[:-1])
        self.cache.insert(committed, req["namespace"])
        self._count("sglang:generation_tokens_total", len(output))
        if final["meta_info"]["finish_reason"]["type"] == "abort":
            self._count("sglang:num_aborted_requests_total", 1)
        self.results.append(copy.deepcopy(final))

    # ------------------------------------------------------------------ other routes

    async def handle_abort(self, request: web.Request) -> web.Response:
        body = await _read_json(request)
        self.aborts.append(copy.deepcopy(body))
        if body.get("abort_all"):
            for rid in list(self._running):
                self._abort_rid(rid)
        elif body.get("rid"):
            self._abort_rid(body["rid"])
        return web.Response(status=200)

    def _abort_rid(self, rid: str) -> None:
        running = self._running.get(rid)
        if running is not None:
            running.abort.set()

    def _drop_all_running(self) -> None:
        for running in list(self._running.values()):
            running.drop_now = True
            running.abort.set()
            if running.transport is not None:
                running.transport.close()

    async def handle_server_info(self, request: web.Request) -> web.Response:
        return _json_response(self.server_info(), 200)

    def server_info(self) -> dict:
        """Flat resolved server args + scheduler info + version (0.5.23 layout, abridged)."""
        args = {
            "model_path": self.model_path,
            "tokenizer_path": self.tokenizer_path,
            "served_model_name": self.served_model_name,
            "skip_tokenizer_init": True,
            "context_length": self.context_length,
            "max_total_tokens": self.max_total_num_tokens,
            "page_size": 1,
            "host": self.host,
            "port": self.port,
            "enable_metrics": True,
            "enable_cache_report": True,
            "enable_session_radix_cache": self.enable_session_radix_cache,
            "enable_streaming_session": self.enable_streaming_session,
            "disable_radix_cache": False,
            "radix_eviction_policy": "lru",
            "schedule_policy": "fcfs",
            "load_format": "dummy",
        }
        scheduler = {
            "status": "ready",
            "max_total_num_tokens": self.max_total_num_tokens,
            "max_req_input_len": self.max_req_input_len,
            "startup_time": self._startup_time,
        }
        return {
            **args,
            "launch_command": f"python -m sglang.launch_server --model-path {self.model_path} "
            "--skip-tokenizer-init --enable-metrics --enable-cache-report",
            **scheduler,
            "internal_states": [{"memory_usage": {}, "last_gen_throughput": 0.0}],
            "version": SGLANG_VERSION,
            "frontend": "python",
        }

    async def handle_model_info(self, request: web.Request) -> web.Response:
        return _json_response(
            {
                "model_path": self.model_path,
                "served_model_name": self.served_model_name,
                "tokenizer_path": self.tokenizer_path,
                "is_generation": True,
                "weight_version": "default",
                "model_type": "qwen3",
                "architectures": ["Qwen3ForCausalLM"],
            },
            200,
        )

    async def handle_health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def handle_open_session(self, request: web.Request) -> web.Response:
        body = await _read_json(request)
        self.opened_sessions.append(copy.deepcopy(body))
        if "capacity_of_str_len" not in body:
            return _json_response({"error": "Object missing required field `capacity_of_str_len`"}, 400)
        if body.get("streaming") and not self.enable_streaming_session:
            message = "Streaming sessions are disabled. Please relaunch with --enable-streaming-session."
            return _json_response({"error": {"message": message}}, 400)
        session_id = body.get("session_id") or uuid.uuid4().hex
        if session_id in self.open_sessions:
            message = "Failed to open the session. Check if a session with the same id is still open."
            return _json_response({"error": {"message": message}}, 400)
        self.open_sessions[session_id] = body
        return _json_response(session_id, 200)

    async def handle_close_session(self, request: web.Request) -> web.Response:
        body = await _read_json(request)
        self.closed_sessions.append(copy.deepcopy(body))
        if "session_id" not in body:
            return _json_response({"error": "Object missing required field `session_id`"}, 400)
        self.open_sessions.pop(body["session_id"], None)
        return web.Response(status=200)

    async def handle_flush_cache(self, request: web.Request) -> web.Response:
        self.flushes += 1
        if self._running:
            return web.Response(status=400, text="Flush cache failed.\n")
        self.reset_cache()
        return web.Response(
            status=200,
            text="Cache flushed.\nPlease check backend logs for more details. "
            "(When there are running or waiting requests, the operation will not be performed.)\n",
        )

    async def handle_models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.served_model_name,
            "object": "model",
            "created": int(self._startup_time),
            "owned_by": "sglang",
            "root": self.served_model_name,
            "parent": None,
            "max_model_len": self.context_length,
        }
        return _json_response({"object": "list", "data": [card]}, 200)

    async def handle_metrics(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.metrics_text().encode(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    def metrics_text(self) -> str:
        """Prometheus exposition of a few sglang:* series (label model_name)."""
        label = f'model_name="{self.served_model_name}"'
        m = self._metrics
        cached = m.get("sglang:cached_tokens_total", 0.0)
        lines = []
        for name in (
            "sglang:prompt_tokens_total",
            "sglang:generation_tokens_total",
            "sglang:num_requests_total",
            "sglang:num_aborted_requests_total",
        ):
            lines += [f"# TYPE {name} counter", f"{name}{{{label}}} {m.get(name, 0.0)}"]
        lines.append("# TYPE sglang:cached_tokens_total counter")
        for source, value in (("device", cached), ("host", 0.0), ("storage", 0.0), ("total", cached)):
            lines.append(f'sglang:cached_tokens_total{{{label},cache_source="{source}"}} {value}')
        lines += [
            "# TYPE sglang:evicted_tokens_total counter",
            f"sglang:evicted_tokens_total{{{label}}} {float(self.cache.evicted_tokens_total)}",
        ]
        gauges = {
            "sglang:max_total_num_tokens": self.max_total_num_tokens,
            "sglang:num_running_reqs": len(self._running),
            "sglang:num_queue_reqs": 0,
            "sglang:kv_evictable_tokens": self.cache.size,
            "sglang:kv_available_tokens": self.max_total_num_tokens - self.cache.size,
            "sglang:num_used_tokens": 0,
            "sglang:token_usage": 0.0,
        }
        for name, value in gauges.items():
            lines += [f"# TYPE {name} gauge", f"{name}{{{label}}} {float(value)}"]
        return "\n".join(lines) + "\n"

    def _count(self, name: str, value: float) -> None:
        self._metrics[name] = self._metrics.get(name, 0.0) + value


# --------------------------------------------------------------------------- validation helpers


# --------------------------------------------------------------------------- http helpers


async def _read_json(request: web.Request) -> Any:
    raw = await request.read()
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except ValueError:
        return {"__invalid_json__": raw.decode("utf-8", "replace")}


def _json_response(payload: Any, status: int) -> web.Response:
    return web.Response(status=status, body=json.dumps(payload).encode(), content_type="application/json")


async def _start_sse(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    return resp


def _sse(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def parse_sse(raw: Union[str, bytes]) -> list:
    """Split an SSE body into decoded ``data:`` payloads; ``[DONE]`` stays a string."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    events: list = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                data = line[len("data: ") :]
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


def _drop_connection(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort() if hasattr(transport, "abort") else transport.close()


async def _wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"SGLangDouble: timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def _sleep_or_abort(running: _Running, delay: float) -> None:
    """Sleep ``delay`` seconds but wake early on abort; always yields once."""
    if delay <= 0:
        await asyncio.sleep(0)
        return
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(running.abort.wait(), delay)


# --------------------------------------------------------------------------- thread helper


def run_in_thread(double: SGLangDouble, host: str = "127.0.0.1", port: int = 0, timeout: float = 10.0):
    """Serve ``double`` from a background thread with its own event loop; yields the URL.

    For synchronous tests (e.g. the official ``openai`` client). Use
    ``double.call_threadsafe(double.restart())`` to drive async methods from the test thread.
    """
    return serve_in_thread(double, host, port, timeout, name="sglang-double")
