"""The simulated workers of a replay: N SimEngines, each with its own plugin instance, and the load
each one carried (what "how many workers for this trace" is answered with).

A worker is one SGLang process (``SimEngine``: its own radix cache, pools and plugin lease table).
The replay routes every request of a session to the session's worker (placement decides it, as in
the live sidecar) and steps the engines on one virtual clock. A worker can be lost at a virtual
time (``WorkerLoss``, the CLI's ``--lose-worker W@T``): from then on it serves nothing.

No sglang import here (the engines do it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sidecar_tools.simulator.engine import SimEngine


def worker_names(count: int) -> list[str]:
    """The names placement knows the workers by: one worker keeps the single-engine sidecar's ""
    (no URL), several are w0, w1, ..."""
    if count < 1:
        raise ValueError("at least one worker")
    return [""] if count == 1 else [f"w{i}" for i in range(count)]


@dataclass(frozen=True)
class WorkerLoss:
    """Worker ``index`` is lost at virtual time ``at_s`` (its process dies: in-flight requests fail)."""

    index: int
    at_s: float

    @classmethod
    def parse(cls, text: str) -> WorkerLoss:
        """``W@T``: worker index W (0-based) at T seconds."""
        index, sep, at = text.partition("@")
        try:
            loss = cls(int(index), float(at)) if sep else None
        except ValueError:
            loss = None
        if loss is None or loss.index < 0 or loss.at_s < 0:
            raise ValueError(f"expected W@T (worker index >= 0, seconds >= 0), got {text!r}")
        return loss


@dataclass
class WorkerLoad:
    """What one worker carried during the run (its row of the per-worker table)."""

    sessions_placed: int = 0  # sessions that started (or were re-homed) here
    turns_served: int = 0  # turns that finished here
    prompt_tokens: int = 0
    cached_tokens: int = 0
    recomputed_tokens: int = 0  # history tokens it prefilled again (the records' definition)
    storage_read_tokens: int = 0  # of cached_tokens: read from the shared L3 store
    peak_used_kv_tokens: int = 0  # held by requests and leases (not evictable)
    peak_resident_kv_tokens: int = 0  # everything on the GPU pool, evictable included
    peak_host_used_tokens: int = 0  # host tier (HiCache), when there is one
    admission_waits: int = 0  # new sessions that queued at the gate before starting here
    admission_wait_s: float = 0.0  # their summed wait
    failed_requests: int = 0  # in flight when the worker was lost


@dataclass(eq=False)
class SimWorker:
    """One simulated SGLang worker: its engine, whether it is up, the load it carried."""

    name: str
    engine: SimEngine
    up: bool = True
    lost_at_s: float | None = None
    load: WorkerLoad = field(default_factory=WorkerLoad)

    def dormant(self) -> bool:
        """Nothing to do until something arrives (not busy, no wake-up of its own)."""
        return not self.engine.busy and self.engine.next_wakeup() is None

    def sample(self) -> None:
        """Track the peak KV this worker held (read after each of its steps)."""
        engine, load = self.engine, self.load
        available = engine.alloc.available_size()
        resident = engine.kv_tokens - available
        load.peak_resident_kv_tokens = max(load.peak_resident_kv_tokens, resident)
        load.peak_used_kv_tokens = max(load.peak_used_kv_tokens, resident - engine.cache.evictable_size())
        if engine.copies is not None:
            host = engine.cache.cache_controller.mem_pool_host
            load.peak_host_used_tokens = max(load.peak_host_used_tokens, host.logical_size - host.available_size())

    def report(self, makespan_s: float) -> dict[str, Any]:
        busy = sum(self.engine.busy_s.values())
        return {"worker": self.name or "w0", **vars(self.load), "engine_busy_s": round(busy, 3),
                "busy_fraction": round(busy / makespan_s, 4) if makespan_s > 0 else None,
                "admission_wait_s": round(self.load.admission_wait_s, 3), "lost_at_s": self.lost_at_s}


def check_losses(losses: Sequence[WorkerLoss], workers: int) -> None:
    """Refuse losses that name no worker, or that would leave none to move the sessions to."""
    if losses and workers < 2:
        raise ValueError("a worker loss needs --workers 2 or more (its sessions move to another worker)")
    for loss in losses:
        if loss.index >= workers:
            raise ValueError(f"--lose-worker {loss.index}@{loss.at_s:g}: there are only {workers} workers")
    if losses and len({loss.index for loss in losses}) >= workers:
        raise ValueError("losing every worker leaves nothing to serve the trace")


class WorkerSet:
    """The workers of one replay, by index and by the name placement knows them by."""

    def __init__(self, engines: SimEngine | Sequence[SimEngine]):
        engines = [engines] if isinstance(engines, SimEngine) else list(engines)
        self.workers = [SimWorker(n, e) for n, e in zip(worker_names(len(engines)), engines, strict=True)]
        self._by_name = {w.name: w for w in self.workers}

    def __len__(self) -> int:
        return len(self.workers)

    def __iter__(self):
        return iter(self.workers)

    def __getitem__(self, index: int) -> SimWorker:
        return self.workers[index]

    @property
    def names(self) -> list[str]:
        return [w.name for w in self.workers]

    def named(self, name: str | None) -> SimWorker | None:
        return self._by_name.get(name) if name is not None else None

    def live(self) -> list[SimWorker]:
        return [w for w in self.workers if w.up]

    def report(self, makespan_s: float) -> list[dict[str, Any]]:
        return [w.report(makespan_s) for w in self.workers]
