"""A stream write skips the stall timer only when it provably cannot wait for the client."""

import asyncio

import pytest

from sidecar.frontdoor.client_writes import ClientStalled, write_within


class Transport:
    def __init__(self, buffered, limits=(16, 64)):
        self.buffered, self.limits, self.aborted = buffered, limits, False

    def get_write_buffer_limits(self):
        return self.limits

    def get_write_buffer_size(self):
        return self.buffered

    def abort(self):
        self.aborted = True


class Request:
    def __init__(self, transport):
        self.transport = transport


class Response:
    """A response whose write waits for a client that never reads, unless told it may go."""

    def __init__(self, blocks):
        self.blocks, self.written = blocks, []

    async def write(self, data):
        if self.blocks:
            await asyncio.sleep(3600)
        self.written.append(data)

    async def write_eof(self, data=b""):
        await self.write(data)


@pytest.mark.parametrize("buffered", [0, 16])
async def test_a_write_that_cannot_pause_the_transport_goes_out(buffered):
    """At or below the low-water mark (not paused) and staying within the high-water mark."""
    response = Response(blocks=False)
    await write_within(Request(Transport(buffered)), response, b"x" * (64 - buffered), 0.01, last=True)
    assert response.written == [b"x" * (64 - buffered)]


class NoFlowControl:
    aborted = False

    def abort(self):
        self.aborted = True


@pytest.mark.parametrize("transport", [
    Transport(buffered=17),  # above the low-water mark: it may be paused
    Transport(buffered=0, limits=(4, 8)),  # the write takes it past the high-water mark
    NoFlowControl(),
])
async def test_a_write_that_may_wait_is_cut_at_the_timeout(transport):
    """Where the write may wait (or on a transport without flow control) the timer is armed: a
    client that reads nothing is cut and its connection dropped."""
    with pytest.raises(ClientStalled):
        await write_within(Request(transport), Response(blocks=True), b"0123456789", 0.01)
    assert transport.aborted
