"""The engine client's stream reading and connect retries, against a bare aiohttp server."""

import asyncio
import time

import aiohttp
from aiohttp import web

import json

import pytest

from sidecar.engine.client import EngineClient, _LineSplitter, _read_lines
from sidecar.errors import APIError


def test_line_splitter_rejoins_lines_split_across_chunks():
    s = _LineSplitter()
    assert s.feed(b'data: {"a"') == []
    assert s.feed(b": 1}\n\ndata: [DO") == [b'data: {"a": 1}', b""]
    assert s.feed(b"NE]\n\n") == [b"data: [DONE]", b""]
    assert s.flush() == []
    assert s.feed(b"no newline at the end") == []
    assert s.flush() == [b"no newline at the end"]


def _line(chunk) -> bytes:
    return b"data: " + (chunk if isinstance(chunk, bytes) else json.dumps(chunk).encode())


def _chunk(n, finish=None):
    return {"output_ids": list(range(n)), "meta_info": {"finish_reason": finish}}


def test_a_read_keeps_the_newest_chunk_and_whatever_finishes_or_fails():
    """Of several chunks one read brought, a plain cumulative chunk another chunk follows is left
    out (the newer one holds all it said); the last, a finishing one and an error are never."""
    lines = [_line(_chunk(1)), b"", _line(_chunk(2)), b"", _line(_chunk(3)), b""]
    assert _read_lines(lines) == ([_chunk(3)], False, None)
    assert _read_lines(lines, every=True) == ([_chunk(1), _chunk(2), _chunk(3)], False, None)
    compact = [_line(b'{"output_ids":[0],"meta_info":{"finish_reason":null}}'), _line(_chunk(2))]
    assert _read_lines(compact)[0] == [_chunk(2)]  # SGLang's own (orjson's) spelling
    finished = [_line(_chunk(1)), _line(_chunk(2, {"type": "stop"})), _line(b"[DONE]"), _line(_chunk(9))]
    assert _read_lines(finished) == ([_chunk(2, {"type": "stop"})], True, None)  # nothing after [DONE]
    batch, done, error = _read_lines([_line(_chunk(1)), _line({"error": {"message": "boom"}}), _line(_chunk(2))])
    assert batch == [_chunk(1)] and not done and isinstance(error, APIError) and "boom" in error.message


async def test_a_read_of_several_chunks_is_one_batch_and_an_error_comes_after_them():
    async def handler(request):
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b"".join(_line(c) + b"\n\n" for c in (_chunk(1), _chunk(2), _chunk(3))))
        await asyncio.sleep(0.05)
        await resp.write(_line(_chunk(4)) + b"\n\n" + _line({"error": {"message": "engine fell over"}}) + b"\n\n")
        await resp.write_eof()
        return resp

    runner, url = await _serve(handler)
    batches = []
    try:
        async with aiohttp.ClientSession() as http:
            with pytest.raises(APIError, match="engine fell over"):
                async for batch in EngineClient(url, http).generate_batches({"rid": "r1", "input_ids": [1]}):
                    batches.append(batch)
    finally:
        await runner.cleanup()
    assert batches == [[_chunk(3)], [_chunk(4)]]


async def _serve(handler):
    app = web.Application()
    app.router.add_post("/generate", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


async def test_stream_events_survive_any_chunking_and_a_missing_final_newline():
    events = [{"output_ids": list(range(i + 1)), "meta_info": {"finish_reason": None}} for i in range(5)]

    async def handler(request):
        resp = web.StreamResponse()
        await resp.prepare(request)
        import json

        raw = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b'data: {"last": true}'
        for i in range(0, len(raw), 7):  # odd-sized pieces, flushed one by one
            await resp.write(raw[i : i + 7])
            await asyncio.sleep(0)
        await resp.write_eof()
        return resp

    runner, url = await _serve(handler)
    try:
        async with aiohttp.ClientSession() as http:
            client = EngineClient(url, http)
            got = [e async for e in client.generate_stream({"rid": "r1", "input_ids": [1]})]
    finally:
        await runner.cleanup()
    assert got == events + [{"last": True}]


async def test_connect_retries_back_off_as_before():
    """A refused connection is tried 1 + connect_retries times, waiting 0.1, 0.2, 0.4 s in between."""
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with aiohttp.ClientSession() as http:
        client = EngineClient(f"http://127.0.0.1:{port}", http, connect_retries=3)
        attempts: list[float] = []
        real_request = http.request

        def counting_request(*args, **kwargs):
            attempts.append(time.monotonic())
            return real_request(*args, **kwargs)

        http.request = counting_request
        try:
            async for _ in client.generate_stream({"rid": "r1", "input_ids": [1]}):
                pass
        except Exception as exc:  # noqa: BLE001
            assert getattr(exc, "code", None) == "engine_unavailable"
        else:
            raise AssertionError("expected engine_unavailable")
    assert len(attempts) == 4
    gaps = [b - a for a, b in zip(attempts, attempts[1:])]
    assert [round(g, 1) >= w for g, w in zip(gaps, (0.1, 0.2, 0.4))] == [True, True, True]


async def test_a_web_server_that_is_not_sglang_gets_one_clear_line_not_its_page(aiohttp_server):
    """Something else on the engine port (a web server's HTML 404) is named as such, on one line."""
    page = "<!DOCTYPE HTML>\n<html><body><h1>Error response</h1>\n<p>File not found.</p></body></html>\n"
    app = web.Application()

    async def not_found(request):
        return web.Response(status=404, text=page, content_type="text/html")

    app.router.add_get("/server_info", not_found)
    server = await aiohttp_server(app)
    async with aiohttp.ClientSession() as http:
        client = EngineClient(str(server.make_url("")).rstrip("/"), http)
        try:
            await client.server_info()
        except Exception as exc:  # noqa: BLE001
            message = str(getattr(exc, "message", exc))
        else:
            raise AssertionError("a 404 page was taken for SGLang's /server_info")
    assert "not SGLang" in message and "\n" not in message and "<html" not in message


async def test_streams_read_to_done_keep_their_connection_for_the_next_one():
    """SGLang ends each stream with [DONE] and then the end of its chunked body, which may come a
    moment later: the connection is kept for the next request all the same (a stream that did not
    reach [DONE] still drops its connection)."""
    peers = []

    async def handler(request):
        peers.append(request.transport.get_extra_info("peername"))
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b'data: {"output_ids": [1], "meta_info": {"finish_reason": {"type": "length"}}}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        await asyncio.sleep(0.05)  # the body's end comes after the client read [DONE]
        await resp.write_eof()
        return resp

    runner, url = await _serve(handler)
    try:
        async with aiohttp.ClientSession() as http:
            client = EngineClient(url, http)
            for _ in range(3):
                assert [e["output_ids"] async for e in client.generate_stream({"rid": "r", "input_ids": [1]})] == [[1]]
                await asyncio.sleep(0.1)  # the next turn comes after the body's end
            assert len(set(peers)) == 1  # one connection for the three streams
            stream = client.generate_stream({"rid": "r", "input_ids": [1]})
            await stream.__anext__()
            await stream.aclose()  # given up before [DONE]
            await asyncio.sleep(0.2)
            assert [e["output_ids"] async for e in client.generate_stream({"rid": "r", "input_ids": [1]})] == [[1]]
    finally:
        await runner.cleanup()
    assert len(set(peers)) == 2 and peers[-2] != peers[-1]  # the abandoned stream's connection was not reused
