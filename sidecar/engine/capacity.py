"""What one SGLang worker can hold, as its ``/server_info`` reports it: the GPU KV pool, the host
tier behind it (HiCache), its L3 storage tier, the prompt limit, and whether the session_ttl
plugin runs there. The
policy admits sessions against a worker's capacity; no HTTP here, so the policy may import it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The plugin's entry in /server_info internal_states (sglang_ext.hooks.get_internal_state).
PLUGIN_STATE_KEY = "session_ttl"


@dataclass(frozen=True)
class EngineCapacity:
    max_total_num_tokens: int  # tokens in the worker's GPU KV pool (0 = unknown)
    max_req_input_len: int = 0  # most prompt tokens one request may have (0 = unknown)
    host_tokens: int = 0  # tokens of its host-RAM tier (HiCache; 0 = none or unknown)
    plugin: bool = False  # the session_ttl plugin is the worker's eviction policy
    started_at: float | None = None  # SGLang's startup_time: a new value means it restarted
    storage_backend: str | None = None  # HiCache's L3 tier (--hicache-storage-backend), None = none
    storage_prefetch_policy: str = "best_effort"  # how long a request waits for its L3 read
    host_write_policy: str = "write_through"  # --hicache-write-policy (SGLang's default: write_through)

    @property
    def storage_waits(self) -> bool:
        """Whether a request waits for what L3 holds of it (best_effort starts it with what has
        arrived: a re-homed session then recomputes, which pays unless L3 reads beat prefill)."""
        return self.storage_backend is not None and self.storage_prefetch_policy != "best_effort"

    @property
    def known(self) -> bool:
        """The worker told us its KV pool (until then the sidecar admits no new session)."""
        return self.max_total_num_tokens > 0

    @property
    def hierarchy_tokens(self) -> int:
        """What the whole hierarchy can hold: GPU pool + host tier. HiCache demotes evicted GPU KV
        to host and loads it back when its session returns, so KV that fits here is never
        recomputed."""
        return self.max_total_num_tokens + self.host_tokens

    @property
    def distinct_hierarchy_tokens(self) -> int:
        """What GPU + host hold without duplicates: write-through (and its selective form) copies
        GPU pages to host, so the host tier holds the GPU's pages too; write_back copies a page only
        when the GPU evicts it."""
        if self.host_tokens <= 0 or self.host_write_policy == "write_back":
            return self.hierarchy_tokens
        return max(self.max_total_num_tokens, self.host_tokens)

    @classmethod
    def from_server_info(cls, info: dict[str, Any]) -> EngineCapacity:
        """From SGLang's /server_info ({} when it did not answer: everything unknown)."""
        gpu = int(info.get("max_total_num_tokens") or 0)
        plugin = _plugin_state(info)
        return cls(
            max_total_num_tokens=gpu,
            max_req_input_len=int(info.get("max_req_input_len") or 0),
            host_tokens=_host_tokens(info, gpu, plugin),
            plugin=plugin is not None,
            started_at=info.get("startup_time"),
            storage_backend=info.get("hicache_storage_backend") or None,
            storage_prefetch_policy=info.get("hicache_storage_prefetch_policy") or "best_effort",
            host_write_policy=info.get("hicache_write_policy") or "write_through",
        )


def _plugin_state(info: dict[str, Any]) -> dict[str, Any] | None:
    for state in info.get("internal_states") or ():
        if isinstance(state, dict) and isinstance(state.get(PLUGIN_STATE_KEY), dict):
            return state[PLUGIN_STATE_KEY]
    return None


def _host_tokens(info: dict[str, Any], gpu_tokens: int, plugin: dict[str, Any] | None) -> int:
    """The host tier's size in tokens: as the plugin measured it on the live pool, else from
    SGLang's server args the way SGLang 0.5.23 sizes the pool (``--hicache-ratio`` x the GPU pool,
    ``kv_cache_builder``); 0 without HiCache, in buffer-only mode, or when only ``--hicache-size``
    (GB) is known, which cannot be turned into tokens without the model's layout."""
    if plugin is not None:
        measured = (plugin.get("tier_tokens") or {}).get("host")
        if isinstance(measured, (int, float)) and measured >= 0:
            return int(measured)
    if not info.get("enable_hierarchical_cache") or info.get("hicache_host_memory_mode", "cache") != "cache":
        return 0
    if float(info.get("hicache_size") or 0) > 0:
        return 0
    ratio = info.get("hicache_ratio")
    if not isinstance(ratio, (int, float)) or ratio <= 0:
        return 0
    return int(gpu_tokens * ratio) + 1
