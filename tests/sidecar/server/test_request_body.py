"""The shared body reader: media type, content coding, size, time, strict JSON and how many
values a body may hold, each refused before any work is done on the body."""

from __future__ import annotations

import asyncio
import gzip
import json
import zlib

import pytest
from hypothesis import given, settings, strategies as st

from sidecar.server import request_body as body_module
from sidecar.server.request_body import count_json_values

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def post(client, data: bytes, **headers):
    resp = await client.post("/v1/chat/completions", data=data, headers={"Content-Type": "application/json", **headers})
    return resp.status, await resp.json()


async def test_only_json_bodies_are_read(make_sidecar, sglang_double):
    """A web page can POST text/plain (or a form) cross-site without a CORS preflight; those
    media types are refused on every POST route, so no page can drive a local sidecar."""
    client = await make_sidecar()
    raw = json.dumps(CHAT).encode()
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        status, err = await post(client, raw, **{"Content-Type": kind})
        assert status == 415 and err["error"]["code"] == "unsupported_media_type", (kind, err)
    resp = await client.post("/close_session", data=b'{"session_id": "a"}', headers={"Content-Type": "text/plain"})
    assert resp.status == 415
    assert sglang_double.requests == []
    assert (await post(client, raw))[0] == 200
    assert (await post(client, raw, **{"Content-Type": "application/json; charset=utf-8"}))[0] == 200


async def test_content_codings(make_sidecar, sglang_double):
    client = await make_sidecar(max_body_bytes=64 * 1024)
    raw = json.dumps(CHAT).encode()
    assert (await post(client, gzip.compress(raw), **{"Content-Encoding": "gzip"}))[0] == 200
    assert (await post(client, zlib.compress(raw), **{"Content-Encoding": "deflate"}))[0] == 200
    # corrupt or truncated data is the client's error, not a 500
    status, err = await post(client, b"not gzip at all", **{"Content-Encoding": "gzip"})
    assert status == 400 and "gzip" in err["error"]["message"]
    status, err = await post(client, gzip.compress(raw)[:-12], **{"Content-Encoding": "gzip"})
    assert status == 400 and "truncated" in err["error"]["message"]
    status, err = await post(client, raw, **{"Content-Encoding": "br"})
    assert status == 415
    # a bomb: 20 MB of one byte, ~20 KB on the wire; decoding stops at the limit
    bomb = gzip.compress(b'{"messages": "' + b"a" * 20_000_000 + b'"}')
    assert len(bomb) < 64 * 1024
    status, err = await post(client, bomb, **{"Content-Encoding": "gzip"})
    assert status == 413 and "decoded" in err["error"]["message"]
    assert len(sglang_double.requests) == 2


async def test_strict_json(make_sidecar, sglang_double):
    client = await make_sidecar()
    dup = b'{"messages": [{"role": "user", "content": "hi"}], "messages": [{"role": "system", "content": "x"}]}'
    status, err = await post(client, dup)
    assert status == 400 and "duplicate" in err["error"]["message"]
    for literal in (b"Infinity", b"NaN", b"-Infinity"):
        status, err = await post(client, b'{"messages": [{"role": "user", "content": "hi"}], "repetition_penalty": ' + literal + b"}")
        assert status == 400, literal
    assert sglang_double.requests == []


async def test_countless_tiny_values_are_refused_before_parsing(make_sidecar, sglang_double, monkeypatch):
    client = await make_sidecar(max_json_values=1000, max_messages=100_000)
    parsed = []
    monkeypatch.setattr(body_module, "parse_strict_json", lambda raw: parsed.append(raw) or json.loads(raw))
    many = json.dumps({"messages": [{"role": "user", "content": "a"}] * 2000}).encode()
    status, err = await post(client, many)
    assert status == 400 and "1000 JSON values" in err["error"]["message"]
    assert parsed == []  # refused on the count alone
    # commas inside strings are text, not values: counted exactly, then parsed
    commas = json.dumps({**CHAT, "messages": [{"role": "user", "content": "a, [b], {c}, " * 2000}]}).encode()
    assert (await post(client, commas))[0] == 200
    assert parsed == [commas]


def _values(obj) -> int:
    if isinstance(obj, dict):
        return 1 + sum(_values(v) for v in obj.values())
    if isinstance(obj, list):
        return 1 + sum(_values(v) for v in obj)
    return 1


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet=st.sampled_from('ab",{[]}\\ :\n')),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(alphabet='a",\\{', max_size=3), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(obj=_json, chunk=st.integers(1, 9))
def test_value_count_is_exact_for_valid_json(obj, chunk):
    """The count that decides before parsing equals the real number of values (each object and
    array is one, and so is everything in it), escapes and chunk boundaries included."""
    original = body_module._SCAN_CHUNK
    body_module._SCAN_CHUNK = chunk
    try:
        raw = json.dumps(obj).encode()
        assert count_json_values(raw) >= _values(obj)
        # exact up to empty containers, which hold no comma-separated value
        empty = raw.count(b"[]") + raw.count(b"{}")
        assert count_json_values(raw) <= _values(obj) + empty
    finally:
        body_module._SCAN_CHUNK = original


async def _raw_request(client, head: bytes, body_parts: list[tuple[bytes, float]]) -> tuple[bytes, float, float]:
    """Send a request by hand, body pieces with pauses between them, while waiting for the answer:
    (the answer, seconds until its head came, seconds until the server closed the connection)."""
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    loop = asyncio.get_running_loop()
    start = loop.time()
    writer.write(head)

    async def trickle():
        for data, pause in body_parts:
            writer.write(data)
            await writer.drain()
            await asyncio.sleep(pause)

    sender = asyncio.ensure_future(trickle())
    try:
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 15)
        answered = loop.time() - start
        answer += await asyncio.wait_for(reader.read(), 15)  # returns once the server closed it
        closed = loop.time() - start
    finally:
        sender.cancel()
        writer.close()
    return answer, answered, closed


def _head(length: int) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {length}\r\n\r\n".encode()
    )


async def test_a_body_must_arrive_in_time(make_sidecar):
    """A trickled body is cut at the deadline with a 408, and its connection is closed."""
    client = await make_sidecar(body_timeout=1.0, body_min_rate=0)
    answer, answered, closed = await _raw_request(client, _head(1000), [(b'{"messages": ', 0.3)] * 40)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert 0.9 < answered < 2.5 and closed < 3.5


async def test_a_body_must_keep_the_least_rate(make_sidecar, monkeypatch):
    monkeypatch.setattr(body_module, "MIN_RATE_GRACE_S", 0.5)
    client = await make_sidecar(body_timeout=60.0, body_min_rate=1000)
    answer, answered, closed = await _raw_request(client, _head(100_000), [(b"x" * 10, 0.2)] * 60)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert answered < 2.5 and closed < 3.5


async def test_countless_values_in_a_small_gzip_are_refused_too(make_sidecar):
    client = await make_sidecar(max_json_values=1000, max_messages=100_000)
    many = json.dumps({"messages": [{"role": "user", "content": "a"}] * 5000}).encode()
    status, err = await post(client, gzip.compress(many), **{"Content-Encoding": "gzip"})
    assert status == 400 and "1000 JSON values" in err["error"]["message"]
