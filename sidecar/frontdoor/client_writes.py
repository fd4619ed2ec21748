"""Writing a streamed reply to a client that may have stopped reading.

aiohttp's ``write`` waits for the socket to drain; a client that keeps its connection open but
reads nothing would hold the turn (and its SGLang request, generating for nobody) forever. Every
front door writes its stream through :func:`write_within`: past the write timeout the connection
is closed and :class:`ClientStalled` raised inside the turn, so the relay aborts the engine
request and nothing is recorded.
"""

from __future__ import annotations

import asyncio

from aiohttp import web


class ClientStalled(ConnectionError):
    """The client did not take a write within the stream write timeout; its connection is closed."""


async def write_within(request: web.Request, response: web.StreamResponse, data: bytes, timeout_s: float, last: bool = False) -> None:
    """``response.write(data)`` (``write_eof`` with ``last``) or, after ``timeout_s`` without the
    client reading, ClientStalled with the connection closed.

    A write waits for the client only while its transport is paused: from when its buffer went
    past the high-water mark until it drained to the low-water mark. A write to a buffer at or
    below the low-water mark (so not paused) that stays within the high-water mark cannot wait,
    so it goes out without arming the timer: a frame per token, most of a stream."""
    transport = request.transport
    if transport is not None and _cannot_wait(transport, len(data)):
        if last:
            await response.write_eof(data)
        else:
            await response.write(data)
        return
    try:
        async with asyncio.timeout(timeout_s):
            if last:
                await response.write_eof(data)
            else:
                await response.write(data)
    except TimeoutError:
        if request.transport is not None:
            request.transport.abort()  # drop what is buffered for it: it is not reading
        raise ClientStalled(f"the client read nothing for {timeout_s:g} s") from None


def _cannot_wait(transport, n: int) -> bool:
    """Whether writing ``n`` bytes to ``transport`` cannot pause it (nor find it paused)."""
    try:
        low, high = transport.get_write_buffer_limits()
        size = transport.get_write_buffer_size()
        return size <= low and size + n <= high
    except (AttributeError, NotImplementedError):  # a transport without flow control: the timer decides
        return False
