"""Fixtures for the sglang_ext plugin tests (CPU, real SGLang 0.5.23 objects).

``plugin`` loads the plugin once per session through SGLang's real
``load_plugins()`` (the package must be installed: ``pip install -e . --no-deps``).
``kit`` builds real UnifiedRadixCaches on CPU pools and runs real request
lifecycles (``Req`` -> ``release_kv_cache``) where no scheduler is needed;
``make_engine`` gives the simulator's ``SimEngine`` where one is (scheduler
hooks, valves, the lease clock). sglang is imported lazily so that a
sidecar-only environment can still collect this directory (the test modules skip).
"""

from __future__ import annotations

import os
from array import array
from typing import Any

import pytest

# Hook failures must fail tests instead of being logged and swallowed.
os.environ.setdefault("SGLANG_EXT_STRICT", "1")


@pytest.fixture(scope="session")
def plugin():
    """Load every ``sglang.srt.plugins`` entry point the way SGLang processes do."""
    pytest.importorskip("sglang")
    import sglang.srt.managers.scheduler  # noqa: F401  (the hooks patch it)
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    load_plugins()
    # The request-finish path reads published server args (what SGLang's tests do).
    set_global_server_args_for_scheduler(
        ServerArgs(model_path="dummy", pp_max_micro_batch_size=64)
    )
    import sglang_ext.hooks

    return sglang_ext.hooks


class Kit:
    """Real SGLang objects on CPU: pools, UnifiedRadixCache, request lifecycles."""

    def __init__(self) -> None:
        import torch
        from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH, Req
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.common import release_kv_cache
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
        from sglang.srt.sampling.sampling_params import SamplingParams

        self.torch = torch
        self.Req, self.FINISH_LENGTH, self.FINISH_ABORT = (
            Req,
            FINISH_LENGTH,
            FINISH_ABORT,
        )
        self.TokenToKVPoolAllocator = TokenToKVPoolAllocator
        self.MHATokenToKVPool, self.ReqToTokenPool = MHATokenToKVPool, ReqToTokenPool
        self.CacheInitParams, self.ComponentType = CacheInitParams, ComponentType
        self.UnifiedRadixCache, self.EvictParams = UnifiedRadixCache, EvictParams
        self.SamplingParams, self.release_kv_cache = SamplingParams, release_kv_cache
        self._rid = 0

    def make_cache(
        self,
        pool_tokens: int,
        policy: str = "session_ttl",
        config: dict[str, Any] | None = None,
        req_rows: int = 64,
        max_context: int = 4096,
        tree_core_backend: str | None = None,
    ):
        """A UnifiedRadixCache with a single FULL component on CPU pools.

        ``tree_core_backend`` is left unset for session_ttl so the plugin's
        tree-core selection is exercised; built-in policies use "python".
        """
        torch = self.torch
        req_pool = self.ReqToTokenPool(
            size=req_rows,
            max_context_len=max_context,
            device="cpu",
            enable_memory_saver=False,
        )
        kv_pool = self.MHATokenToKVPool(
            size=pool_tokens,
            page_size=1,
            dtype=torch.bfloat16,
            head_num=1,
            head_dim=4,
            layer_num=1,
            device="cpu",
            enable_memory_saver=False,
        )
        alloc = self.TokenToKVPoolAllocator(
            size=pool_tokens,
            dtype=torch.bfloat16,
            device="cpu",
            kvcache=kv_pool,
            need_sort=False,
        )
        if tree_core_backend is None and policy != "session_ttl":
            tree_core_backend = "python"
        params = self.CacheInitParams(
            disable=False,
            req_to_token_pool=req_pool,
            token_to_kv_pool_allocator=alloc,
            page_size=1,
            tree_components=(self.ComponentType.FULL,),
            eviction_policy=policy,
            eviction_policy_config=config,
            tree_core_backend=tree_core_backend,
        )
        return self.UnifiedRadixCache(params)

    def sampling(self, max_new_tokens: int, ttl: Any = None, **extra):
        custom = None if ttl is None else {"session_lease_ttl_s": ttl}
        sp = self.SamplingParams(
            max_new_tokens=max_new_tokens, custom_params=custom, **extra
        )
        sp.normalize(None)
        sp.verify(1 << 20)
        return sp

    def new_req(
        self, prompt: list[int], max_new_tokens: int, session_id=None, ttl=None, **extra
    ):
        self._rid += 1
        return self.Req(
            rid=f"r{self._rid}",
            origin_input_text="",
            origin_input_ids=array("q", prompt),
            sampling_params=self.sampling(max_new_tokens, ttl, **extra),
            session_id=session_id,
        )

    def finish(self, cache, session_id, prompt, output, ttl=None, abort=False):
        """Run one request to completion outside the scheduler: match its prefix,
        hold prompt+output KV, then release it the way a finished request is."""
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        req = self.new_req(prompt, len(output), session_id, ttl)
        m = cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", prompt))))
        prefix = cache.path_device_indices(m.last_device_node)[: m.device_prefix_len]
        req.lock = cache.lock(m.last_device_node)
        req.last_node = m.last_device_node
        pool = cache.req_to_token_pool
        pool.alloc([req])
        total = len(prompt) + len(output)
        new = self.alloc_kv(cache, total - len(prefix))
        pool.write(
            (req.kv.req_pool_idx, slice(0, total)), self.torch.cat([prefix, new])
        )
        req.output_ids = array("q", output)
        req.kv.kv_committed_len = req.kv.kv_allocated_len = total
        req.kv.cache_protected_len = len(prefix)
        req.prefix_len = len(prefix)
        req.finished_reason = (
            self.FINISH_ABORT("client went away")
            if abort
            else self.FINISH_LENGTH(length=len(output))
        )
        self.release_kv_cache(req, cache, checkpoint=True)
        return req

    def alloc_kv(self, cache, n: int):
        alloc = cache.token_to_kv_pool_allocator
        alloc.evict_to_free_tokens(cache, n)
        kv = alloc.alloc(n)
        assert kv is not None, f"KV pool out of memory allocating {n} tokens"
        return kv

    def evict_all(self, cache) -> int:
        return cache.evict(self.EvictParams(num_tokens=10**9)).num_tokens_evicted

    def alive(self, cache, node_id: int) -> bool:
        """Whether a node still holds device KV (without touching LRU times)."""
        try:
            return not cache.tree_core.node_by_id(node_id).evicted
        except KeyError:
            return False

    def cached_len(self, cache, tokens: list[int]) -> int:
        """Matched prefix length; note that matching refreshes LRU access times."""
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        return cache.match_prefix(
            MatchPrefixParams(key=RadixKey(array("q", tokens)))
        ).device_prefix_len


@pytest.fixture(scope="session")
def kit(plugin):
    return Kit()


# ------------------------------------------------------------------ scheduler
@pytest.fixture
def make_engine(plugin):
    """``make_engine(kv_tokens, **session_ttl config)`` -> the simulator's ``SimEngine`` on a
    session_ttl cache: SGLang's scheduler loop with the real PrefillAdder, ScheduleBatch and
    cache, calling the plugin's hooks where SGLang's hooked methods would (the one imitation of
    SGLang's Scheduler in this project); one decode step per ``step()``, virtual time."""
    from sidecar_tools.simulator.engine import SimEngine

    def make(kv_tokens: int, **config: Any) -> SimEngine:
        return SimEngine(kv_tokens=kv_tokens, policy="session_ttl", policy_config=config,
                         max_running_requests=64, context_length=4096, max_jump_steps=1)

    return make


class Requests:
    """SimRequests like ``Kit.new_req`` (EOS not ignored; the lease TTL travels as the sidecar
    sends it); the finished ones land in ``done``, in finishing order."""

    def __init__(self) -> None:
        self.done: list[Any] = []
        self._rid = 0

    def __call__(self, prompt, max_new_tokens: int, session_id=None, ttl=None):
        from sidecar_tools.simulator.engine import SimRequest

        self._rid += 1
        return SimRequest(
            rid=f"q{self._rid}",
            input_ids=list(prompt),
            max_new_tokens=max_new_tokens,
            session_id=session_id,
            ignore_eos=False,
            custom_params=None if ttl is None else {"session_lease_ttl_s": ttl},
            on_update=self._on_update,
        )

    def _on_update(self, sim) -> None:
        if sim.finished:
            self.done.append(sim)


@pytest.fixture
def requests():
    return Requests()


@pytest.fixture
def admit_step():
    """``admit_step(engine)``: one scheduler iteration (a prefill, else one decode step); how
    many queued requests it admitted (only admission takes requests out of the queue here;
    retracted ones rejoin it)."""

    def step(engine) -> int:
        queued = {id(r) for r in engine.waiting_queue}
        engine.step()
        return len(queued - {id(r) for r in engine.waiting_queue})

    return step
