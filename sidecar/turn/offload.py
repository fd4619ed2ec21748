"""Heavy per-request work off the event loop: a small pool of threads, fair across keys.

Parsing, validating, converting, hashing, rendering and tokenizing a request of megabytes takes
from tens of milliseconds to seconds; on the event loop it would stall every stream and /health.
Each such step of a request asks :meth:`Offload.prepare` where it runs: a heavy one (its weight,
all fields counted: :func:`request_weight`, or a body's bytes and values) on the pool (Python code
there yields the GIL every few milliseconds; the tokenizers library and hashlib release it while
they run), so the loop keeps serving; a light one on the loop, in a turn of the loop where the
requests served before it have not spent :data:`INLINE_BUDGET` yet (ten light bodies arriving at
once would otherwise stall it ten times as long): past the budget it waits for the loop's next
turn, not for the pool. The pool is one lane per key on lower-priority threads, so on a busy core
a light step sent there waited 100-500 ms for a millisecond of work (long-256 load test,
2026-12-03b: ``benchmarks/results/load/cost-2026-12-03b``).

Fair: each key (the API key's scope) has its own queue and runs at most ``threads - 1`` jobs at
once (one with a single thread), and a free thread takes the next key in turn. So one key's long
requests wait behind each other, never in front of another key's: with two threads, a key that
floods the pool still leaves a thread to the rest. A job that cannot start within its deadline
gets 503 (retry later) and is dropped unstarted; one that runs is bounded by the request's
limits (body size, prompt tokens counted ahead), never by how much text was sent.

Memory: allocations of a megabyte or more are mapped on their own and unmapped when freed (glibc's
``M_MMAP_THRESHOLD``, fixed, so it cannot drift up to 32 MB after a few large bodies), and the
heap is trimmed only once a pool thread is idle after megabytes of text went through it, at most
once a second (``malloc_trim`` walks the whole heap: once per job it cost a quarter of the
sidecar's CPU at 256 agents).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, TypeVar

from sidecar.errors import APIError, retry_after

T = TypeVar("T")

OFFLOAD_CHARS = 64 * 1024  # a request weighing at least this much is prepared off the loop
INLINE_BUDGET = OFFLOAD_CHARS  # what all requests together may prepare inline in one turn of the loop
ITEM_WEIGHT = 32  # each value (object, list, string, number) counts as this many characters besides its text
TRIM_AFTER_CHARS = 4 << 20  # the heap is trimmed once this much text was prepared since the last trim...
TRIM_MIN_INTERVAL_S = 1.0  # ...at most this often, when a thread has nothing queued
MMAP_THRESHOLD_BYTES = 1 << 20  # malloc maps allocations from this size on (returned to the OS on free)
# pool threads run this much nicer than the event loop: on a box with few cores, the seconds of
# CPU a flood of large prompts costs (tokenizing, GIL released) go where the loop leaves them
POOL_NICE = 10


def request_weight(messages: Iterable[Any], tools: Any = None, kwargs: Any = None, enough: int = OFFLOAD_CHARS) -> int:
    """What preparing a request costs, in characters of text: every string of every field (message
    text, reasoning, tool-call names and arguments, tool definitions, template variables), plus
    ITEM_WEIGHT for each value (thousands of short messages or tiny values cost too). Counting
    stops once ``enough`` is reached, so the count itself is bounded work on the loop."""
    total = 0
    stack: list[Any] = [kwargs, tools, list(messages) if not isinstance(messages, list) else messages]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            total += ITEM_WEIGHT + len(value)
        elif isinstance(value, dict):
            total += ITEM_WEIGHT
            for key, item in value.items():
                total += len(key) if isinstance(key, str) else ITEM_WEIGHT
                stack.append(item)
        elif isinstance(value, (list, tuple)):
            total += ITEM_WEIGHT
            stack.extend(value)
        elif value is not None:
            total += ITEM_WEIGHT
        if total >= enough:
            return total
    return total


def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


_LIBC = _libc()
_M_MMAP_THRESHOLD = -3


def _malloc_trim() -> Callable[[], None]:
    """glibc's malloc_trim(0), or nothing where there is no glibc."""
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is None:
        return lambda: None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: trim(0)


def fix_mmap_threshold(nbytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Allocations of ``nbytes`` or more mapped on their own, returned to the OS when freed; the
    threshold stays fixed (glibc would otherwise raise it after large frees, keeping body-sized
    buffers in the heap). False where there is no glibc."""
    mallopt = getattr(_LIBC, "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, nbytes))


def lower_priority(steps: int = POOL_NICE) -> bool:
    """This thread's CPU priority ``steps`` below its process's (Linux: niceness is per thread);
    False where that cannot be set."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + steps))
    except (AttributeError, OSError):
        return False
    return True


def tokenizer_busy(timeout_s: float) -> APIError:
    return APIError(
        503,
        f"the sidecar's tokenizer threads did not get to this large prompt within {timeout_s:g} s (this key's other "
        "large prompts first); retry later",
        type="server_busy",
        code="tokenizer_busy",
        headers=retry_after(timeout_s),
    )


@dataclass(eq=False)
class _Job:
    fn: Callable[..., Any]
    args: tuple
    key: str
    weight: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


@dataclass
class _Queues:
    """Waiting jobs by key; running jobs per key; when each key was last served (the key served
    longest ago goes next, a key never served first: round robin, new keys included)."""

    waiting: dict[str, deque[_Job]] = field(default_factory=dict)
    running: dict[str, int] = field(default_factory=dict)
    served: dict[str, int] = field(default_factory=dict)
    _turn: int = 0

    def push(self, job: _Job) -> None:
        self.waiting.setdefault(job.key, deque()).append(job)

    def pop(self, per_key: int) -> _Job | None:
        """The oldest job of the key served longest ago, skipping keys running ``per_key`` jobs."""
        ready = [k for k in self.waiting if self.running.get(k, 0) < per_key]
        if not ready:
            return None
        key = min(ready, key=lambda k: self.served.get(k, -1))
        jobs = self.waiting[key]
        job = jobs.popleft()
        if not jobs:
            del self.waiting[key]
        self._turn += 1
        self.served[key] = self._turn
        self.running[key] = self.running.get(key, 0) + 1
        return job

    def remove(self, job: _Job) -> None:
        jobs = self.waiting.get(job.key)
        if jobs is not None and job in jobs:
            jobs.remove(job)
            if not jobs:
                del self.waiting[job.key]

    def done(self, key: str) -> None:
        n = self.running[key] - 1
        if n:
            self.running[key] = n
        else:
            del self.running[key]
            if key not in self.waiting:
                self.served.pop(key, None)  # an idle key is forgotten (keys are unbounded)


class Offload:
    """``await offload.run(fn, *args, key=scope)``: ``fn(*args)`` on a pool thread, fair across keys."""

    def __init__(self, timeout_s: float, threads: int = 2):
        self.timeout_s = timeout_s
        self.threads = max(1, threads)
        self.per_key = max(1, self.threads - 1)
        self._queues = _Queues()
        self._cond = threading.Condition()
        self._closed = False
        self._workers: list[threading.Thread] = []
        self._trim = _malloc_trim()
        self._since_trim = 0  # characters prepared since the last trim
        self._last_trim = 0.0
        self._spent = 0  # weight prepared inline in this turn of the event loop
        fix_mmap_threshold()

    def inline(self, weight: int) -> bool:
        """Whether work of ``weight`` may run on the event loop now: it is light, and with it the
        work done inline in this turn of the loop stays within INLINE_BUDGET (the count starts
        again on the loop's next turn). Called on the loop."""
        if weight >= OFFLOAD_CHARS or self._spent + weight > INLINE_BUDGET:
            return False
        if not self._spent:
            asyncio.get_running_loop().call_soon(self._new_turn)
        self._spent += max(weight, 1)
        return True

    def _new_turn(self) -> None:
        self._spent = 0

    async def prepare(self, fn: Callable[..., T], *args, key: str = "", weight: int = OFFLOAD_CHARS) -> T:
        """``fn(*args)`` where its ``weight`` says: light work here, in the first turn of the loop
        with budget left for it (:meth:`inline`); heavy work on the pool in ``key``'s turn."""
        if weight >= OFFLOAD_CHARS:
            return await self.run(fn, *args, key=key, weight=weight)
        while not self.inline(weight):
            await asyncio.sleep(0)  # this turn's budget is spent: the streams go first, then the next turn
        return fn(*args)

    def _start(self) -> None:
        while len(self._workers) < self.threads:
            t = threading.Thread(target=self._work, name=f"sidecar-tokenize-{len(self._workers)}", daemon=True)
            self._workers.append(t)
            t.start()

    async def run(self, fn: Callable[..., T], *args, key: str = "", weight: int = OFFLOAD_CHARS) -> T:
        loop = asyncio.get_running_loop()
        job = _Job(fn, args, key, weight, loop, loop.create_future())
        with self._cond:
            if self._closed:
                raise tokenizer_busy(self.timeout_s)
            if not self._workers:
                self._start()
            self._queues.push(job)
            self._cond.notify()
        try:
            # a job still queued at the deadline (or whose client went away) is dropped and never
            # runs; one already running finishes on its own, its result unused
            result, error = await asyncio.wait_for(asyncio.shield(job.future), self.timeout_s)
        except TimeoutError:
            raise tokenizer_busy(self.timeout_s) from None
        finally:
            if not job.future.done():
                with self._cond:
                    self._queues.remove(job)
                job.future.cancel()  # a running job's result (or error) is dropped unread
            job = args = None
        if error is None:
            return result
        # The job's error is raised here, not through the futures that carried it: a future that
        # holds an exception whose traceback holds the frames awaiting that future is a reference
        # cycle, and with it the request (12 MB of refused prompt) would wait for a full garbage
        # collection, which a quiet sidecar may not run for minutes.
        try:
            raise error
        finally:
            error = None

    def _work(self) -> None:
        lower_priority()
        while True:
            with self._cond:
                job = self._next_job()
                if job is None:
                    return
            try:
                result, error = job.fn(*job.args), None
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting request
                result, error = None, exc
            try:
                job.loop.call_soon_threadsafe(_settle, job.future, result, error)
            except RuntimeError:  # the loop is closed: nobody waits
                pass
            key, weight = job.key, job.weight
            # nothing of the job outlives it on this thread while it waits for the next one: its
            # arguments, result or error (whose traceback holds a request's whole history)
            job = result = error = None
            with self._cond:
                self._queues.done(key)
                self._since_trim += weight
                self._cond.notify()

    def _next_job(self) -> _Job | None:
        """The next job to run (None once closed); an idle thread trims the heap when it is due."""
        while not self._closed:
            job = self._queues.pop(self.per_key)
            if job is not None:
                return job
            if self._trim_due():
                self._since_trim, self._last_trim = 0, time.monotonic()
                self._cond.release()
                try:
                    self._trim()
                finally:
                    self._cond.acquire()
                continue
            wait = TRIM_MIN_INTERVAL_S - (time.monotonic() - self._last_trim) if self._since_trim >= TRIM_AFTER_CHARS else None
            self._cond.wait(max(wait, 0.01) if wait is not None else None)
        return None

    def _trim_due(self) -> bool:
        return self._since_trim >= TRIM_AFTER_CHARS and time.monotonic() - self._last_trim >= TRIM_MIN_INTERVAL_S

    def close(self) -> None:
        with self._cond:
            self._closed = True
            for jobs in self._queues.waiting.values():
                for job in jobs:
                    try:
                        job.loop.call_soon_threadsafe(job.future.cancel)
                    except RuntimeError:  # its loop is closed
                        pass
            self._queues.waiting.clear()
            self._cond.notify_all()


@dataclass(frozen=True)
class Prepare:
    """Where one request's steps run: ``await prepare(fn, *args)`` is ``fn(*args)``, inline or on
    the pool as the request's weight says (:meth:`Offload.prepare`), in its key's turn."""

    offload: Offload
    key: str
    weight: int

    async def __call__(self, fn: Callable[..., T], *args) -> T:
        return await self.offload.prepare(fn, *args, key=self.key, weight=self.weight)


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    """The job's outcome as the future's result, its error included (``Offload.run`` raises it)."""
    if not future.done():
        future.set_result((result, error))
