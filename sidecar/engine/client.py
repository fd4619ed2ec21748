"""HTTP client for SGLang's native API: /generate (streamed), /abort_request, /close_session,
/set_internal_state, info.

Mechanism only: it sends what it is given and maps failures to OpenAI-style errors; when to abort
a request is the relay's decision (``sidecar.generation.relay.Generation.close``). Connection
failures are retried (tenacity) only while nothing has been received, so a retry can never
duplicate output the agent already got. That includes a pooled connection the server closed just
as the request went out (SGLang's uvicorn drops connections idle for 5 s, exactly an agent's tool
gap): aiohttp reports it as ServerDisconnectedError before any response line.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, AsyncIterator

import aiohttp
from pydantic_core import from_json, to_json
from yarl import URL
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from sidecar.errors import APIError, engine_error, engine_timeout, engine_unavailable, invalid_request
from sidecar.id_text import IdText

log = logging.getLogger("sidecar.engine")

_FIRST_BACKOFF_S = 0.1  # wait before the first connect retry; it doubles per retry

# Failures of _open that happen before any response byte: safe to send again.
_NOTHING_RECEIVED = (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError)


class EngineClient:
    def __init__(
        self,
        base_url: str,
        session: aiohttp.ClientSession,
        *,
        request_timeout: float = 600.0,
        connect_timeout: float = 5.0,
        connect_retries: int = 3,
        api_key: str | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self._urls: dict[str, URL] = {}
        self.http = session
        self.request_timeout = request_timeout
        self.connect_timeout = connect_timeout
        self.connect_retries = connect_retries
        # SGLang's --api-key; sent on every call (SGLang itself leaves /health and /metrics open).
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._json_headers = {**self.headers, "Content-Type": "application/json"}
        self._draining: set[asyncio.Future] = set()  # responses read to their end after [DONE]

    def _url(self, path: str) -> URL:
        """Parsed once per path: yarl parsing a URL string on every request is measurable per turn."""
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = URL(f"{self.base_url}{path}")
        return url

    async def _open(self, method: str, path: str, **kwargs) -> aiohttp.ClientResponse:
        """Send a request, retrying connection failures; the response is open and status-checked."""
        kwargs.setdefault("headers", self.headers)
        try:
            try:  # the common case pays nothing for the retry machinery
                resp = await self.http.request(method, self._url(path), **kwargs)
            except _NOTHING_RECEIVED:
                if self.connect_retries <= 0:
                    raise
                resp = await self._retry_connect(method, path, **kwargs)
        except aiohttp.ClientConnectorError as exc:
            raise engine_unavailable(f"SGLang is not reachable at {self.base_url}", exc) from None
        except aiohttp.ServerDisconnectedError as exc:
            raise engine_unavailable("SGLang closed the connection without answering", exc) from None
        except asyncio.TimeoutError:
            raise engine_timeout(f"SGLang did not answer {path} in time") from None
        except aiohttp.ClientError as exc:
            raise engine_unavailable("SGLang connection failed", exc) from None
        if resp.status >= 400:
            body = await resp.text()
            resp.release()
            raise _map_status(resp.status, body)
        return resp

    async def _retry_connect(self, method: str, path: str, **kwargs) -> aiohttp.ClientResponse:
        """The ``connect_retries`` retries after a first attempt that received nothing (no connect, or
        a connection the server hung up on): backoff 0.1 s, 0.2 s, 0.4 s, ... (max 2 s)."""
        await asyncio.sleep(_FIRST_BACKOFF_S)
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(_NOTHING_RECEIVED),
            stop=stop_after_attempt(self.connect_retries),
            wait=wait_exponential(multiplier=2 * _FIRST_BACKOFF_S, max=2.0),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                resp = await self.http.request(method, self._url(path), **kwargs)
        return resp

    async def get_json(self, path: str, timeout: float = 10.0) -> Any:
        resp = await self._open("GET", path, timeout=aiohttp.ClientTimeout(total=timeout, sock_connect=self.connect_timeout))
        async with resp:
            return await resp.json(content_type=None)

    async def server_info(self) -> dict[str, Any]:
        return await self.get_json("/server_info")

    async def healthy(self, timeout: float = 5.0) -> bool:
        try:
            resp = await self.http.get(self._url("/health"), headers=self.headers, timeout=aiohttp.ClientTimeout(total=timeout))
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return False
        async with resp:
            return resp.status == 200

    async def generate_stream(
        self,
        payload: dict[str, Any],
        headers: dict[str, str] | None = None,
        on_response: Callable[[Mapping[str, str]], Awaitable[None]] | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """Every chunk of :meth:`generate_batches` (none left unparsed), a chunk at a time."""
        async for batch in self.generate_batches(payload, headers, on_response, every=True):
            for chunk in batch:
                yield chunk

    async def generate_batches(
        self,
        payload: dict[str, Any],
        headers: dict[str, str] | None = None,
        on_response: Callable[[Mapping[str, str]], Awaitable[None]] | None = None,
        every: bool = False,
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """Yield SGLang's stream chunks (cumulative output_ids + meta_info) as they arrive, as
        lists of the chunks that one network read brought (never empty): a reader that is behind
        takes several at once, and since each chunk is cumulative it may act on the newest one
        only. Unless ``every``, the chunks the newest one supersedes are left out unparsed
        (``_read_lines``).
        ``headers`` are added (smg's target-worker header, when the request goes through smg).
        ``on_response`` sees the response headers before any chunk is read (smg names the worker
        that took the request there: a coroutine function, so it can ask smg more); what it raises ends the stream.

        Past ``request_timeout`` it raises engine_timeout; SGLang may still be generating then.
        An error event raises its APIError after the chunks before it were yielded.
        """
        body = _json_body({**payload, "stream": True})
        timeout = aiohttp.ClientTimeout(total=self.request_timeout, sock_connect=self.connect_timeout)
        resp = await self._open(
            "POST", "/generate", data=body, timeout=timeout,
            headers={**self._json_headers, **headers} if headers else self._json_headers,
        )
        done = False
        try:
            if on_response is not None:
                await on_response(resp.headers)
            splitter = _LineSplitter()
            lines = splitter.feed
            async for data in resp.content.iter_any():
                batch, at_done, error = _read_lines(lines(data), every)
                if batch:
                    yield batch
                if error is not None:
                    raise error
                if at_done:  # done only once the reader came back for more: it took every chunk
                    done = True
                    return
            batch, at_done, error = _read_lines(splitter.flush(), every)
            if batch:
                yield batch
            if error is not None:
                raise error
            done = at_done
        except asyncio.TimeoutError:
            raise engine_timeout(f"SGLang did not finish within {self.request_timeout:g} s") from None
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            raise engine_unavailable("SGLang dropped the stream", exc) from None
        finally:
            if done and not resp.content.is_eof():
                self._release_at_eof(resp)
            else:
                resp.release()

    def _release_at_eof(self, resp: aiohttp.ClientResponse) -> None:
        """After [DONE] only the end of the chunked body is left; released before it was read, the
        connection would be closed and the next turn would open a new one (a TCP handshake and
        aiohttp's connection setup on both sides). Read in the background, a few seconds at most."""
        task = asyncio.ensure_future(_read_to_eof(resp))
        self._draining.add(task)
        task.add_done_callback(self._draining.discard)

    async def abort(self, rid: str) -> None:
        """Best effort: the agent is gone, free the engine's work."""
        await self._post_best_effort("/abort_request", {"rid": rid}, f"abort of {rid}")

    async def close_session(self, session_id: str) -> None:
        """Best effort: ends the session's lease in the plugin (and any SGLang session state)."""
        await self._post_best_effort("/close_session", {"session_id": session_id}, f"close_session {session_id}")

    async def set_internal_state(self, body: dict[str, Any]) -> None:
        """Best effort: SGLang's ``/set_internal_state`` (the plugin's after-turn channel). A lease
        update that does not arrive leaves the request's own lease in place."""
        await self._post_best_effort("/set_internal_state", body, "set_internal_state")

    async def _post_best_effort(self, path: str, body: dict[str, Any], what: str) -> None:
        try:
            resp = await self.http.post(self._url(path), data=to_json(body), headers=self._json_headers,
                                        timeout=aiohttp.ClientTimeout(total=5))
            if resp.status >= 400:
                log.warning("%s: SGLang answered %d", what, resp.status)
            resp.release()
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            log.warning("%s failed: %s", what, exc)


_DRAIN_S = 5.0  # how long the end of a body after [DONE] may take before the connection is dropped


async def _read_to_eof(resp: aiohttp.ClientResponse) -> None:
    try:
        async with asyncio.timeout(_DRAIN_S):
            await resp.content.read()
    except (asyncio.TimeoutError, aiohttp.ClientError, OSError):
        pass
    finally:
        resp.release()  # reused if the body was read to its end, else closed


def _json_body(payload: dict[str, Any]) -> bytes:
    """The payload as JSON (pydantic-core's: compact UTF-8); ``input_ids`` held as IdText is
    spliced in as it is (see id_text)."""
    ids = payload.get("input_ids")
    if not isinstance(ids, IdText):
        return to_json(payload)
    rest = to_json({k: v for k, v in payload.items() if k != "input_ids"})
    return b'{"input_ids":' + ids.json() + (b"," + rest[1:] if rest != b"{}" else b"}")


_DONE = object()


def sse_event(line: bytes) -> Any:
    """One SSE line of SGLang's /generate stream: the decoded event, _DONE, or None (not a data
    line); an error event raises its APIError."""
    if not line.startswith(b"data:"):
        return None
    data = line[5:].strip()
    if data == b"[DONE]":
        return _DONE
    event = from_json(data)  # pydantic-core's parser: a third of json.loads' time per chunk
    if isinstance(event, dict) and "error" in event:
        raise _map_stream_error(event["error"])
    return event


def _read_lines(lines: list[bytes], every: bool = False) -> tuple[list[dict[str, Any]], bool, APIError | None]:
    """The chunks of one read's SSE lines; whether SGLang's [DONE] was among them; the error of an
    error event among them. Nothing after [DONE] or an error event is read.

    Unless ``every``, a chunk that another chunk of the same read follows is left unparsed when
    it plainly neither finished the reply nor reports an error: SGLang's chunks are cumulative, so
    the later one holds everything it did (the JSON of a chunk that repeats all ids so far is most
    of what reading one costs)."""
    data = [line for line in lines if line.startswith(b"data:")]
    batch: list[dict[str, Any]] = []
    for i, line in enumerate(data):
        if not every and i + 1 < len(data) and _superseded(line, data[i + 1]):
            continue
        try:
            event = sse_event(line)
        except APIError as err:
            return batch, False, err
        if event is _DONE:
            return batch, True, None
        if event is not None:
            batch.append(event)
    return batch, False, None


_UNFINISHED = (b'"finish_reason":null', b'"finish_reason": null')  # compact (orjson, SGLang) or json.dumps


def _superseded(line: bytes, following: bytes) -> bool:
    """Whether the chunk ``line`` says nothing that the chunk ``following`` it does not: it is
    not finished and has no error, and what follows is a chunk (not [DONE], nor an error that
    would end the stream before it said more). Anything else is parsed."""
    return (
        following[5:].strip() != b"[DONE]"
        and b'"error"' not in following
        and b'"error"' not in line
        and (_UNFINISHED[0] in line or _UNFINISHED[1] in line)
    )


class _LineSplitter:
    """Lines out of network chunks (a line may span chunks). Reading a chunk at a time costs one
    wake-up per chunk SGLang sends instead of one per line."""

    def __init__(self) -> None:
        self._partial: list[bytes] = []

    def feed(self, data: bytes) -> list[bytes]:
        if b"\n" not in data:
            self._partial.append(data)
            return []
        if self._partial:
            self._partial.append(data)
            data, self._partial = b"".join(self._partial), []
        lines = data.split(b"\n")
        tail = lines.pop()
        if tail:
            self._partial.append(tail)
        return lines

    def flush(self) -> list[bytes]:
        """The last line, if the stream ended without its newline."""
        rest, self._partial = b"".join(self._partial), []
        return [rest] if rest else []


def _error_message(body: str) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        text = body.strip()
        if text[:1] == "<":  # an HTML page: whatever answers there is not SGLang (its errors are JSON)
            return "an HTML page, not SGLang's JSON: is SGLang on this URL and port?"
        return " ".join(text[:500].split()) or "no detail"
    err = data.get("error", data) if isinstance(data, dict) else data
    if isinstance(err, dict):
        return str(err.get("message") or err.get("detail") or err)
    return str(err)


def _map_status(status: int, body: str) -> APIError:
    message = _error_message(body)
    if status in (400, 422):
        return invalid_request(f"SGLang rejected the request: {message}")
    if status == 429 or status == 503:
        return APIError(503, f"SGLang is overloaded or starting: {message}", type="engine_unavailable", code="engine_overloaded")
    if status == 504:
        return engine_timeout(f"SGLang timed out: {message}")
    if status in (401, 403):
        return engine_error(f"SGLang refused the sidecar's credentials (HTTP {status}): check --sglang-api-key")
    return engine_error(f"SGLang failed with HTTP {status}: {message}")


def _map_stream_error(err: Any) -> APIError:
    if isinstance(err, dict):
        message = str(err.get("message", err))
        code = err.get("code")
        if code in (400, "400") or err.get("type") == "invalid_request_error":
            return invalid_request(f"SGLang rejected the request: {message}")
        return engine_error(f"SGLang failed: {message}")
    return engine_error(f"SGLang failed: {err}")
