"""Leases against SGLang's real UnifiedRadixCache (CPU pools, real request release)."""

from __future__ import annotations

import pytest

pytest.importorskip("sglang")


def toks(base: int, n: int):
    return list(range(base, base + n))


@pytest.fixture
def leased(kit, plugin):
    """A 512-token cache under session_ttl and its lease manager, clock at t=0."""
    cache = kit.make_cache(512, config={"max_leased_fraction": 0.5})
    mgr = plugin.manager_of(cache)
    mgr.on_tick(0.0)
    return cache, mgr


def test_no_lease_outlasts_max_ttl_whatever_the_request_or_the_update_asks(kit, plugin):
    cache = kit.make_cache(512, config={"max_ttl_s": 100.0})
    mgr = plugin.manager_of(cache)
    kit.finish(cache, "A", toks(1000, 100), toks(1900, 20), ttl=1e9)
    assert mgr.table.get("A").ttl_s == 100.0
    assert mgr.update_after_turn("A", ttl_s=1e9) and mgr.table.get("A").ttl_s == 100.0
    mgr.on_tick(5.0)
    assert mgr.table.get("A").expires_at == 105.0


def test_leased_session_survives_pressure_while_unleased_kv_goes_first(
    kit, plugin, leased
):
    cache, mgr = leased
    a = toks(1000, 100)  # leased, and the oldest
    kit.finish(cache, "A", a, toks(1900, 20), ttl=60)
    kit.finish(cache, "B", toks(2000, 100), toks(2900, 20))  # session without a lease
    kit.finish(cache, None, toks(3000, 100), toks(3900, 20))  # no session at all
    mgr.on_tick(1.0)
    assert cache.protected_size() == 120 and mgr.hard_tokens() == 120
    assert cache.evictable_size() == 240  # admission sees only B and C as reclaimable

    kit.alloc_kv(cache, 512 - 120)  # a big prefill needs every other token
    assert kit.cached_len(cache, a + toks(1900, 20)) == 120
    assert kit.cached_len(cache, toks(2000, 100)) == 0
    assert kit.cached_len(cache, toks(3000, 100)) == 0

    # The same sequence under plain LRU loses A first (it is the oldest).
    lru = kit.make_cache(512, policy="lru")
    kit.finish(lru, "A", a, toks(1900, 20), ttl=60)
    kit.finish(lru, "B", toks(2000, 100), toks(2900, 20))
    kit.alloc_kv(lru, 512 - 240 + 100)  # forces 100 tokens out
    assert kit.cached_len(lru, a) == 0 and kit.cached_len(lru, toks(2000, 100)) == 100


def test_admission_budget_does_not_count_leased_kv(kit, plugin, leased):
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.schedule_policy import PrefillAdder

    cache, mgr = leased
    kit.finish(cache, "A", toks(1000, 200), toks(1900, 50), ttl=5)
    budget = lambda: (
        PrefillAdder(
            1,
            cache,
            cache.token_to_kv_pool_allocator,
            ScheduleBatch(reqs=[]),
            0.7,
            4096,
            None,
        ).rem_total_tokens
    )
    assert budget() == 512 - 250
    mgr.on_tick(1.0)  # stamps the lease: expires at 6
    mgr.on_tick(6.0)
    assert budget() == 512  # expired: evictable again, so free for admission


def test_expiry_returns_the_session_to_lru_order(kit, plugin, leased):
    from sglang.srt.mem_cache.evict_policy import LRUStrategy

    cache, mgr = leased
    ra = kit.finish(cache, "A", toks(1000, 50), toks(1900, 10), ttl=5)  # oldest, leased
    rb = kit.finish(cache, "B", toks(2000, 50), toks(2900, 10))
    rc = kit.finish(cache, "C", toks(3000, 50), toks(3900, 10))
    a, b, c = ra.last_node, rb.last_node, rc.last_node  # each turn's output leaf
    mgr.on_tick(1.0)  # A expires at 6
    cache.evict(kit.EvictParams(num_tokens=10))  # one leaf: B's, the oldest unleased
    assert (kit.alive(cache, a), kit.alive(cache, b), kit.alive(cache, c)) == (
        True,
        False,
        True,
    )

    due = mgr.on_tick(6.0)
    assert [l.session_id for l in due] == ["A"]
    assert (
        mgr.metrics.get("expirations", tier="hard") == 1 and cache.protected_size() == 0
    )
    node = cache.tree_core.node_by_id(a)
    assert cache.tree_core.eviction_strategy.get_priority(node) == (
        0,
        LRUStrategy().get_priority(node),
    )
    cache.evict(kit.EvictParams(num_tokens=10))  # A is now simply the least recent
    assert (kit.alive(cache, a), kit.alive(cache, c)) == (False, True)


def test_renewal_end_abort_and_close(kit, plugin, leased):
    from types import SimpleNamespace

    from sglang.srt.managers.io_struct import CloseSessionReqInput
    from sglang.srt.managers.scheduler import Scheduler

    cache, mgr = leased
    t1 = toks(1000, 40) + toks(1900, 10)
    r1 = kit.finish(cache, "A", toks(1000, 40), toks(1900, 10), ttl=30)
    assert mgr.table.get("A").node_id == r1.last_node
    t2 = t1 + toks(5000, 30)
    r2 = kit.finish(cache, "A", t2, toks(5900, 10), ttl=30)  # next turn renews
    assert mgr.table.get("A").node_id == r2.last_node != r1.last_node
    assert cache.protected_size() == 90 and mgr.metrics.get("grants") == 2

    kit.finish(cache, "A", t2 + toks(5900, 10) + [1], [2, 3], ttl=30, abort=True)
    assert mgr.table.get("A").node_id == r2.last_node  # an aborted turn changes nothing

    kit.finish(cache, "A", toks(1000, 40), [4], ttl=0)  # ttl 0 ends the lease
    assert "A" not in mgr.table and cache.protected_size() == 0
    assert mgr.metrics.get("releases", reason="ended") == 1

    kit.finish(cache, "A", t2, toks(5900, 10), ttl=30)
    assert cache.protected_size() == 90

    class Sessions:  # SGLang's SessionController, as far as close_session uses it
        def __init__(self):
            self.closed = []

        def __contains__(self, sid):
            return False

        def close(self, req):
            self.closed.append(req.session_id)

    sessions = Sessions()
    fake = SimpleNamespace(
        tree_cache=cache, enable_session_radix_cache=False, session_controller=sessions
    )
    Scheduler.close_session(
        fake, CloseSessionReqInput(session_id="A")
    )  # real method, hooked
    assert (
        sessions.closed == ["A"]
        and "A" not in mgr.table
        and cache.protected_size() == 0
    )
    assert mgr.metrics.get("releases", reason="closed") == 1

    kit.finish(cache, "A", t2, toks(5900, 10), ttl=30)  # was in flight when closed
    assert "A" not in mgr.table
    plugin.handle_generate_request(fake, SimpleNamespace(session_id="A"))  # a new turn
    kit.finish(cache, "A", t2, toks(5900, 10), ttl=30)
    assert "A" in mgr.table


def test_lease_bound_holds_and_overflow_turns_soft(kit, plugin):
    cache = kit.make_cache(1000, config={"max_leased_fraction": 0.3})
    mgr = plugin.manager_of(cache)
    mgr.on_tick(0.0)
    system = toks(1, 50)  # shared by every session: counted once
    for i in range(6):
        kit.finish(
            cache,
            f"S{i}",
            system + toks(1000 * (i + 1), 60),
            toks(1000 * i + 500, 10),
            ttl=100,
        )
        assert mgr.hard_tokens() <= mgr.limit_tokens() == 300
        assert cache.protected_size() <= 300
    assert mgr.table.count("hard") == 3 and mgr.hard_tokens() == 50 + 3 * 70
    assert mgr.table.count("soft") == 3 and mgr.metrics.get("demotions") == 3
    soft = {l.session_id for l in mgr.table.leases("soft")}

    # Unleased KV goes first, even when it is the most recent.
    ru = kit.finish(cache, "U", toks(9000, 60), toks(9500, 10))
    soft_nodes = [l.node_id for l in mgr.table.leases("soft")]
    mgr.on_tick(1.0)
    cache.evict(kit.EvictParams(num_tokens=1))
    assert not kit.alive(cache, ru.last_node)
    assert all(kit.alive(cache, n) for n in soft_nodes)
    assert mgr.metrics.total("leased_evicted_tokens") == 0
    kit.evict_all(cache)
    assert kit.cached_len(cache, toks(9000, 60)) == 0
    assert not any(kit.alive(cache, n) for n in soft_nodes)
    # Then the soft leases: counted, and gone from the table; hard ones stay.
    assert mgr.metrics.get("leased_evicted_tokens", tier="soft") > 0
    assert mgr.metrics.get("leased_evicted_tokens", tier="hard") == 0
    assert not soft & {l.session_id for l in mgr.table.leases()}
    assert mgr.table.count("hard") == 3 and cache.protected_size() == 50 + 3 * 70


def test_without_soft_overflow_leases_over_the_bound_are_dropped(kit, plugin):
    cache = kit.make_cache(
        1000, config={"max_leased_fraction": 0.1, "soft_overflow": False}
    )
    mgr = plugin.manager_of(cache)
    for i in range(3):
        kit.finish(
            cache, f"S{i}", toks(1000 * (i + 1), 60), toks(1000 * i + 500, 10), ttl=100
        )
    assert mgr.table.count("soft") == 0 and mgr.table.count("hard") == 1
    assert mgr.hard_tokens() == 70 <= mgr.limit_tokens()


def test_pressure_release_takes_least_value_first(kit, plugin, leased):
    cache, mgr = leased
    kit.finish(cache, "far", toks(1000, 60), toks(1900, 10), ttl=500)  # 70 tok / 500 s
    kit.finish(cache, "near", toks(2000, 60), toks(2900, 10), ttl=10)  # 70 tok / 10 s
    kit.finish(cache, "queued", toks(3000, 60), toks(3900, 10), ttl=900)
    mgr.on_tick(1.0)
    before = cache.evictable_size()
    released, gained = mgr.release_for_pressure("prefill", 50, spare={"queued"})
    assert (released, gained) == (1, 70) and cache.evictable_size() == before + 70
    assert {s.session_id for s in mgr.table.leases()} == {"near", "queued"}
    released, gained = mgr.release_for_pressure("prefill", 100, spare={"queued"})
    assert released == 2 and len(mgr.table) == 0
    assert mgr.metrics.get("pressure_releases", stage="prefill") == 3


def test_pressure_release_skips_leases_that_free_nothing_unless_forced(
    kit, plugin, leased
):
    cache, mgr = leased
    kit.finish(cache, "A", toks(1000, 60), toks(1900, 10), ttl=50)
    kit.finish(cache, "B", toks(1000, 60), toks(1900, 10), ttl=50)  # same KV, same node
    assert mgr.table.get("A").node_id == mgr.table.get("B").node_id
    assert mgr.release_for_pressure("decode", 10) == (0, 0)
    assert mgr.release_for_pressure("prefill", 10, force=True) == (2, 70)


def test_flush_drops_every_lease(kit, plugin, leased):
    cache, mgr = leased
    kit.finish(cache, "A", toks(1000, 60), toks(1900, 10), ttl=50)
    kit.finish(cache, "B", toks(2000, 60), toks(2900, 10), ttl=50)
    cache.reset()  # what Scheduler.flush_cache does to the tree
    assert len(mgr.table) == 0 and mgr.hard_tokens() == 0
    assert mgr.metrics.get("releases", reason="flush") == 2
    cache.token_to_kv_pool_allocator.clear()
    cache.req_to_token_pool.clear()
    kit.finish(cache, "A", toks(1000, 60), toks(1900, 10), ttl=50)  # still works after
    assert cache.protected_size() == 70 and "A" in mgr.table

