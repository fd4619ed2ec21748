"""The ``session_ttl`` eviction strategy (``--radix-eviction-policy session_ttl``)."""

from __future__ import annotations

import logging
from typing import Any

from sglang.srt.mem_cache.evict_policy import EvictionStrategy

from . import order
from .lease_table import LeaseTable
from .manager import LeaseManager
from .metrics import LeaseMetrics
from .settings import SessionTTLSettings

logger = logging.getLogger(__name__)


class SessionTTLStrategy(EvictionStrategy):
    """Session-lease-aware LRU.

    A returning agent's KV is kept by *leases* (see ``lease_table``): a hard lease
    is a tree lock, so its path is never an eviction candidate and never counted
    as free by admission; no priority rule is needed for it. A soft lease (one
    that did not fit under ``max_leased_fraction``) is not locked; this strategy
    evicts it after all unleased KV:

        priority = (1 if node is the tail of a live soft lease else 0,
                    node.last_access_time)

    Only the tail node is marked: its ancestors cannot become leaves while it
    holds KV, so the whole path is protected. Without a lease (expired, released,
    never leased) a node is ordered exactly like ``LRUStrategy``.

    With a host tier (HiCache, ``tier_aware``) SGLang calls the same method for GPU
    and host eviction, and the order is by what bringing the KV back costs
    (``host_tier.HostTier.eviction_key``): backed-up KV before KV without a host
    copy, and within each, unleased KV (LRU) before leased KV, latest expected
    return first.

    SGLang builds this object from ``--radix-eviction-policy-config`` (kwargs ->
    ``SessionTTLSettings``); the cache's lease manager is bound later by the
    plugin's hooks (``bind``), because the strategy exists before its cache.
    """

    def __init__(self, **config: Any) -> None:
        self.settings = SessionTTLSettings.from_policy_config(config)
        self.table = LeaseTable(self.settings.max_ttl_s)
        self.metrics = LeaseMetrics()
        self.manager: LeaseManager | None = None
        logger.info(
            "sglang_ext: session_ttl eviction policy active (%s)",
            self.settings.describe(),
        )

    def get_priority(self, node: Any) -> tuple:
        mgr = self.manager
        if mgr is not None and mgr.host.active:
            return mgr.host.eviction_key(node)
        return order.eviction_key(node.last_access_time, soft_leased=self.table.is_soft_node(node.id))

    def bind(self, cache: Any) -> LeaseManager:
        """The lease manager of ``cache`` (a UnifiedRadixCache on the Python TreeCore)."""
        if self.manager is None or self.manager.tree.cache is not cache:
            from .tree import SGLangTree

            self.manager = LeaseManager(
                SGLangTree(cache), self.settings, self.table, self.metrics
            )
            logger.info("sglang_ext: session_ttl tiers: %s", self.manager.host.describe())
        return self.manager
