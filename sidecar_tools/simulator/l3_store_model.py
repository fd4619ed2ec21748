"""A shared L3 KV store (SGLang's ``--hicache-storage-backend file`` on a path every worker sees,
or mooncake): why a session that moves to another worker need not be recomputed there.

Every worker writes its sessions' KV through to the store as their turns finish; the write of a
turn's new tokens lands ``tokens x bytes/token / bandwidth`` after the turn's end, so a worker
lost right after a turn leaves that tail unwritten. When a session is re-homed, its first turn on
the new worker reads the stored prefix back at the store's read bandwidth (SGLang's storage
prefetch into the host tier, which the request waits for) instead of prefilling it; the new
worker's engine then takes those tokens as cached (``SimRequest.storage_range``) and copies them
host-to-GPU inside the prefill step (the host tier's copy model).

Break-even: reading N tokens takes latency + N x bytes_per_token / bandwidth; recomputing them
takes the engine's prefill of N tokens (``CostModel.prefill_time``). The capacity is unbounded
(a file backend on a large volume); only sessions' own conversations are stored, keyed by session.

No sglang import here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sidecar_tools.simulator.costmodel import CostModel


def break_even_gbps(cost: CostModel, tokens: int, prefix_tokens: int = 0) -> float:
    """The read bandwidth at which loading ``tokens`` (after ``prefix_tokens`` already there) takes
    as long as prefilling them alone on an idle engine: faster stores pay, slower ones do not."""
    if tokens <= 0:
        return 0.0
    return tokens * cost.kv_bytes_per_token / cost.prefill_time([(tokens, prefix_tokens)]) / 1e9


@dataclass
class SharedL3:
    """Which prefix of each session's tokens the store holds, and what reading it back costs."""

    bytes_per_token: float  # KV bytes per token of the served model (the cost model's)
    read_gbps: float = 4.0  # GB/s one worker reads at (local NVMe / file backend class)
    write_gbps: float | None = None  # GB/s of the write-through (default: the read bandwidth)
    latency_s: float = 0.005  # per read: metadata lookup, first page
    # session -> [(time the write lands, stored prefix length)], in order of the turns
    _writes: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    read_tokens: int = 0
    reads: int = 0
    read_s: float = 0.0

    def __post_init__(self) -> None:
        if self.read_gbps <= 0 or (self.write_gbps is not None and self.write_gbps <= 0):
            raise ValueError("L3 bandwidth must be positive")

    def transfer_s(self, tokens: int, gbps: float) -> float:
        return tokens * self.bytes_per_token / (gbps * 1e9)

    def write(self, session_id: str, stored_tokens: int, new_tokens: int, now: float) -> None:
        """A turn of the session ended at ``now``: its KV up to ``stored_tokens`` is written through,
        the ``new_tokens`` not yet stored landing after their transfer time."""
        lands = now + self.transfer_s(max(new_tokens, 0), self.write_gbps or self.read_gbps)
        self._writes.setdefault(session_id, []).append((lands, stored_tokens))

    def stored(self, session_id: str, now: float) -> int:
        """The longest prefix of the session's tokens that has landed in the store by ``now``."""
        return max((n for lands, n in self._writes.get(session_id, ()) if lands <= now), default=0)

    def read(self, tokens: int) -> float:
        """Read ``tokens`` back (one re-homed turn): seconds until they are in the new worker's host tier."""
        if tokens <= 0:
            return 0.0
        dt = self.latency_s + self.transfer_s(tokens, self.read_gbps)
        self.reads += 1
        self.read_tokens += tokens
        self.read_s += dt
        return dt

    def report(self) -> dict[str, float]:
        return {"read_gbps": self.read_gbps, "write_gbps": self.write_gbps or self.read_gbps,
                "bytes_per_token": self.bytes_per_token, "latency_s": self.latency_s,
                "reads": self.reads, "read_tokens": self.read_tokens, "read_s": round(self.read_s, 3)}
