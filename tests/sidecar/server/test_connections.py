"""Bounded connections (issue 27.4): past the caps a connection is refused at once while the
established ones keep working; a connection that sends no headers, or idles, is closed soon."""

from __future__ import annotations

import asyncio
import time

import aiohttp

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> tuple[bytes, float]:
    t0 = time.monotonic()
    data = await asyncio.wait_for(reader.read(), seconds)
    return data, time.monotonic() - t0


async def test_past_the_cap_new_connections_are_refused_fast_and_agents_keep_working(make_sidecar, sglang_double):
    client = await make_sidecar(max_connections=6, header_timeout=30)
    port = client.server.port
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as agent:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        async with agent.post(url, json=CHAT) as resp:  # the agent's connection is established
            assert resp.status == 200
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(5)]  # the rest of the cap
        await asyncio.sleep(0.1)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        data, took = await _closed_within(reader, 2)
        assert data.startswith(b"HTTP/1.1 503") and b"too_many_connections" in data and took < 0.5
        writer.close()
        for _ in range(3):  # the agent's keep-alive connection keeps working
            async with agent.post(url, json=CHAT) as resp:
                assert resp.status == 200
        for _, w in idle:
            w.close()
        await asyncio.sleep(0.2)
        r2, w2 = await asyncio.open_connection("127.0.0.1", port)  # room again
        w2.write(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
        data, _ = await _closed_within(r2, 5)
        assert data.startswith(b"HTTP/1.1 200")
        w2.close()


async def test_connections_per_peer_are_capped(make_sidecar):
    client = await make_sidecar(max_connections=50, max_connections_per_peer=3, header_timeout=30)
    port = client.server.port
    held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
    await asyncio.sleep(0.05)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data, _ = await _closed_within(reader, 2)
    assert b"from this address" in data
    for _, w in [*held, (reader, writer)]:
        w.close()


async def test_a_connection_that_sends_no_headers_is_closed_at_the_deadline(make_sidecar):
    client = await make_sidecar(header_timeout=1.0)
    port = client.server.port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127")  # trickles, never finishes
    data, took = await _closed_within(reader, 5)
    assert data == b"" and took < 2.5
    writer.close()


async def test_idle_keepalive_is_short_when_the_cap_nears(make_sidecar):
    client = await make_sidecar(max_connections=8, keepalive_timeout=30, header_timeout=30)
    port = client.server.port
    conns = []
    for _ in range(6):  # three quarters of the cap, each idle after one request
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        await reader.readuntil(b"\r\n\r\n")
        conns.append((reader, writer))
    t0 = time.monotonic()
    reader = conns[0][0]
    while not reader.at_eof() and time.monotonic() - t0 < 6:
        await asyncio.wait_for(reader.read(65536), 6)
    assert reader.at_eof() and time.monotonic() - t0 < 4.5  # ~2 s, not 30
    for _, w in conns:
        w.close()
