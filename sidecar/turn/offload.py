"""Heavy per-request work off the event loop: one thread, a deadline per job.

Rendering, hashing and tokenizing a prompt of megabytes takes from tens of milliseconds to
seconds; on the event loop it would stall every stream and /health. Large requests hand that
work to one thread instead (the tokenizers library and hashlib release the GIL while they run),
so at most one core goes to them and the loop keeps serving. (Not at a lower CPU priority: the
thread holds the GIL between tokenizer calls, and a thread the scheduler puts off while it holds
the GIL stalls the loop instead.) A job that cannot start within
its deadline gets 503 (retry later) and is dropped if it has not started; one that runs is bounded
by the request's own size, which the body and token limits have already capped. After a job the C
heap is trimmed: the tokenizer's buffers for a large prompt would otherwise stay in the
process's resident memory long after the request.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

from sidecar.errors import APIError

T = TypeVar("T")

OFFLOAD_CHARS = 64 * 1024  # a request carrying at least this much text is prepared off the loop


def _malloc_trim() -> Callable[[], None]:
    """glibc's malloc_trim(0), or nothing where there is no glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return lambda: None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


def tokenizer_busy(timeout_s: float) -> APIError:
    return APIError(
        503,
        f"the sidecar's tokenizer thread did not get to this large prompt within {timeout_s:g} s (other large "
        "prompts first); retry later",
        type="server_busy",
        code="tokenizer_busy",
        headers={"Retry-After": str(max(1, round(timeout_s)))},
    )


class Offload:
    """``await offload.run(fn, *args)``: ``fn(*args)`` on the one worker thread."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sidecar-tokenize")
        self._trim = _malloc_trim()

    def _job(self, fn: Callable[..., T], args) -> T:
        try:
            return fn(*args)
        finally:
            self._trim()

    async def run(self, fn: Callable[..., T], *args) -> T:
        future = self._pool.submit(self._job, fn, args)
        try:
            # a job still queued at the deadline (or whose client went away) is cancelled and never
            # runs; one already running finishes on its own, its result unused
            return await asyncio.wait_for(asyncio.wrap_future(future), self.timeout_s)
        except TimeoutError:
            raise tokenizer_busy(self.timeout_s) from None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
