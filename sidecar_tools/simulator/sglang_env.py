"""Everything that imports SGLang: the one-time setup, the real cache on CPU pools, the plugin's hooks.

Importing this module does not import sglang; ``setup()`` does (about 6-8 s on a laptop).
What it does, once per process:

* publishes default ServerArgs (the request-finish and admission code reads them, as in
  SGLang's own CPU tests);
* for ``session_ttl``: loads the ``sglang_ext`` plugin through SGLang's real plugin mechanism
  (``load_plugins()``, entry point group ``sglang.srt.plugins``, whitelisted with
  ``SGLANG_PLUGINS`` so unrelated plugins stay out), or, when the package's entry point is not
  installed, by calling ``sglang_ext.plugin.register()`` and applying the hooks itself.
"""

from __future__ import annotations

import logging
import os
import types
import warnings
from typing import Any

log = logging.getLogger(__name__)

PLUGIN_POLICY = "session_ttl"
BUILTIN_POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru", "tlru")

_env: types.SimpleNamespace | None = None
_plugin_loaded: str | None = None


def setup() -> types.SimpleNamespace:
    """Import the SGLang pieces the engine uses (namespace of classes and functions)."""
    global _env
    if _env is not None:
        return _env
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        from sglang.srt.managers import io_struct, schedule_batch, schedule_policy
        from sglang.srt.managers.schedule_batch import split_cached_prefix_by_tier
        from sglang.srt.managers.scheduler_components import new_token_ratio_tracker
        from sglang.srt.mem_cache import (
            allocation,
            allocator,
            cache_init_params,
            common,
            memory_pool,
            unified_radix_cache,
        )
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey
        from sglang.srt.mem_cache.unified_cache import component_type
        from sglang.srt.sampling import sampling_params
        from sglang.srt.server_args import (
            ServerArgs,
            set_global_server_args_for_scheduler,
        )
        from sglang.srt.speculative import spec_info
        from sglang.utils import TypeBasedDispatcher

    env = types.SimpleNamespace(
        torch=torch,
        CloseSessionReqInput=io_struct.CloseSessionReqInput,
        SetInternalStateReq=io_struct.SetInternalStateReq,
        SetInternalStateReqOutput=io_struct.SetInternalStateReqOutput,
        TypeBasedDispatcher=TypeBasedDispatcher,
        Req=schedule_batch.Req,
        ScheduleBatch=schedule_batch.ScheduleBatch,
        FINISH_ABORT=schedule_batch.FINISH_ABORT,
        FINISH_LENGTH=schedule_batch.FINISH_LENGTH,
        release_req=schedule_batch.release_req,
        split_cached_prefix_by_tier=split_cached_prefix_by_tier,
        PrefillAdder=schedule_policy.PrefillAdder,
        AddReqResult=schedule_policy.AddReqResult,
        CLIP_MAX_NEW_TOKENS=schedule_policy.CLIP_MAX_NEW_TOKENS,
        NewTokenRatioTracker=new_token_ratio_tracker.NewTokenRatioTracker,
        alloc_req_slots=allocation.alloc_req_slots,
        alloc_token_slots=allocation.alloc_token_slots,
        TokenToKVPoolAllocator=allocator.TokenToKVPoolAllocator,
        CacheInitParams=cache_init_params.CacheInitParams,
        checkpoint_kv_cache=common.checkpoint_kv_cache,
        release_kv_cache=common.release_kv_cache,
        touch_waiting_prefix=common.touch_waiting_prefix,
        MHATokenToKVPool=memory_pool.MHATokenToKVPool,
        ReqToTokenPool=memory_pool.ReqToTokenPool,
        ComponentType=component_type.ComponentType,
        UnifiedRadixCache=unified_radix_cache.UnifiedRadixCache,
        RadixKey=RadixKey,
        MatchPrefixParams=MatchPrefixParams,
        SamplingParams=sampling_params.SamplingParams,
        SpeculativeAlgorithm=spec_info.SpeculativeAlgorithm,
    )
    # What SGLang's own CPU tests do: the finish/admission path reads the published namespaces.
    set_global_server_args_for_scheduler(ServerArgs(model_path="dummy", pp_max_micro_batch_size=64))
    _env = env
    return _env


def load_plugin() -> str:
    """Make ``--radix-eviction-policy session_ttl`` available; returns how it was loaded."""
    global _plugin_loaded
    if _plugin_loaded:
        return _plugin_loaded
    setup()
    from sglang.srt.mem_cache import utils as mem_cache_utils

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import sglang.srt.managers.scheduler  # noqa: F401  (hook targets resolve against it)
        from sglang.srt.plugins import load_plugins

        previous = os.environ.get("SGLANG_PLUGINS")
        if previous is None:
            os.environ["SGLANG_PLUGINS"] = PLUGIN_POLICY
        try:
            load_plugins()
        finally:
            if previous is None:
                os.environ.pop("SGLANG_PLUGINS", None)
    how = "sglang load_plugins() (entry point sglang.srt.plugins)"
    if PLUGIN_POLICY not in mem_cache_utils._EVICTION_POLICY_FACTORIES:
        from sglang.srt.plugins.hook_registry import HookRegistry

        from sglang_ext.plugin import register

        register()
        HookRegistry.apply_hooks()
        how = "sglang_ext.plugin.register() (entry point not installed)"
    if PLUGIN_POLICY not in mem_cache_utils._EVICTION_POLICY_FACTORIES:
        raise RuntimeError("the session_ttl plugin did not register its eviction policy")
    log.info("simulator: session_ttl plugin loaded via %s", how)
    _plugin_loaded = how
    return how


def plugin_hooks() -> types.ModuleType:
    """The plugin's hook functions (``sglang_ext.hooks``), for a scheduler that calls them where
    SGLang's hooked methods would; each one is a no-op for a cache whose policy is not session_ttl."""
    setup()
    from sglang_ext import hooks

    return hooks


def lease_manager(cache: Any) -> Any:
    """The plugin's lease manager of ``cache`` (None unless its policy is session_ttl)."""
    if _plugin_loaded is None:
        return None
    return plugin_hooks().manager_of(cache)


def build_cache(kv_tokens: int, policy: str, policy_config: dict | None, *, max_running_requests: int,
                max_context_len: int, page_size: int = 1, session_radix_cache: bool = False) -> tuple[Any, Any, Any]:
    """(UnifiedRadixCache, req_to_token_pool, allocator) on CPU: a real token pool of
    ``kv_tokens`` slots, each one tiny (1 head x 1 dim x 1 layer), Python TreeCore (as on the
    H200 host, where the Rust core was not usable). ``session_radix_cache`` is SGLang's
    ``--enable-session-radix-cache`` (session-referenced KV evicted last)."""
    env = setup()
    name = policy.lower()
    if name == PLUGIN_POLICY:
        load_plugin()
    elif name not in BUILTIN_POLICIES:
        from sglang.srt.mem_cache import utils as mem_cache_utils

        if name not in mem_cache_utils._EVICTION_POLICY_FACTORIES:
            raise ValueError(f"unknown eviction policy {policy!r}; known: {list(BUILTIN_POLICIES) + [PLUGIN_POLICY]}")
    torch = env.torch
    req_pool = env.ReqToTokenPool(size=max_running_requests + 2, max_context_len=max_context_len + 8,
                                  device="cpu", enable_memory_saver=False)
    kv_pool = env.MHATokenToKVPool(size=kv_tokens, page_size=page_size, dtype=torch.bfloat16, head_num=1,
                                   head_dim=1, layer_num=1, device="cpu", enable_memory_saver=False)
    alloc = env.TokenToKVPoolAllocator(size=kv_tokens, dtype=torch.bfloat16, device="cpu", kvcache=kv_pool,
                                       need_sort=False)
    params = env.CacheInitParams(
        disable=False, req_to_token_pool=req_pool, token_to_kv_pool_allocator=alloc, page_size=page_size,
        tree_components=(env.ComponentType.FULL,), eviction_policy=name,
        eviction_policy_config=policy_config or None, tree_core_backend="python",
        enable_session_radix_cache=session_radix_cache,
    )
    return env.UnifiedRadixCache(params), req_pool, alloc


def host_tier_metrics(cache: Any) -> Any:
    """Give ``cache`` SGLang's own ``RadixCacheMetricsCollector`` (what ``--enable-metrics`` gives a
    radix cache: load-back, backup, dropped and evicted tokens, their bytes and durations, with
    SGLang's names and labels), on a Prometheus registry of its own; returns the registry.
    ``prometheus_client``'s default registry is process-wide and refuses a second engine's series;
    the collector's class-level DI hooks (``_counter_cls`` ...) exist for such a backend."""
    import functools

    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from sglang.srt.observability.metrics_collector import RadixCacheMetricsCollector, radix_cache_metric_labels

    registry = CollectorRegistry()

    class PrivateRegistryCollector(RadixCacheMetricsCollector):
        _counter_cls = functools.partial(Counter, registry=registry)
        _gauge_cls = functools.partial(Gauge, registry=registry)
        _histogram_cls = functools.partial(Histogram, registry=registry)

    rank = types.SimpleNamespace(tp_rank=0, pp_rank=0)  # one GPU, no DP attention
    labels = radix_cache_metric_labels(type(cache).__name__, rank, False)
    cache.metrics_collector = PrivateRegistryCollector(labels=labels)
    return registry


def hicache_server_args(enabled: bool, ratio: float | None, size_gb: float, write_policy: str) -> dict[str, Any]:
    """The HiCache fields of SGLang's ``/server_info`` (``ServerArgs.resolved_dict()`` and the
    scheduler's ``hicache_object_layout``) for these
    flags: SGLang's own defaults for the rest, and its resolution of the ratio
    (``hicache_hook.handle_hicache_ratio_default``: an unset ratio is 2.0; an explicit ratio or
    size turns host-memory auto-sizing off)."""
    setup()
    from sglang.srt.mem_cache.hicache_storage import disabled_l3_layout
    from sglang.srt.server_args import ServerArgs

    given: dict[str, Any] = {"enable_hierarchical_cache": enabled, "hicache_write_policy": write_policy}
    if ratio is not None:
        given["hicache_ratio"] = float(ratio)
    if size_gb:
        given["hicache_size"] = size_gb
    resolved = ServerArgs(model_path="dummy", **given).resolved_dict()
    out = {k: v for k, v in resolved.items() if k.startswith("hicache_") or k == "enable_hierarchical_cache"}
    if out.get("hicache_ratio") is None:
        out["hicache_ratio"] = 2.0
    if ratio is not None or size_gb:
        out["hicache_host_memory_fraction"] = None
    # Scheduler._hicache_l3_layout, part of the scheduler info /server_info carries (no L3 storage here)
    reason = "Mooncake storage is not attached" if enabled else "Hierarchical cache is disabled"
    out["hicache_object_layout"] = disabled_l3_layout(reason, page_size=1)
    return out
