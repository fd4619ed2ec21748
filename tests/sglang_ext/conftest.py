"""Fixtures for the sglang_ext plugin tests (CPU, real SGLang 0.5.23 objects).

``plugin`` loads the plugin once per session through SGLang's real
``load_plugins()`` (the package must be installed: ``pip install -e . --no-deps``).
``kit`` builds real UnifiedRadixCaches on CPU pools and runs real request
lifecycles (``Req`` -> ``release_kv_cache``); ``make_engine`` (engine.py-like
helper below) drives SGLang's real ``Scheduler._get_new_batch_prefill_raw`` with
a stand-in scheduler object. sglang is imported lazily so that a sidecar-only
environment can still collect this directory (the test modules skip).
"""

from __future__ import annotations

import os
import types
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


# ----------------------------------------------------------------- engine stand-in
class _StubBatch:
    """Stands in for the ScheduleBatch that a prefill pass builds (no tensors)."""

    def __init__(self, reqs, chunked_req=None):
        self.reqs = reqs
        self.chunked_req = chunked_req
        self.return_logprob = False
        self.input_embeds = None

    @classmethod
    def init_new(cls, reqs, *args, chunked_req=None, **kwargs):
        return cls(list(reqs), chunked_req)

    def prepare_for_extend(self):
        pass


class MiniEngine:
    """A stand-in Scheduler that runs SGLang's real admission code.

    ``_get_new_batch_prefill_raw`` and ``is_fully_idle`` are the real (plugin-
    hooked) Scheduler methods bound to this object; PrefillAdder, PrefillBudget,
    SchedulePolicy, the cache, its locks and eviction are real. What is simulated:
    the forward pass (KV slots are allocated the way prepare_for_extend/decode
    would, output tokens are made up) and retraction (SGLang's release_req, then
    re-queue). ``valve=False`` calls the unhooked admission method instead.
    """

    def __init__(self, kit: Kit, cache, valve: bool = True, max_running: int = 64):
        import torch
        from sglang.srt.disaggregation.utils import DisaggregationMode
        from sglang.srt.managers import scheduler as sched_mod
        from sglang.srt.managers.schedule_batch import ScheduleBatch, release_req
        from sglang.srt.managers.schedule_policy import PrefillAdder, SchedulePolicy
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        S = sched_mod.Scheduler
        self.kit, self.torch, self.cache = kit, torch, cache
        self.ScheduleBatch, self.release_req = ScheduleBatch, release_req
        self.SpeculativeAlgorithm = SpeculativeAlgorithm
        raw = S._get_new_batch_prefill_raw
        if not valve:
            raw = raw.__wrapped__  # the method as SGLang ships it
        self._get_new_batch_prefill_raw = types.MethodType(raw, self)
        self.is_fully_idle = types.MethodType(S.is_fully_idle, self)
        self._pp_microbatches_drained = types.MethodType(
            S._pp_microbatches_drained, self
        )
        self.get_num_allocatable_reqs = types.MethodType(
            S.get_num_allocatable_reqs, self
        )
        self.get_prefill_adder_class = lambda: PrefillAdder
        self._add_request_to_queue = lambda req, is_retracted=False: (
            self.waiting_queue.append(req)
        )

        self.tree_cache = cache
        self.req_to_token_pool = cache.req_to_token_pool
        self.token_to_kv_pool_allocator = cache.token_to_kv_pool_allocator
        self.policy = SchedulePolicy("fcfs", cache, False, False, False)
        self.waiting_queue: list[Any] = []
        self.running_batch = ScheduleBatch(reqs=[], batch_is_full=False)
        self.chunked_req = None
        self.last_batch = None
        self.result_queue: list[Any] = []
        self.enable_overlap = False
        self._engine_paused = False
        self.disaggregation_mode = DisaggregationMode.NULL
        ns = types.SimpleNamespace
        self.grammar_manager = ns(has_waiting_grammars=lambda: False, grammar_queue=[])
        self.dllm_manager = ns(any_staging_reqs=lambda: False)
        self.beam_coordinator = ns(pending_member_rows=lambda batch: 0)
        self.tp_worker = ns(
            model_runner=ns(attn_backend=object(), prefill_aware_swa=False)
        )
        self.new_token_ratio_tracker = ns(current=0.7)
        self.load_inquirer = ns(_get_num_pending_tokens=lambda chunk_deduct=0: 0)
        self.enable_priority_preemption = self.enable_priority_scheduling = False
        self.is_hybrid_swa = self.is_mixed_chunk = self.enable_lora = False
        self.enable_hicache_storage = self.enable_lmcache = self.enable_hisparse = False
        self.enable_hierarchical_cache = self.enable_unified_cache_external_linker = (
            False
        )
        self.min_free_slots_delayer = self.dynamic_chunk_sizer = self.dllm_config = None
        self.hisparse_coordinator = self.truncation_align_size = None
        self.chunked_prefill_size = None
        self.page_size = 1
        self.max_prefill_tokens = 1 << 20
        self.max_running_requests = max_running
        self.max_prefill_bs = 0
        self.priority_scheduling_preemption_threshold = 10
        self.processed_tokens_counter = 0
        self.model_config = None
        self.spec_algorithm = SpeculativeAlgorithm.NONE
        self._sched_mod = sched_mod
        self.finished: list[Any] = []
        self.retractions = 0
        self.prefill_passes = 0

    # -- one scheduler iteration: admit (real code) then one simulated forward step
    def step(self) -> dict[str, int]:
        admitted = self._prefill()
        decoded = 0 if admitted else self._decode()
        return {"admitted": admitted, "decoded": decoded}

    def _prefill(self) -> int:
        mod = self._sched_mod
        saved = (mod.ScheduleBatch, mod.PrefillStats)
        mod.ScheduleBatch = _StubBatch
        mod.PrefillStats = types.SimpleNamespace(from_adder=lambda *a, **k: None)
        try:
            batch, running = self._get_new_batch_prefill_raw(None, self.running_batch)
        finally:
            mod.ScheduleBatch, mod.PrefillStats = saved
        self.prefill_passes += 1
        self.running_batch = running
        if batch is None:
            return 0
        assert batch.chunked_req is None, "the harness does not chunk"
        for req in batch.reqs:
            self._run_extend(req)
        self._merge(batch.reqs)
        return len(batch.reqs)

    def _run_extend(self, req) -> None:
        """What prepare_for_extend + one forward do to the request's KV."""
        cache, pool = self.cache, self.req_to_token_pool
        if req.kv.req_pool_idx is None:
            pool.alloc([req])
        prefix = cache.prefix_device_indices(req)
        fill = len(req.full_untruncated_fill_ids)
        new = self.kit.alloc_kv(cache, fill - len(prefix))
        pool.write((req.kv.req_pool_idx, slice(0, fill)), self.torch.cat([prefix, new]))
        req.kv.kv_committed_len = req.kv.kv_allocated_len = fill
        req.kv.cache_protected_len = len(prefix)
        req.output_ids.append(7)  # first sampled token

    def _merge(self, reqs) -> None:
        running = [r for r in self.running_batch.reqs] + list(reqs)
        self.running_batch = self._batch(running)
        self._finish_done()

    def _batch(self, reqs):
        return self.ScheduleBatch(
            reqs=reqs,
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=self.token_to_kv_pool_allocator,
            tree_cache=self.cache,
            device="cpu",
            spec_algorithm=self.SpeculativeAlgorithm.NONE,
        )

    def _decode(self) -> int:
        batch = self.running_batch
        if batch.is_empty():
            return 0
        while not batch.check_decode_mem():  # real check (+ the plugin's decode valve)
            victim = batch.reqs[
                -1
            ]  # SGLang's order differs; any victim shows the effect
            assert len(batch.reqs) > 1, "decode OOM with a single request"
            self.release_req(
                req=victim,
                remaing_req_count=len(batch.reqs) - 1,
                req_to_token_pool=self.req_to_token_pool,
                token_to_kv_pool_allocator=self.token_to_kv_pool_allocator,
                tree_cache=self.cache,
                hisparse_coordinator=None,
            )
            victim.reset_for_retract()
            victim.output_ids = array("q")
            self.retractions += 1
            batch = self._batch(batch.reqs[:-1])
            self.waiting_queue.append(victim)
        kv = self.token_to_kv_pool_allocator.alloc(len(batch.reqs))
        assert kv is not None, "decode allocation failed after check_decode_mem"
        for i, req in enumerate(batch.reqs):
            pos = req.kv.kv_allocated_len
            self.req_to_token_pool.write(
                (req.kv.req_pool_idx, slice(pos, pos + 1)), kv[i : i + 1]
            )
            req.kv.kv_committed_len = req.kv.kv_allocated_len = pos + 1
            req.output_ids.append(7)
        self.running_batch = batch
        self._finish_done()
        return len(batch.reqs)

    def _finish_done(self) -> None:
        keep = []
        for req in self.running_batch.reqs:
            if len(req.output_ids) >= req.sampling_params.max_new_tokens:
                req.finished_reason = self.kit.FINISH_LENGTH(length=len(req.output_ids))
                self.kit.release_kv_cache(req, self.cache, checkpoint=True)
                self.finished.append(req)
            else:
                keep.append(req)
        self.running_batch = self._batch(keep)

    def idle(self) -> bool:
        return not self.waiting_queue and self.running_batch.is_empty()


@pytest.fixture
def make_engine(kit):
    def make(cache, **kwargs) -> MiniEngine:
        return MiniEngine(kit, cache, **kwargs)

    return make
