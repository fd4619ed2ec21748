"""Leases over SGLang's real host tier (HiCache on CPU, ``sidecar_tools.simulator.hicache_cpu``).

Real UnifiedRadixCache + HybridCacheController + host pool: write-through backup, GPU-leaf
demotion, host-leaf eviction, ``load_back`` / ``ready_to_load_host_cache`` / ``loading_check``
and ``PrefillAdder`` admission (``init_load_back``) are SGLang's code; the scheduler is a small
duck-typed object where a hook needs one.
"""

from __future__ import annotations

import logging
from array import array

import pytest

pytest.importorskip("sglang")

from sidecar_tools.simulator.hicache_cpu import TRANSFERS, attach_host_tier  # noqa: E402
from sglang_ext.wire import after_turn_state, lease_params  # noqa: E402

PROMPT, OUT = 50, 10  # one turn: 60 tokens of KV


def toks(base: int, n: int) -> list[int]:
    return list(range(base, base + n))


class Session:
    """One agent: prompt tokens + output of its last finished turn."""

    def __init__(self, name: str, base: int) -> None:
        self.name, self.prompt, self.output = name, toks(base, PROMPT), toks(base + 500, OUT)

    @property
    def history(self) -> list[int]:
        return self.prompt + self.output


class Scheduler:
    """What the plugin's scheduler hooks read (weak-referenceable, unlike SimpleNamespace)."""

    def __init__(self, cache) -> None:
        self.tree_cache = cache
        self.waiting_queue: list = []
        self.running_batch = Batch([])
        self.chunked_req = None
        self.max_running_requests = 64

    def is_fully_idle(self, ignore_waiting: bool = False) -> bool:
        return True


class Batch:
    def __init__(self, reqs, consumer: int = -1) -> None:
        self.reqs, self.hicache_consumer_index = reqs, consumer

    def is_empty(self) -> bool:
        return not self.reqs


@pytest.fixture
def tiered(kit, plugin):
    """make(gpu_tokens, host_tokens, **config) -> (cache, lease manager), lease clock at 0. The
    plugin's tier rules are on whatever room the host has (``defer_with_host_room`` off) unless a
    test says otherwise."""

    def make(gpu=512, host=1024, write_policy="write_through", **config):
        config = {"max_leased_fraction": 0.9, "prefetch": True, "defer_with_host_room": False, **config}
        cache = kit.make_cache(gpu, config=config)
        attach_host_tier(cache, host_tokens=host, write_policy=write_policy)
        mgr = plugin.manager_of(cache)
        mgr.on_tick(0.0)
        return cache, mgr

    return make


def finish_leased(kit, cache, mgr, s: Session, ttl: float, expect=None, spread=None):
    """kit.finish with the expectation keys in custom_params (what the sidecar sends)."""
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    req = kit.new_req(s.prompt, OUT, s.name)
    req.sampling_params.custom_params = lease_params(ttl, expect, spread)
    m = cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", s.prompt))))
    prefix = cache.path_device_indices(m.last_device_node)[: m.device_prefix_len]
    req.lock = cache.lock(m.last_device_node)
    req.last_node = m.last_device_node
    cache.req_to_token_pool.alloc([req])
    total = PROMPT + OUT
    new = kit.alloc_kv(cache, total - len(prefix))
    cache.req_to_token_pool.write((req.kv.req_pool_idx, slice(0, total)), kit.torch.cat([prefix, new]))
    req.output_ids = array("q", s.output)
    req.kv.kv_committed_len = req.kv.kv_allocated_len = total
    req.kv.cache_protected_len = req.prefix_len = len(prefix)
    req.finished_reason = kit.FINISH_LENGTH(length=OUT)
    kit.release_kv_cache(req, cache, checkpoint=True)
    cache.check_hicache_events()  # the write-through lands (synchronous on CPU)
    return req.last_node


def node_of(cache, node_id):
    try:
        return cache.tree_core.node_by_id(node_id)
    except KeyError:
        return None


def on_gpu(cache, node_id) -> bool:
    node = node_of(cache, node_id)
    return node is not None and not node.evicted


def on_host_only(cache, node_id) -> bool:
    node = node_of(cache, node_id)
    return node is not None and node.evicted and node.backuped


def evict_one_session(kit, cache) -> None:
    """Evict one session's worth of GPU KV (its output leaf, then its prompt node)."""
    cache.evict(kit.EvictParams(num_tokens=PROMPT + OUT))


def pass_prefill(plugin, sched, batch=None):
    """One scheduler iteration's HiCache poll (check_hicache_events: reaps finished copies),
    then a prefill pass through the plugin's AROUND hook; SGLang's pass built ``batch``."""
    sched.tree_cache.check_hicache_events()
    return plugin.get_new_batch_prefill_raw(lambda s, *a, **k: (batch, s.running_batch), sched)


def admit(kit, cache, s: Session, extra: int = 5):
    """SGLang's admission of the session's next request: match, then PrefillAdder.add_one_req
    (which calls init_load_back for a host hit)."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.schedule_policy import PrefillAdder

    req = kit.new_req(s.history + toks(9000, extra), 4, s.name)
    req.init_next_round_input(cache)
    device_hit, host_hit = req.prefix_len, req.host_hit_length
    adder = PrefillAdder(1, cache, cache.token_to_kv_pool_allocator, ScheduleBatch(reqs=[]), 0.7, 4096, None)
    adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
    assert req in adder.can_run_list
    return req, device_hit, host_hit


# ------------------------------------------------------------------------ tiers and order
def test_gpu_eviction_order_is_by_cost_of_return(kit, plugin, tiered):
    """Backed-up KV goes before KV with no host copy; unleased (LRU) before leased; among
    leased, the session expected back latest first. LRU would go by access time."""
    cache, mgr = tiered(gpu=512, host=190)  # room for three backups, not four
    soon, late, nobody = Session("soon", 1000), Session("late", 2000), Session("nobody", 3000)
    unbacked = Session("unbacked", 4000)
    n_soon = finish_leased(kit, cache, mgr, soon, ttl=60, expect=5)
    n_late = finish_leased(kit, cache, mgr, late, ttl=60, expect=30)
    n_nobody = kit.finish(cache, None, nobody.prompt, nobody.output).last_node
    cache.check_hicache_events()
    n_unbacked = kit.finish(cache, None, unbacked.prompt, unbacked.output).last_node
    cache.check_hicache_events()
    assert [node_of(cache, n).backuped for n in (n_soon, n_late, n_nobody, n_unbacked)] == [
        True, True, True, False,
    ]
    mgr.on_tick(1.0)
    # Access order (LRU's): unbacked, nobody, late are refreshed after soon.
    for s in (unbacked, nobody, late):
        kit.cached_len(cache, s.history)
    assert mgr.table.get("soon").tier == mgr.table.get("late").tier == "soft"

    order = []
    for _ in range(4):
        alive = {n for n in (n_soon, n_late, n_nobody, n_unbacked) if on_gpu(cache, n)}
        evict_one_session(kit, cache)
        order += [n for n in alive if not on_gpu(cache, n)]
    assert order == [n_nobody, n_late, n_soon, n_unbacked]
    # Backed-up KV was demoted (still reloadable), the unbacked one dropped; leases kept.
    assert on_host_only(cache, n_soon) and on_host_only(cache, n_late)
    assert node_of(cache, n_unbacked) is None
    assert "soon" in mgr.table and "late" in mgr.table
    assert mgr.metrics.get("leased_demoted_tokens", tier="soft") == 2 * OUT  # the leased tails


def test_host_eviction_order_is_by_predicted_return(kit, plugin, tiered):
    """When host memory runs out, SGLang evicts host leaves in the strategy's order: KV no
    session expects back first, then the session expected back latest."""
    cache, mgr = tiered(gpu=512, host=190)
    soon, late, nobody = Session("soon", 1000), Session("late", 2000), Session("nobody", 3000)
    n_nobody = kit.finish(cache, "nobody", nobody.prompt, nobody.output).last_node  # oldest
    cache.check_hicache_events()
    n_late = finish_leased(kit, cache, mgr, late, ttl=60, expect=40)
    n_soon = finish_leased(kit, cache, mgr, soon, ttl=60, expect=20)
    for s in (nobody, late):
        kit.cached_len(cache, s.history)  # LRU would now evict soon, nobody, late
    mgr.on_tick(1.0)
    kit.evict_all(cache)  # everything demoted to host
    assert all(on_host_only(cache, n) for n in (n_nobody, n_late, n_soon))

    gone = []
    for _ in range(3):
        before = {n for n in (n_nobody, n_late, n_soon) if node_of(cache, n) is not None}
        cache.evict_host(PROMPT + OUT)  # SGLang's host eviction (a backup that finds host full)
        gone += [n for n in before if node_of(cache, n) is None]
    assert gone == [n_nobody, n_late, n_soon]
    # The leases went with their host copies (hooks: evict_host).
    assert len(mgr.table) == 0
    assert mgr.metrics.get("releases", reason="host_evicted") == 2


def test_lease_over_backed_up_kv_stays_soft_and_demotes(kit, plugin, tiered):
    cache, mgr = tiered(gpu=512, host=1024)
    a = Session("A", 1000)
    node = finish_leased(kit, cache, mgr, a, ttl=60, expect=10)
    lease = mgr.table.get("A")
    assert lease.tier == "soft" and cache.protected_size() == 0  # backed up: no lock
    assert mgr.hard_tokens() == 0
    kit.alloc_kv(cache, 512)  # a big prefill takes the whole GPU pool
    assert on_host_only(cache, node) and "A" in mgr.table  # demoted, lease kept
    assert mgr.metrics.get("leased_demoted_tokens", tier="soft") == OUT  # its tail node


def test_lease_over_kv_without_host_copy_locks_it(kit, plugin, tiered):
    cache, mgr = tiered(gpu=512, host=100)  # the host pool cannot take the second session
    finish_leased(kit, cache, mgr, Session("A", 1000), ttl=60, expect=10)
    node_b = finish_leased(kit, cache, mgr, Session("B", 2000), ttl=60, expect=10)
    assert not node_of(cache, node_b).backuped
    assert mgr.table.get("A").tier == "soft" and mgr.table.get("B").tier == "hard"
    assert cache.protected_size() == PROMPT + OUT
    kit.evict_all(cache)
    assert on_gpu(cache, node_b)  # a recompute avoided


def test_without_tier_awareness_leases_lock_as_before(kit, plugin, tiered):
    cache, mgr = tiered(gpu=512, host=1024, tier_aware=False)
    node = finish_leased(kit, cache, mgr, Session("A", 1000), ttl=60, expect=10)
    assert mgr.table.get("A").tier == "hard" and cache.protected_size() == PROMPT + OUT
    kit.evict_all(cache)
    assert on_gpu(cache, node)
    assert cache.tree_core.eviction_strategy.get_priority(node_of(cache, node))[0] in (0, 1)
    assert len(cache.tree_core.eviction_strategy.get_priority(node_of(cache, node))) == 2


def test_a_due_session_is_locked_then_released_when_overdue(kit, plugin, tiered):
    """Within a reload (+ margin) of its expected return a session's KV is locked on the GPU;
    once the return is overdue the lock goes and the KV may demote again."""
    cache, mgr = tiered(gpu=512, host=1024, reload_margin_s=0.1)
    node = finish_leased(kit, cache, mgr, Session("A", 1000), ttl=60, expect=2.0)
    mgr.on_tick(1.0)  # stamps: expected back at 3.0
    assert mgr.table.get("A").tier == "soft"
    mgr.on_tick(2.95)
    assert mgr.table.get("A").tier == "hard" and cache.protected_size() == PROMPT + OUT
    kit.evict_all(cache)
    assert on_gpu(cache, node)
    mgr.on_tick(3.2)
    assert mgr.table.get("A").tier == "soft" and cache.protected_size() == 0
    assert mgr.metrics.get("tier_changes", to="hard") == 1
    assert mgr.metrics.get("tier_changes", to="soft") == 1


def test_host_short_locks_a_due_backed_up_session_only_while_leased_kv_fills_the_host(kit, plugin, tiered):
    """``lock_due_backed_up = "host_short"`` on SGLang's real HiCache: while the host holds another
    GPU pool of copies beside the leased KV, a due session's backed-up KV stays evictable (a reload
    at worst), however full the host is of copies no lease covers (it evicts those first); once
    leased KV leaves less room than that, the same due session locks; when that lease ends, the lock
    goes and the lease stays."""
    cache, mgr = tiered(gpu=512, host=612, reload_margin_s=0.1, lock_due_backed_up="host_short")
    finish_leased(kit, cache, mgr, Session("A", 1000), ttl=60, expect=2.0)
    mgr.on_tick(1.0)
    mgr.on_tick(2.95)  # due, all on the GPU and backed up; 60 leased tokens: 552 >= 512 of room
    assert not mgr.host.host_is_short()
    assert mgr.table.get("A").tier == "soft" and cache.protected_size() == 0
    host = cache.cache_controller.mem_pool_host
    taken = host.alloc(host.available_size() - 8)  # copies of sessions that ended fill the host
    assert not mgr.host.host_is_short()
    host.free(taken)
    finish_leased(kit, cache, mgr, Session("B", 3000), ttl=60)  # 120 leased tokens: 492 < 512
    assert mgr.host.host_is_short()
    mgr.on_tick(2.96)
    assert mgr.table.get("A").tier == "hard" and cache.protected_size() >= PROMPT + OUT
    mgr.close("B")
    mgr.on_tick(2.97)  # room on host again: the lock goes, the lease stays
    assert mgr.table.get("A").tier == "soft" and cache.protected_size() == 0


class ChunkingScheduler(Scheduler):
    """A scheduler in the middle of a chunked prefill (SGLang continues it with a whole chunk)."""

    def __init__(self, cache, chunk: int) -> None:
        super().__init__(cache)
        self.chunked_req = object()
        self.chunked_prefill_size = chunk


def test_a_due_lease_is_not_locked_into_the_room_a_chunked_prefill_needs(kit, plugin, tiered):
    """Locking a due session's KV takes it out of what eviction can free; while a chunked prefill
    runs, the next chunk must still find room, so the lease stays soft (its KV may demote)."""
    cache, mgr = tiered(gpu=512, host=1024, reload_margin_s=0.1)
    finish_leased(kit, cache, mgr, Session("A", 1000), ttl=60, expect=2.0)
    held = kit.alloc_kv(cache, cache.token_to_kv_pool_allocator.available_size() - 20)  # running work
    sched = ChunkingScheduler(cache, chunk=100)  # 100 tokens: more than free (20) + A's KV minus A
    pass_prefill(plugin, sched)  # the scheduler is known to the plugin from here on
    mgr.on_tick(1.0)
    mgr.on_tick(2.95)  # due: without the chunk it would lock (test above)
    assert mgr.table.get("A").tier == "soft" and cache.protected_size() == 0
    sched.chunked_req = None  # the prefill finished: the due lease locks now
    mgr.on_tick(2.96)
    assert mgr.table.get("A").tier == "hard"
    cache.token_to_kv_pool_allocator.free(held)


def test_the_chunk_valve_releases_leases_before_a_chunk_would_run_out_of_memory(kit, plugin):
    """Hard leases that lock what a chunked prefill's next chunk would evict are released, least
    valuable first, until a chunk fits (SGLang would fail the allocation: out of memory)."""
    cache = kit.make_cache(512, config={"max_leased_fraction": 0.9})
    mgr = plugin.manager_of(cache)
    for i, name in enumerate("ABC"):  # 3 x 120 tokens leased and locked
        kit.finish(cache, name, toks(1000 * (i + 1), 100), toks(100 * (i + 1), 20), ttl=60.0)
    mgr.on_tick(0.0)
    held = kit.alloc_kv(cache, cache.token_to_kv_pool_allocator.available_size() - 10)
    assert mgr.tree.headroom_tokens() < 100
    sched = ChunkingScheduler(cache, chunk=100)
    pass_prefill(plugin, sched)
    assert mgr.tree.headroom_tokens() >= plugin.reserve_tokens(sched, mgr.tree) >= 100
    assert 1 <= mgr.metrics.get("pressure_releases", stage="chunk") < 3  # only what the chunk needs
    cache.token_to_kv_pool_allocator.free(held)


# ------------------------------------------------------------------------------- prefetch
def demoted_session(kit, cache, mgr, name="A", base=1000, expect=2.0, spread=None, gate=None):
    s = Session(name, base)
    node = finish_leased(kit, cache, mgr, s, ttl=60, expect=expect, spread=spread)
    if gate is not None:  # transfers held: let the write-through land
        gate.release()
        cache.check_hicache_events()
    mgr.on_tick(1.0)  # stamps the expected return at 1.0 + expect
    kit.evict_all(cache)
    assert on_host_only(cache, node)
    return s, node


def test_prefetch_loads_kv_back_before_the_request_which_then_hits_the_gpu(kit, plugin, tiered):
    cache, mgr = tiered(gpu=512, host=1024)
    s, node = demoted_session(kit, cache, mgr, expect=2.0)  # expected back at 3.0
    sched = Scheduler(cache)
    pass_prefill(plugin, sched)
    assert on_host_only(cache, node)  # not due yet
    mgr.on_tick(2.96)  # a reload (60 tokens) + 0.05 s margin before 3.0
    pass_prefill(plugin, sched)
    assert on_gpu(cache, node)
    assert mgr.table.get("A").tier == "hard"  # held for the return
    assert mgr.metrics.get("prefetches", outcome="issued") == 1
    assert mgr.metrics.get("prefetched_tokens") == PROMPT + OUT

    req, device_hit, host_hit = admit(kit, cache, s)
    assert (device_hit, host_hit) == (PROMPT + OUT, 0)  # cached from device
    assert req.host_loaded_length == 0
    assert mgr.metrics.get("returning_turns", kv="gpu") == 1
    assert mgr.metrics.get("prefetches", outcome="used") == 1
    assert mgr.metrics.get("critical_load_back_tokens") == 0
    assert mgr.snapshot()["returning_turns_on_gpu_share"] == 1.0


def test_without_prefetch_the_return_loads_on_its_critical_path(kit, plugin, tiered):
    cache, mgr = tiered(gpu=512, host=1024, prefetch=False)
    s, node = demoted_session(kit, cache, mgr, expect=2.0)
    mgr.on_tick(2.96)
    pass_prefill(plugin, Scheduler(cache))
    assert on_host_only(cache, node)
    req, device_hit, host_hit = admit(kit, cache, s)
    assert (device_hit, host_hit) == (0, PROMPT + OUT)
    assert req.host_loaded_length == PROMPT + OUT  # init_load_back at admission
    assert mgr.metrics.get("critical_load_back_tokens") == PROMPT + OUT
    assert mgr.metrics.get("returning_turns", kv="host") == 1
    assert mgr.snapshot()["returning_turns_on_gpu_share"] == 0.0


@pytest.mark.parametrize("other_expect, issued", [(4.0, False), (9.0, True)])
def test_prefetch_evicts_only_kv_expected_back_later(kit, plugin, tiered, other_expect, issued):
    """The GPU is full; the only evictable KV belongs to session B. A's prefetch may take it
    only if B is expected back later than A."""
    cache, mgr = tiered(gpu=160, host=1024)
    # A: expected back at 1.0 + 4.0 = 5.0, early by up to 2 s: its prefetch is due from ~2.95.
    a, node_a = demoted_session(kit, cache, mgr, expect=4.0, spread=2.0)
    node_b = finish_leased(kit, cache, mgr, Session("B", 2000), ttl=60, expect=other_expect - 1.0)
    held = kit.alloc_kv(cache, cache.token_to_kv_pool_allocator.available_size())  # a running request
    mgr.on_tick(1.0)  # stamps B: expected back at other_expect
    assert mgr.table.get("B").tier == "soft" and on_gpu(cache, node_b)
    mgr.on_tick(3.0)
    pass_prefill(plugin, Scheduler(cache))
    assert on_gpu(cache, node_a) is issued
    assert on_gpu(cache, node_b) is not issued  # B demoted to make room, or kept
    assert mgr.metrics.get("prefetches", outcome="issued") == int(issued)
    assert mgr.metrics.get("prefetch_skips", reason="room") == int(not issued)
    cache.token_to_kv_pool_allocator.free(held)


def test_unused_prefetch_is_released_and_counted_wasted(kit, plugin, tiered):
    cache, mgr = tiered(gpu=512, host=1024)
    s, node = demoted_session(kit, cache, mgr, expect=2.0)
    mgr.on_tick(2.96)
    pass_prefill(plugin, Scheduler(cache))
    assert on_gpu(cache, node) and cache.protected_size() == PROMPT + OUT
    cache.check_hicache_events()  # the next iteration reaps the landed load (its own lock)
    mgr.on_tick(3.5)  # the session is overdue: the hold is released
    assert mgr.table.get("A").tier == "soft" and cache.protected_size() == 0
    assert mgr.metrics.get("prefetches", outcome="wasted") == 0
    kit.alloc_kv(cache, 512)  # pressure demotes the prefetched KV again
    assert on_host_only(cache, node)
    assert mgr.metrics.get("prefetches", outcome="wasted") == 1
    assert mgr.metrics.get("prefetches", outcome="used") == 0


def test_a_batch_that_matched_a_landing_prefetch_waits_for_it(kit, plugin, tiered):
    """While the prefetch's copy is in flight the node is already matchable on the GPU; the batch
    of the request that matched it gets the load's consumer index, so its forward waits."""
    with TRANSFERS.hold() as gate:
        cache, mgr = tiered(gpu=512, host=1024)
        s, node = demoted_session(kit, cache, mgr, expect=2.0, gate=gate)
        mgr.on_tick(2.96)
        sched = Scheduler(cache)
        pass_prefill(plugin, sched)
        assert node in cache.ongoing_load_back  # the copy is in flight
        producer = cache.cache_controller.layer_done_counter.producer_index
        assert producer >= 0 and not cache.is_load_back_event_done(producer)

        req = kit.new_req(s.history + toks(9000, 5), 4, "A")
        req.init_next_round_input(cache)
        assert req.prefix_len == PROMPT + OUT  # matched while the copy is landing
        other = kit.new_req(toks(7000, 20), 4, "other")
        other.init_next_round_input(cache)
        unrelated, returning = Batch([other]), Batch([req])
        pass_prefill(plugin, sched, unrelated)
        pass_prefill(plugin, sched, returning)
        assert unrelated.hicache_consumer_index == -1
        assert returning.hicache_consumer_index == producer

        cache.check_hicache_events()
        assert node in cache.ongoing_load_back  # not reaped before the copy lands
        gate.release()
        cache.check_hicache_events()
        assert node not in cache.ongoing_load_back
        later = Batch([req])
        pass_prefill(plugin, sched, later)
        assert later.hicache_consumer_index == -1  # landed: nothing to wait for


# ----------------------------------------------------------------------- after-turn channel
def set_state(plugin, cache, body: dict):
    """POST /set_internal_state: SGLang's request schema, then its controller (hooked)."""
    from pydantic import TypeAdapter
    from sglang.srt.managers.io_struct import SetInternalStateReq
    from sglang.srt.managers.scheduler_components.internal_state import (
        SchedulerInternalStateController,
    )

    req = TypeAdapter(SetInternalStateReq).validate_python(body)
    controller = SchedulerInternalStateController(Scheduler(cache), record_step_time=False)
    return controller.set_internal_state(req).updated


def test_after_turn_channel_updates_the_expected_return(kit, plugin, tiered):
    cache, mgr = tiered(gpu=512, host=1024)
    finish_leased(kit, cache, mgr, Session("A", 1000), ttl=60)  # no expectation with the request
    mgr.on_tick(1.0)
    assert mgr.table.get("A").expected_back(1.0) is None
    assert set_state(plugin, cache, after_turn_state("A", expected_back_s=7.0, spread_s=1.0))
    mgr.on_tick(1.5)
    lease = mgr.table.get("A")
    assert (lease.expected_at, lease.spread_s) == (8.5, 1.0)
    assert set_state(plugin, cache, after_turn_state("A", ttl_s=5.0))
    mgr.on_tick(2.0)
    assert mgr.table.get("A").expires_at == 7.0
    assert set_state(plugin, cache, after_turn_state("nobody", ttl_s=5.0))  # no lease: ignored
    assert mgr.metrics.get("after_turn_updates", result="no_lease") == 1
    assert set_state(plugin, cache, after_turn_state("A", ttl_s=0))  # the reply had no tool call
    assert "A" not in mgr.table and mgr.metrics.get("releases", reason="ended") == 1


def test_after_turn_channel_keeps_sglangs_refusals(kit, plugin, tiered):
    cache, mgr = tiered(gpu=512, host=1024)
    finish_leased(kit, cache, mgr, Session("A", 1000), ttl=60)
    mgr.on_tick(1.0)
    plugin_key = after_turn_state("A", expected_back_s=7.0)["server_args"]
    # An unknown key is refused as before, and the request applies nothing.
    assert not set_state(plugin, cache, {"server_args": {"no_such_knob": 1}})
    assert not set_state(plugin, cache, {"server_args": {**plugin_key, "no_such_knob": 1}})
    assert not set_state(plugin, cache, {"server_args": {"sglang_ext:bogus:A": 1}})
    assert not set_state(plugin, cache, {"server_args": {"sglang_ext:expect:A": -1}})
    mgr.on_tick(1.5)
    assert mgr.table.get("A").expected_back(1.5) is None
    # A key SGLang knows still goes through, next to ours.
    assert set_state(plugin, cache, {"server_args": {**plugin_key, "pp_max_micro_batch_size": 64}})
    mgr.on_tick(2.0)
    assert mgr.table.get("A").expected_at == 9.0
    # SGLang's schema admits only numbers.
    with pytest.raises(Exception):
        set_state(plugin, cache, {"server_args": {"sglang_ext:expect:A": "soon"}})


# ------------------------------------------------------------------------------ reporting
def test_info_line_and_server_info_name_the_tiers(kit, plugin, caplog):
    caplog.set_level(logging.INFO, logger="sglang_ext")
    cache = kit.make_cache(512)
    attach_host_tier(cache, host_tokens=1024)
    line = "sglang_ext: session_ttl tiers: GPU 512 tokens, host 1025 tokens (write_through), storage none"
    assert caplog.text.count(line) == 1
    snap = plugin.manager_of(cache).snapshot()
    assert snap["tiers"].startswith("GPU 512 tokens, host 1025 tokens")
    assert "prefetch off" in snap["tiers"]  # the default: a reload at admission is cheaper than a wrong guess
    assert snap["tier_tokens"] == {"gpu": 512, "host": 1025}  # what the sidecar admits against
    plain = kit.make_cache(512)
    assert plugin.manager_of(plain).snapshot()["tiers"] == "GPU 512 tokens; no host tier"
    assert plugin.manager_of(plain).snapshot()["tier_tokens"] == {"gpu": 512, "host": 0}


def test_without_a_host_tier_expectations_change_nothing(kit, plugin):
    """No HiCache: a lease is a lock as before, eviction keys are the plain (soft, LRU) pair,
    and the prefill pass never loads anything."""
    cache = kit.make_cache(512, config={"max_leased_fraction": 0.9})
    mgr = plugin.manager_of(cache)
    mgr.on_tick(0.0)
    node = finish_leased(kit, cache, mgr, Session("A", 1000), ttl=60, expect=0.01)
    mgr.on_tick(1.0)
    assert not mgr.host.active
    assert mgr.table.get("A").tier == "hard" and cache.protected_size() == PROMPT + OUT
    assert mgr.metrics.total("tier_changes") == 0
    assert len(cache.tree_core.eviction_strategy.get_priority(node_of(cache, node))) == 2


@pytest.mark.parametrize("defer", [True, False])
def test_while_the_plugin_steps_aside_queued_prefixes_are_kept_recent_as_sglang_does_for_lru(kit, plugin, tiered, defer):
    """SGLang touches the queued requests' cached prefixes every 32nd pass (lru only), so LRU evicts
    idle KV before the KV a queued request is about to use. While the plugin steps aside (host with
    room, ``defer_with_host_room``) it does the same on the same pass counter: the oldest history,
    continued by a queued request, outlives a newer idle one under pressure. Under its own rules
    (``defer_with_host_room`` off) nothing is touched and the older history goes first."""
    from types import SimpleNamespace

    from sglang_ext import hooks

    cache, mgr = tiered(gpu=512, host=2048, defer_with_host_room=defer)
    queued_history, idle = list(range(1000, 1100)), list(range(3000, 3100))
    kit.finish(cache, None, queued_history, list(range(1900, 1920)))
    kit.finish(cache, None, idle, list(range(3900, 3920)))
    cache.check_hicache_events()  # the write-through lands
    mgr.on_tick(0.1)
    assert mgr.host.deferring is defer
    waiting = kit.new_req(queued_history + list(range(1900, 1920)) + list(range(5000, 5010)), 5)
    policy = SimpleNamespace(tree_cache=cache, _waiting_prefix_refresh_calls=0)
    hooks.touch_waiting_prefixes(None, policy, None, [waiting])
    assert policy._waiting_prefix_refresh_calls == (1 if defer else 0)
    kit.alloc_kv(cache, 512 - 240 + 100)  # forces 100 tokens off the GPU
    kept, lost = (queued_history, idle) if defer else (idle, queued_history)
    assert kit.cached_len(cache, kept) == 100 and kit.cached_len(cache, lost) == 0
