"""The few operations the lease manager needs from SGLang's UnifiedRadixCache.

Kept apart so that ``manager.py`` stays free of sglang internals: locks are real
tree locks (``cache.lock`` / ``cache.unlock``), node walks need the Python
TreeCore (``tree_core.node_by_id``), which the plugin selects for ``session_ttl``.
The host tier (HiCache, ``cache.cache_controller``) is read and driven through
SGLang's own entry points: ``load_back`` (what admission calls through
``init_load_back``), ``ready_to_load_host_cache`` (what the prefill batch build
calls) and ``ongoing_load_back`` (what ``loading_check`` reaps).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

from .tiers import PathState

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

    def headroom_tokens(self) -> int:
        """GPU KV that can be had now: free + evictable."""
        return self.available_tokens() + self.evictable_tokens()

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

    def in_tree(self, node_id: int) -> bool:
        """The node still exists (its KV on the GPU, on host, or both)."""
        try:
            self.cache.tree_core.node_by_id(node_id)
        except KeyError:
            return False
        return True

    def on_path(self, ancestor_id: int, node_id: Any) -> bool:
        """``ancestor_id`` is ``node_id`` or one of its ancestors."""
        if isinstance(node_id, bool) or not isinstance(node_id, int):
            return False
        try:
            node = self.cache.tree_core.node_by_id(node_id)
        except KeyError:
            return False
        while node is not None:
            if node.id == ancestor_id:
                return True
            node = node.parent
        return False

    # ------------------------------------------------------------------ host tier
    def host_tier_attached(self) -> bool:
        """HiCache holds KV on host (not buffer-only staging, not an external linker)."""
        cache = self.cache
        return (
            getattr(cache, "cache_controller", None) is not None
            and getattr(cache, "host_memory_mode", "cache") == "cache"
            and getattr(cache, "linker", None) is None
        )

    def host_capacity_tokens(self) -> int:
        return int(self.cache.cache_controller.mem_pool_host.size)

    def distinct_path_tokens(self, node_ids: Iterable[int]) -> int:
        """Tokens of the union of these nodes' paths to the root (a shared prefix counts once)."""
        seen: set[int] = set()
        total = 0
        for node_id in node_ids:
            try:
                node = self.cache.tree_core.node_by_id(node_id)
            except KeyError:
                continue
            while node is not None and node.parent is not None and node.id not in seen:
                seen.add(node.id)
                total += len(node.key)
                node = node.parent
        return total

    def write_policy(self) -> str:
        return str(self.cache.cache_controller.write_policy)

    def storage_backend(self) -> str | None:
        return getattr(self.cache.cache_controller, "storage_backend_type", None)

    def path_state(self, node_id: int) -> PathState:
        """Where the KV of ``node_id``'s path is (with write-back, GPU KV counts as backed up:
        SGLang copies it to host when it evicts it)."""
        try:
            node = self.cache.tree_core.node_by_id(node_id)
        except KeyError:
            return PathState(exists=False)
        write_back = bool(getattr(self.cache, "is_write_back", False))
        device = host_only = unbacked = 0
        while node is not None and node.parent is not None:
            cd = node.component_data[_FULL]
            tokens = len(node.key)
            if cd.value is not None:
                device += tokens
                if cd.host_value is None and not write_back:
                    unbacked += tokens
            elif cd.host_value is not None:
                host_only += tokens
            node = node.parent
        return PathState(device, host_only, unbacked)

    @staticmethod
    def node_reloadable(node: Any, write_back: bool) -> bool:
        """Evicting this node's GPU KV keeps a host copy to load back."""
        return write_back or node.component_data[_FULL].host_value is not None

    @staticmethod
    def host_only_subtree(node: Any) -> Iterator[Any]:
        """``node`` and its descendants that hold no GPU KV (below a GPU leaf: the part of
        the tree that was demoted to host)."""
        stack = [node]
        while stack:
            current = stack.pop()
            yield current
            stack.extend(
                child
                for child in current.children.values()
                if child.component_data[_FULL].value is None
            )

    def eviction_room(
        self, key: Callable[[Any, tuple], Any], stop: Callable[[Any], bool], need: int
    ) -> int:
        """Tokens SGLang's GPU eviction walk (``FullComponent``: a heap of evictable leaves by
        strategy priority; a parent joins once its last GPU child went) would free before it
        reaches a node whose ``key(node, gone_children)`` ``stop`` rejects; a dry run, capped
        at ``need``. ``gone_children`` are the node's children this run evicted."""
        core = self.cache.tree_core
        heap = [(key(node, ()), node.id, node) for node in core.evictable_device_leaves]
        heapq.heapify(heap)
        gone: set[int] = set()
        freed = 0
        while heap and freed < need:
            k, _, node = heapq.heappop(heap)
            if stop(k):
                break
            freed += len(node.key)
            gone.add(node.id)
            parent = node.parent
            if parent is None or parent is core.root_node or self._pinned(parent):
                continue
            children = list(parent.children.values())
            if any(c.component_data[_FULL].value is not None and c.id not in gone for c in children):
                continue
            evicted = tuple(c for c in children if c.id in gone)
            heapq.heappush(heap, (key(parent, evicted), parent.id, parent))
        return freed

    @staticmethod
    def _pinned(node: Any) -> bool:
        return node.component_data[_FULL].value is None or any(
            cd.lock_ref > 0 for cd in node.component_data
        )

    def loads_pending(self) -> int:
        """Host-to-GPU loads queued or not yet reaped by ``loading_check``; every rank agrees,
        since SGLang reaps load acks in lockstep."""
        cc = self.cache.cache_controller
        return len(cc.load_queue) + len(cc.ack_load_queue)

    def start_load_back(self, node_id: int) -> bool:
        """Queue the host-to-GPU load of ``node_id``'s host-only path (SGLang's ``load_back``:
        locks the path, allocates GPU KV, commits it to the tree, tracks the load)."""
        return bool(self.cache.load_back(node_id))

    def submit_loads(self) -> int:
        """Submit the queued loads as one transfer; its producer index (what a forward waits on)."""
        return int(self.cache.ready_to_load_host_cache())

    def load_in_flight(self, node_id: int) -> bool:
        return node_id in self.cache.ongoing_load_back

    def latest_load_producer(self) -> int:
        return int(self.cache.cache_controller.layer_done_counter.producer_index)
