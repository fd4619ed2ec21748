"""Bounded connections: no client, keyed or not, can hold the sidecar's sockets.

Idle or header-trickling connections need no key. Without bounds, a thousand of them exhaust the
process's open files and every agent's next request fails. So:

- at most ``max_connections`` open, and ``max_connections_per_peer`` from one address; a
  connection past either is answered at once (503, ``Connection: close``) and closed, while the
  connections already open keep working;
- a new connection must deliver its first request's headers within ``header_timeout``;
- an idle keep-alive connection is closed after ``keepalive_timeout``, and once the open
  connections pass three quarters of the cap, after ``PRESSURE_IDLE_S`` (a new connection gets
  that long for its headers too), so room comes back before the cap is reached.

aiohttp has no hook for accepting connections; the guard wraps the application's protocol
factory (``Application._make_handler``: its ``web.Server``'s connection_made/lost), and a
middleware notes when a connection starts and ends a request.
"""

from __future__ import annotations

import asyncio
import json
import resource
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from sidecar.errors import retry_after

PRESSURE_FRACTION = 0.75  # from this share of the cap on, idle connections get PRESSURE_IDLE_S
PRESSURE_IDLE_S = 2.0
SWEEP_EVERY_S = 0.5
FILES_RESERVED = 128  # open files kept for SGLang connections, the tokenizer, logs


def default_max_connections() -> int:
    """Three quarters of the open-files limit, less what the sidecar needs for itself."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        soft = 65536
    return max(32, (soft - FILES_RESERVED) * 3 // 4)


@dataclass
class _Conn:
    peer: str
    transport: Any
    opened: float
    idle_since: float | None = None  # None until its first request's headers came; then while idle
    requests: int = 0
    in_flight: int = 0


def _refusal(message: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": "server_busy", "code": "too_many_connections"}}).encode()
    retry = "".join(f"{k}: {v}\r\n" for k, v in retry_after(1).items()).encode()
    return (
        b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n" + retry
        + b"Connection: close\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )


class ConnectionGuard:
    """Counts connections as aiohttp opens and loses them, refuses past the caps, sweeps the idle."""

    def __init__(self, max_connections: int, per_peer: int, header_timeout: float, keepalive_timeout: float):
        self.max_connections = max_connections
        self.per_peer = per_peer
        self.header_timeout = header_timeout
        self.keepalive_timeout = keepalive_timeout
        self.conns: dict[Any, _Conn] = {}  # aiohttp's RequestHandler -> its record (until connection_lost)
        self.by_peer: dict[str, int] = {}
        self.refused = 0
        self._sweeper: asyncio.TimerHandle | None = None

    @property
    def open(self) -> int:
        return len(self.conns)

    def install(self, app: web.Application) -> None:
        """Guard every server aiohttp makes for ``app`` (and note requests through a middleware)."""
        make_handler = app._make_handler

        def guarded_make_handler(*args, **kwargs):
            server = make_handler(*args, **kwargs)
            self.attach(server)
            return server

        app._make_handler = guarded_make_handler  # type: ignore[method-assign]
        app.middlewares.insert(0, self.middleware)

    def attach(self, server: web.Server) -> None:
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler, transport):
            made(handler, transport)
            self._opened(handler, transport)

        def connection_lost(handler, exc=None):
            lost(handler, exc)
            self._lost(handler)

        server.connection_made, server.connection_lost = connection_made, connection_lost

    def _opened(self, handler, transport) -> None:
        peername = transport.get_extra_info("peername")
        peer = str(peername[0]) if isinstance(peername, tuple) and peername else str(peername or "")
        if self.open >= self.max_connections:
            return self._refuse(transport, f"the sidecar has {self.open} connections open, its limit")
        if self.by_peer.get(peer, 0) >= self.per_peer:
            return self._refuse(transport, f"{self.by_peer[peer]} connections from this address are open, the limit")
        self.conns[handler] = _Conn(peer, transport, time.monotonic())
        self.by_peer[peer] = self.by_peer.get(peer, 0) + 1
        self._schedule_sweep()

    def _refuse(self, transport, message: str) -> None:
        self.refused += 1
        try:
            transport.write(_refusal(message + "; retry later"))
        finally:
            transport.close()

    def _lost(self, handler) -> None:
        conn = self.conns.pop(handler, None)
        if conn is None:
            return
        n = self.by_peer.get(conn.peer, 0) - 1
        if n > 0:
            self.by_peer[conn.peer] = n
        else:
            self.by_peer.pop(conn.peer, None)

    @web.middleware
    async def middleware(self, request: web.Request, handler):
        conn = self.conns.get(request.protocol)
        if conn is None:
            return await handler(request)
        conn.requests += 1
        conn.in_flight += 1
        conn.idle_since = None
        try:
            return await handler(request)
        finally:
            conn.in_flight -= 1
            if not conn.in_flight:
                conn.idle_since = time.monotonic()

    def _schedule_sweep(self) -> None:
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().call_later(SWEEP_EVERY_S, self._sweep)

    def _sweep(self) -> None:
        """Close connections past their header deadline or idle too long (shorter under pressure)."""
        self._sweeper = None
        now = time.monotonic()
        pressure = self.open >= PRESSURE_FRACTION * self.max_connections
        header_s = min(self.header_timeout, PRESSURE_IDLE_S) if pressure else self.header_timeout
        idle_s = min(self.keepalive_timeout, PRESSURE_IDLE_S) if pressure else self.keepalive_timeout
        for conn in list(self.conns.values()):
            if conn.in_flight:
                continue
            if conn.requests == 0:
                late = now - conn.opened > header_s
            else:
                late = conn.idle_since is not None and now - conn.idle_since > idle_s
            if late:
                conn.transport.close()
        if self.conns:
            self._schedule_sweep()


def connection_guard(settings) -> ConnectionGuard:
    """The guard for ServerSettings' caps (``max_connections`` 0: from the open-files limit)."""
    cap = settings.max_connections or default_max_connections()
    per_peer = settings.max_connections_per_peer or max(1, cap * 3 // 4)
    return ConnectionGuard(cap, min(per_peer, cap), settings.header_timeout, settings.keepalive_timeout)
