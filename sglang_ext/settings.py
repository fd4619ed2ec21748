"""Settings of the ``session_ttl`` eviction policy.

They arrive as the JSON object of ``--radix-eviction-policy-config``, which SGLang
passes to the strategy constructor as keyword arguments. One pydantic model
validates them so that a typo fails at startup with the key named, instead of
silently running with defaults. No sglang import here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

POLICY_NAME = "session_ttl"
HOST_SHORT = "host_short"  # lock_due_backed_up: lock backed-up KV only while the host tier is short


class SessionTTLSettings(BaseModel):
    """What ``--radix-eviction-policy-config`` may contain for ``session_ttl``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_leased_fraction: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="Upper bound on hard-leased (locked) KV, as a fraction of the KV pool. "
        "Leases beyond it are demoted to soft leases (evicted after unleased KV).",
    )
    default_ttl_s: float = Field(
        0.0,
        ge=0.0,
        description="TTL for a finished request that carries a session_id but no "
        "session_lease_ttl_s. 0 means such a request ends the session's lease.",
    )
    max_ttl_s: float = Field(
        3600.0, gt=0.0, description="Requested TTLs are clamped to this many seconds."
    )
    soft_overflow: bool = Field(
        True,
        description="Keep leases that do not fit under max_leased_fraction as soft leases "
        "(evicted after all unleased KV) instead of dropping them.",
    )
    release_on_decode_pressure: bool = Field(
        True,
        description="Release leases (least value first) before SGLang retracts running "
        "decode requests for lack of KV.",
    )
    prefer_leased_requests: bool = Field(
        True,
        description="Under FCFS, queue requests of sessions holding a hard lease ahead of the "
        "others (FCFS within each group): they need only their new tokens, while a request "
        "whose history must be recomputed would block them at the head of the queue and "
        "force the pressure valve to release the leases they are about to use.",
    )
    max_priority_wait_s: float = Field(
        3.0,
        ge=0.0,
        description="With prefer_leased_requests: the most seconds (of the lease clock) an unleased "
        "or recomputing request is kept behind leased ones; after that it goes in its arrival order, "
        "so leased agents that keep returning cannot starve it (0 = arrival order for everyone).",
    )
    tick_interval_s: float = Field(
        0.05,
        gt=0.0,
        le=5.0,
        description="Granularity of the lease clock that rank 0 broadcasts to all ranks.",
    )
    # ---- host tier (HiCache); read only when the cache has a host tier attached
    tier_aware: bool = Field(
        True,
        description="With HiCache: order GPU eviction by the cost of bringing KV back (backed-up "
        "KV first, latest expected return first) and hard-lease only KV that would otherwise be "
        "recomputed or reloaded on the critical path; false keeps every lease hard as without HiCache.",
    )
    host_load_tokens_per_s: float = Field(
        200_000.0,
        gt=0.0,
        description="Host-to-GPU load rate in KV tokens per second: a reload of N tokens is "
        "expected to take N / this. Measure it on the GPU host (sglang:load_back_duration_seconds "
        "against sglang:load_back_tokens_total).",
    )
    reload_margin_s: float = Field(
        0.05,
        ge=0.0,
        le=60.0,
        description="Added to the reload time: a session expected back within reload time + this "
        "keeps its KV locked on the GPU, and a prefetch starts that long before the expected return.",
    )
    lock_due_backed_up: bool | Literal["host_short"] = Field(
        True,
        description="With HiCache: lock a lease whose KV is all on the GPU and backed up on host while "
        "its session is due back (the reload window) or has a request waiting. True (default): whatever "
        "the host holds. \"host_short\": only while the host tier is short (its capacity less the leased "
        "sessions' KV < the GPU pool: one more pool of copies would evict leased host KV, so a backed-up "
        "session may lose both copies before it returns; copies no lease covers go first); with room on host a backed-up lease only orders eviction (soft): losing its GPU copy "
        "costs a reload, and a lock would count its KV as used while a request waits for the room. In the "
        "simulator it leaves the ratio-1 rows identical to true and meets no more of the ratio-3 "
        "no-harm targets than true (benchmarks/results/sim/no-harm-2026-12-02-c). False: never (only KV without a "
        "host copy is ever locked).",
    )
    defer_with_host_room: bool = Field(
        True,
        description="With HiCache: while the host tier has room beside the leased KV (see "
        "lock_due_backed_up's \"host_short\"), step aside entirely: SGLang's LRU eviction order, "
        "SGLang's queue order, no lock on KV backed up on host. There every idle history reloads "
        "in milliseconds, and anything the plugin reorders or holds only moves work off the "
        "running batch. Once the host is short the plugin's rules apply as configured. In the "
        "simulator it makes the ratio-3 rows stock HiCache's (benchmarks/results/sim/no-harm-2026-12-02-d) "
        "and leaves the ratio-1 overload row as it was.",
    )
    prefetch: bool = Field(
        False,
        description="With HiCache: load a session's KV back from host to GPU ahead of its expected "
        "return when free or less valuable KV makes room, while no request is queued. Off by default: "
        "in the simulator it cost stock HiCache's makespan on real agent traffic (TraceLab x7: "
        "326 s vs 301 s; a reload at admission is cheap, a mispredicted prefetch moves KV twice).",
    )

    @classmethod
    def from_policy_config(cls, config: Mapping[str, Any] | None) -> SessionTTLSettings:
        """Build from the policy-config dict; raise ValueError with a readable message."""
        config = dict(config or {})
        unknown = sorted(set(config) - set(cls.model_fields))
        if unknown:
            raise ValueError(
                f"--radix-eviction-policy-config: unknown key(s) {unknown} for the "
                f"'{POLICY_NAME}' eviction policy; allowed keys: {sorted(cls.model_fields)}"
            )
        try:
            return cls(**config)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
                for err in exc.errors()
            )
            raise ValueError(
                f"--radix-eviction-policy-config: invalid value for the '{POLICY_NAME}' "
                f"eviction policy: {problems}"
            ) from None

    @property
    def reads_host_room(self) -> bool:
        """Whether any rule here depends on the host tier being short (``tiers.host_short``)."""
        return self.lock_due_backed_up == HOST_SHORT or self.defer_with_host_room

    def limit_tokens(self, capacity_tokens: int) -> int:
        """The hard-lease bound of a KV pool of ``capacity_tokens``."""
        return int(self.max_leased_fraction * capacity_tokens)

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.model_dump().items())
