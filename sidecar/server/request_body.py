"""The one reader of request bodies: every POST route (each front door, /close_session) reads its
body here, so every limit holds before any work is done on what a client sent.

In order: the media type must be JSON (415: a web page cannot send a "simple" cross-site request
with it, so no page can drive a local sidecar without a CORS preflight); the content coding must
be identity, gzip or deflate (415), decoded in bounded steps so a small upload cannot expand past
the size limit (413) nor hold the event loop, and corrupt data is a 400; the body must arrive
within ``body_timeout`` and at ``body_min_rate`` on average (408, and the connection is closed);
and its JSON must be strict (no duplicate keys, no NaN/Infinity) and hold at most
``max_json_values`` values, counted before it is parsed.

Reading is the event loop's (in bounded steps); parsing is not always: a body is handed on as
:class:`JsonText` (its pieces, the values of its first bytes counted on the way), whose weight
decides whether it is parsed inline or on the fair pool (``sidecar.turn.offload``), together with
the door's validation of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from dataclasses import dataclass
from typing import Any

import jiter
from aiohttp import web

from sidecar.errors import APIError, body_too_large, invalid_json, invalid_request
from sidecar.frontdoor.json_slices import parse_json
from sidecar.turn.offload import ITEM_WEIGHT, OFFLOAD_CHARS, Offload

MIN_RATE_GRACE_S = 5.0  # a body's average rate is held to body_min_rate from this second on
DECODE_STEP_BYTES = 256 * 1024  # decoded output per step; the loop runs other work between steps
LARGE_BODY_BYTES = 256 * 1024  # a body past this (or of unknown or encoded size) takes its turn at the bulk gate
_SCAN_CHUNK = 1 << 20
# Parsing and validating a byte of JSON text costs about a 16th of what a character costs to
# prepare (hash, render, tokenize), for which OFFLOAD_CHARS is sized; its values cost what
# ITEM_WEIGHT says. Measured (jiter + the chat door's strict validation): text 1.4 ns a byte,
# values about 1 us each (30 ns per unit of weight); at OFFLOAD_CHARS either is about 2 ms.
TEXT_PARSE_SHARE = 16
VALUES_COUNTED_BYTES = OFFLOAD_CHARS * TEXT_PARSE_SHARE  # a body past this is heavy by its size alone


@dataclass(frozen=True)
class BodyLimits:
    max_bytes: int  # on the wire and decoded
    timeout_s: float
    min_rate: float  # bytes/s, averaged, from MIN_RATE_GRACE_S on (0: off)
    max_json_values: int
    # one large body's step (a piece taken or decoded) at a time on the event loop: fifty
    # megabyte uploads then queue behind each other, not in front of every agent's request
    bulk: asyncio.Semaphore | None = None

    @classmethod
    def of(cls, server_settings, bulk: asyncio.Semaphore | None = None) -> BodyLimits:
        s = server_settings
        return cls(s.max_body_bytes, s.body_timeout, float(s.body_min_rate), s.max_json_values, bulk)


def unsupported_media_type(message: str) -> APIError:
    return APIError(415, message, code="unsupported_media_type")


def body_timeout(message: str) -> APIError:
    return APIError(408, message, code="request_timeout", headers={"Connection": "close"})


def check_json_media_type(request: web.Request) -> None:
    """415 unless the body is declared JSON (``application/json`` or a ``+json`` type)."""
    kind = request.content_type
    if kind != "application/json" and not kind.endswith("+json"):
        raise unsupported_media_type(f"Content-Type must be application/json, not {request.headers.get('Content-Type', 'none')!r}")


class _Decoder:
    """The body's content coding undone in steps of at most DECODE_STEP_BYTES output each."""

    def __init__(self, coding: str):
        coding = coding.strip().lower()
        if coding in ("", "identity"):
            self._z = None
        elif coding in ("gzip", "x-gzip"):
            self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif coding == "deflate":
            self._z = zlib.decompressobj(zlib.MAX_WBITS + 32)  # zlib or gzip wrapper, detected
        else:
            raise unsupported_media_type(f"Content-Encoding {coding!r} is not supported (identity, gzip, deflate)")
        self.coding = coding

    @property
    def identity(self) -> bool:
        return self._z is None

    def steps(self, data: bytes):
        """Decoded pieces of ``data``; each call of the generator does one bounded step."""
        z = self._z
        try:
            while data:
                out = z.decompress(data, DECODE_STEP_BYTES)
                data = z.unconsumed_tail
                if out:
                    yield out
                if z.eof:
                    if data or z.unused_data:
                        raise invalid_request(f"request body has data after its {self.coding} stream")
                    return
        except zlib.error as exc:
            raise invalid_request(f"request body is not valid {self.coding} data: {exc}") from None

    def finish(self) -> None:
        if self._z is not None and not self._z.eof:
            raise invalid_request(f"request body ends inside its {self.coding} stream (truncated)")


@dataclass
class JsonText:
    """A body read and decoded, not parsed yet: its pieces, its size, and 1 + the commas and
    opening brackets of its first VALUES_COUNTED_BYTES bytes (of all of a smaller body: its values
    at most)."""

    pieces: list[bytes]
    size: int
    values: int

    @property
    def weight(self) -> int:
        """What parsing and validating it costs, in the units of ``sidecar.turn.offload.request_weight``:
        its text at TEXT_PARSE_SHARE of a character's weight, its values at ITEM_WEIGHT (a body past
        VALUES_COUNTED_BYTES weighs OFFLOAD_CHARS by its size alone). Weighing its text as a
        prompt's sent a 100 KB history, 0.2 ms of parsing, to the pool (and behind its queue)."""
        return self.size // TEXT_PARSE_SHARE + ITEM_WEIGHT * self.values

    def parse(self, max_json_values: int) -> Any:
        """The strict JSON (400 otherwise; more than ``max_json_values`` values: 400 before it is
        built). Size-proportional: run it where :attr:`weight` says. The pieces are let go."""
        raw = self.pieces[0] if len(self.pieces) == 1 else b"".join(self.pieces)
        self.pieces = []
        # values are at most (bytes + 1) / 2, and at most the commas + opening brackets + 1: a body
        # under the limit by either count (nearly all) is parsed at once, others are counted exactly
        # first, so that countless tiny values are refused unbuilt
        if len(raw) > 2 * max_json_values and _rough_values(raw) > max_json_values:
            if count_json_values(raw) > max_json_values:
                raise invalid_request(f"request body holds more than {max_json_values} JSON values")
        return parse_strict_json(raw)


def _rough_values(raw: bytes) -> int:
    """1 + the commas and opening brackets of ``raw``, a slice at a time (each count holds the GIL)."""
    return 1 + sum(_openings(raw, at, at + _SCAN_CHUNK) for at in range(0, len(raw), _SCAN_CHUNK))


async def read_body(request: web.Request, limits: BodyLimits) -> bytes:
    """The decoded body within ``limits`` (413 / 408 / 415 / 400 as the module says)."""
    pieces = (await _read(request, limits)).pieces
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


async def _read(request: web.Request, limits: BodyLimits) -> JsonText:
    """The decoded body, not parsed (its values counted only as far as its weight needs them)."""
    if request.content_length is not None and request.content_length > limits.max_bytes:
        raise body_too_large(f"{request.content_length} bytes, the limit is {limits.max_bytes}")
    decoder = _Decoder(request.headers.get("Content-Encoding", ""))
    loop = asyncio.get_running_loop()
    start = loop.time()
    final = start + limits.timeout_s
    received = decoded = 0
    pieces: list[bytes] = []
    # its first VALUES_COUNTED_BYTES bytes' commas + opening brackets: with the size they weigh a
    # small body (a larger one weighs enough by its size; its values are counted where it is parsed)
    rough = 1
    gate = _bulk_gate(request, decoder, limits)
    try:
        async with asyncio.timeout_at(_loop_deadline(start, final, 0, limits)) as window:
            while True:
                chunk = await request.content.readany()
                if not chunk:
                    break
                received += len(chunk)
                if received > limits.max_bytes:
                    raise body_too_large(f"more than {limits.max_bytes} bytes")
                async with gate:
                    if decoder.identity:
                        pieces.append(chunk)
                        if decoded < VALUES_COUNTED_BYTES:
                            rough += _openings(chunk, 0, VALUES_COUNTED_BYTES - decoded)
                        decoded = received
                    else:
                        for out in decoder.steps(chunk):
                            if decoded < VALUES_COUNTED_BYTES:
                                rough += _openings(out, 0, VALUES_COUNTED_BYTES - decoded)
                            decoded += len(out)
                            if decoded > limits.max_bytes:
                                raise body_too_large(f"more than {limits.max_bytes} bytes once decoded ({decoder.coding})")
                            pieces.append(out)
                            await asyncio.sleep(0)
                window.reschedule(_loop_deadline(start, final, received, limits))
    except TimeoutError:
        elapsed = loop.time() - start
        raise body_timeout(
            f"request body did not arrive in time ({received} bytes in {elapsed:.1f} s; limits: "
            f"{limits.timeout_s:g} s, {limits.min_rate:g} bytes/s)"
        ) from None
    decoder.finish()
    return JsonText(pieces, decoded, rough)


def _bulk_gate(request: web.Request, decoder: _Decoder, limits: BodyLimits):
    large = request.content_length is None or request.content_length > LARGE_BODY_BYTES or not decoder.identity
    return limits.bulk if large and limits.bulk is not None else contextlib.nullcontext()


def _openings(data: bytes, start: int, end: int) -> int:
    return data.count(b",", start, end) + data.count(b"{", start, end) + data.count(b"[", start, end)


def _loop_deadline(start: float, final: float, received: int, limits: BodyLimits) -> float:
    """When the body is late (loop time): at ``final``, or once its average rate falls below the
    least rate (the bytes received so far are owed by ``received / min_rate`` s, after the grace)."""
    if limits.min_rate <= 0:
        return final
    return min(final, start + max(MIN_RATE_GRACE_S, received / limits.min_rate))


async def read_json_text(request: web.Request, limits: BodyLimits) -> JsonText:
    """The body, declared JSON and within ``limits``, read but not parsed (:meth:`JsonText.parse`)."""
    check_json_media_type(request)
    return await _read(request, limits)


async def read_json_body(request: web.Request, limits: BodyLimits, offload: Offload | None = None, key: str = "") -> Any:
    """The body as strict JSON (any JSON value): declared JSON, within ``limits``, at most
    ``max_json_values`` values, no duplicate keys, no NaN/Infinity; else the error the module says.
    Parsed where ``offload`` puts work of the body's weight (on its pool in ``key``'s turn when
    large); inline without one."""
    text = await read_json_text(request, limits)
    if offload is None:
        return text.parse(limits.max_json_values)
    return await offload.prepare(text.parse, limits.max_json_values, key=key, weight=text.weight)


def parse_strict_json(raw: bytes) -> Any:
    """The strict JSON of ``raw`` (400 otherwise), its long strings decoded a slice at a time so
    that no single call holds the GIL for long (``sidecar.frontdoor.json_slices``)."""
    try:
        return parse_json(raw, _strict)
    except ValueError as exc:
        raise invalid_json(raw, str(exc)) from None


def _strict(raw: bytes) -> Any:
    return jiter.from_json(raw, catch_duplicate_keys=True, allow_inf_nan=False)


def count_json_values(raw: bytes) -> int:
    """An upper bound on the values of a JSON text, tight for valid JSON: 1 + the commas and
    opening brackets outside strings (a string's quotes are found with their escapes)."""
    import numpy as np

    total = 0
    inside = 0  # 1 while the scan is within a string
    run = 0  # backslashes just before the chunk
    for offset in range(0, len(raw), _SCAN_CHUNK):
        a = np.frombuffer(raw, np.uint8, count=min(_SCAN_CHUNK, len(raw) - offset), offset=offset)
        idx = np.arange(len(a), dtype=np.int64)
        backslash = a == 92
        last_other = np.maximum.accumulate(np.where(backslash, -1, idx))
        runs = idx - last_other  # backslashes ending at each position
        runs[last_other < 0] += run
        before = np.empty_like(runs)
        before[0], before[1:] = run, runs[:-1]
        quotes = (a == 34) & ((before & 1) == 0)  # not escaped
        in_string = (np.cumsum(quotes, dtype=np.int64) + inside) & 1
        opening = (a == 44) | (a == 91) | (a == 123)
        total += int(np.count_nonzero(opening & (in_string == 0)))
        inside, run = int(in_string[-1]), int(runs[-1])
    return total + 1
