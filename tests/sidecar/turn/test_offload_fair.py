"""No key can seize the shared tokenizing (issue 27.2, 27.3, 28.1): keys take turns on the pool,
every field of a request counts toward preparing it off the loop, every limit is counted ahead,
and the heap is not trimmed after every job."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
import weakref

import pytest

from sidecar.conversation.tokens import TokenCodec
from sidecar.turn import offload as offload_module
from sidecar.turn.offload import OFFLOAD_CHARS, Offload, request_weight


async def _started_at(offload: Offload, key: str, hold_s: float, log: list) -> float:
    def job():
        log.append((key, time.monotonic()))
        time.sleep(hold_s)

    await offload.run(job, key=key)


async def test_a_key_flooding_the_pool_leaves_a_thread_to_other_keys():
    offload = Offload(timeout_s=10, threads=2)
    log: list = []
    flood = [asyncio.ensure_future(_started_at(offload, "flood", 0.6, log)) for _ in range(3)]
    await asyncio.sleep(0.05)
    t0 = time.monotonic()
    await _started_at(offload, "honest", 0.0, log)
    waited = [t for k, t in log if k == "honest"][0] - t0
    assert waited < 0.2, f"the honest key waited {waited:.2f} s behind another key's jobs"
    await asyncio.gather(*flood)
    starts = [t for k, t in log if k == "flood"]
    assert starts[1] - starts[0] > 0.5  # the flooding key's own jobs queue behind each other
    offload.close()


async def test_with_one_thread_keys_take_turns():
    offload = Offload(timeout_s=10, threads=1)
    log: list = []
    flood = [asyncio.ensure_future(_started_at(offload, "flood", 0.2, log)) for _ in range(4)]
    await asyncio.sleep(0.05)
    await _started_at(offload, "honest", 0.0, log)
    await asyncio.gather(*flood)
    order = [k for k, _ in log]
    assert order.index("honest") == 1, order  # after the job that was running, not after all four
    offload.close()


async def test_a_job_given_up_on_never_runs():
    offload = Offload(timeout_s=10, threads=1)
    ran: list = []
    blocker = asyncio.ensure_future(offload.run(time.sleep, 0.3))
    await asyncio.sleep(0.05)
    waiting = asyncio.ensure_future(offload.run(ran.append, "gone"))
    await asyncio.sleep(0.05)
    waiting.cancel()  # its client went away
    await blocker
    await asyncio.sleep(0.1)
    assert ran == []
    offload.close()


async def test_nothing_of_a_finished_job_stays_alive_on_its_thread():
    """A large request's history (a job's argument, result or error, whose traceback holds it) is
    freed once its request is done, not kept by the idle pool thread until its next job."""

    class History(list):
        pass

    offload = Offload(timeout_s=10, threads=1)
    for fails in (False, True):
        history = History(["x" * 100] * 100)
        alive = weakref.ref(history)

        def job(h: History) -> History:
            if fails:
                raise ValueError(f"refused {len(h)} messages")
            return h

        if fails:
            with pytest.raises(ValueError):
                await offload.run(job, history)
        else:
            assert await offload.run(job, history) is history
        del history, job
        await asyncio.sleep(0.05)  # the thread is waiting for its next job
        gc.collect()
        assert alive() is None, "the pool thread still holds the last request"
    offload.close()


async def test_a_refused_request_is_freed_without_waiting_for_the_garbage_collector():
    """A request refused on the pool (its 12 MB prompt past the limit) is freed as soon as its
    answer is sent, by reference counting alone: its error, the frames that held its text and the
    futures that carried the error form no cycle, which only a full collection (rare while the
    sidecar is quiet after an attack) would free."""

    class History(list):
        pass

    class Refused(Exception):
        pass

    def count(h: History) -> None:
        text = "".join(h)  # the frame that raises holds the text, as the token counter does
        raise Refused(f"{len(text)} characters")

    async def answer(offload: Offload, h: History) -> str:
        try:
            await offload.run(count, h)
        except Refused as exc:
            raise ValueError("too long") from None  # the door's 400, as the turn core raises it
        return "fitted"

    offload = Offload(timeout_s=10, threads=1)
    history = History(["x" * 100] * 100)
    alive = weakref.ref(history)
    gc.collect()
    gc.disable()
    try:
        with pytest.raises(ValueError):
            await answer(offload, history)
        del history
        await asyncio.sleep(0.05)  # the pool thread has let go of its job
        assert alive() is None, "the refused request waits in a reference cycle for the garbage collector"
    finally:
        gc.enable()
        offload.close()


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="per-thread niceness is Linux's")
async def test_pool_threads_run_nicer_than_the_event_loop():
    """Tokenizing a flood of large prompts is seconds of CPU with the GIL released: on a box of two
    cores it would take the loop's core (issue 27.3); the pool's threads yield it to the loop."""
    offload = Offload(timeout_s=10, threads=2)
    try:
        mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        theirs = await offload.run(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        assert theirs == min(19, mine + offload_module.POOL_NICE) > mine
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine  # the loop's own stays
    finally:
        offload.close()


def test_every_field_counts_toward_the_weight():
    small = [{"role": "user", "content": "hi"}]
    assert request_weight(small) < OFFLOAD_CHARS
    args = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "w", "arguments": "x" * OFFLOAD_CHARS}}]}
    assert request_weight([args]) >= OFFLOAD_CHARS
    nested = {"role": "assistant", "tool_calls": [{"function": {"name": "w", "arguments": {"k": ["v"] * 2000}}}]}
    assert request_weight([nested]) >= OFFLOAD_CHARS
    tools = [{"type": "function", "function": {"name": "t", "description": "d" * OFFLOAD_CHARS}}]
    assert request_weight(small, tools) >= OFFLOAD_CHARS
    many = [{"role": "user", "content": "x"}] * 2000  # thousands of short messages
    assert request_weight(many) >= OFFLOAD_CHARS
    assert request_weight(small, kwargs={"v": "y" * OFFLOAD_CHARS}) >= OFFLOAD_CHARS


def test_counting_the_weight_stops_once_it_is_enough():
    many = [{"role": "user", "content": "x"}] * 1_000_000
    t0 = time.perf_counter()
    assert request_weight(many) >= OFFLOAD_CHARS
    assert time.perf_counter() - t0 < 0.05


async def test_the_heap_is_trimmed_rarely_and_only_after_megabytes(monkeypatch):
    trims: list[float] = []
    monkeypatch.setattr(offload_module, "_malloc_trim", lambda: (lambda: trims.append(time.monotonic())))
    offload = Offload(timeout_s=10, threads=2)
    for _ in range(200):  # many small jobs: no trim at all
        await offload.run(lambda: None, weight=1000)
    await asyncio.sleep(0.2)
    assert trims == []
    for _ in range(20):  # 20 jobs of 1 MB each: a trim or two, not twenty
        await offload.run(lambda: None, weight=1 << 20)
    await asyncio.sleep(1.5)
    assert 1 <= len(trims) <= 3
    assert all(b - a >= offload_module.TRIM_MIN_INTERVAL_S - 0.05 for a, b in zip(trims, trims[1:]))
    offload.close()


@pytest.fixture
async def sidecar(make_sidecar, make_sglang_double):
    double = await make_sglang_double(context_length=40960, max_total_num_tokens=200_000)
    client = await make_sidecar(double=double, max_body_bytes=64 << 20)
    return client, double


def _spy_encoded_chars(monkeypatch) -> list[int]:
    pieces: list[int] = []
    original = TokenCodec._ids
    monkeypatch.setattr(TokenCodec, "_ids", lambda self, backend, text: pieces.append(len(text)) or original(self, backend, text))
    return pieces


SYSTEM = "The system prompt, said once more, and again.\n" * 200_000  # ~9.6 MB, ~2M tokens


@pytest.mark.parametrize("door, body", [
    ("/v1/messages/count_tokens", {"system": SYSTEM, "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/messages", {"system": SYSTEM, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]}),
    ("/v1/responses", {"instructions": SYSTEM, "input": "hi", "store": False}),
])
async def test_a_huge_system_prompt_is_counted_ahead_on_every_door(door, body, sidecar, monkeypatch):
    """count_tokens too: past the limit is a 400 after the limit's worth of tokens, not the whole text."""
    client, double = sidecar
    pieces = _spy_encoded_chars(monkeypatch)
    resp = await client.post(door, json=body)
    assert resp.status == 400, await resp.text()
    assert "40960" in await resp.text() or "limit" in await resp.text()
    assert sum(pieces) < 1_500_000, f"{sum(pieces)} characters tokenized of {len(SYSTEM)}"
    assert double.requests == []
