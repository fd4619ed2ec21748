"""The few operations the lease manager needs from SGLang's UnifiedRadixCache.

Kept apart so that ``manager.py`` stays free of sglang internals: locks are real
tree locks (``cache.lock`` / ``cache.unlock``), node walks need the Python
TreeCore (``tree_core.node_by_id``), which the plugin selects for ``session_ttl``.
"""

from __future__ import annotations

from typing import Any

from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

_FULL = ComponentType.FULL


class SGLangTree:
    def __init__(self, cache: Any) -> None:
        self.cache = cache

    def capacity_tokens(self) -> int:
        """KV pool size in tokens (the base of max_leased_fraction)."""
        return int(self.cache.token_to_kv_pool_allocator.size)

    def evictable_tokens(self) -> int:
        return int(self.cache.evictable_size())

    def available_tokens(self) -> int:
        return int(self.cache.token_to_kv_pool_allocator.available_size())

    def is_root(self, node_id: int) -> bool:
        return bool(self.cache.is_root(node_id))

    def exists(self, node_id: int) -> bool:
        try:
            node = self.cache.tree_core.node_by_id(node_id)
        except KeyError:
            return False
        return not node.evicted

    def lock(self, node_id: int) -> Any:
        return self.cache.lock(node_id)

    def unlock(self, handle: Any) -> None:
        self.cache.unlock(handle)

    def path(self, node_id: int) -> list[tuple[int, int]]:
        """(node id, tokens) from ``node_id`` up to, not including, the root."""
        node = self.cache.tree_core.node_by_id(node_id)
        out = []
        while node is not None and node.parent is not None:
            out.append((node.id, len(node.key)))
            node = node.parent
        return out

    def unlock_gain(self, node_id: int) -> int:
        """Tokens that become evictable if one lock on ``node_id`` is dropped:
        the nodes of its path that no other lock (request or lease) holds."""
        node = self.cache.tree_core.node_by_id(node_id)
        gain = 0
        while node is not None and node.parent is not None:
            if node.component_data[_FULL].lock_ref == 1:
                gain += len(node.key)
            node = node.parent
        return gain
