"""Work-conserving leases over SGLang's host tier (issue 24 point 1).

The simulator's scheduler loop (``SimEngine``: SGLang's real PrefillAdder, ScheduleBatch and
UnifiedRadixCache with its real HiCache controller on CPU pools) with the plugin's hooks where
SGLang's Scheduler calls them. A lease whose KV is backed up on host must never keep a runnable
request waiting: losing that KV's GPU copy costs a reload, not a recompute.
"""

from __future__ import annotations

import pytest

pytest.importorskip("sglang")

from sglang_ext.wire import lease_params  # noqa: E402


def toks(base: int, n: int) -> list[int]:
    return list(range(base, base + n))


@pytest.fixture
def tiered_engine(plugin):
    """A SimEngine on a session_ttl cache with SGLang's host tier (``host_ratio`` x the GPU pool);
    the plugin's rules apply whatever room the host has (``defer_with_host_room`` off) unless a
    test says otherwise."""
    from sidecar_tools.simulator.engine import SimEngine
    from sidecar_tools.simulator.hicache_cpu import HostTierArgs

    def make(kv_tokens: int, host_ratio: float = 3, **config):
        return SimEngine(kv_tokens=kv_tokens, policy="session_ttl",
                         policy_config={"max_leased_fraction": 0.9, "defer_with_host_room": False, **config},
                         max_running_requests=64, context_length=4096, max_jump_steps=1,
                         host_tier=HostTierArgs(size_tokens=int(host_ratio * kv_tokens)))

    return make


def run_turn(engine, requests, prompt, out, session, ttl, expect=None, spread=0.0):
    """One finished turn of ``session`` with a lease (and an expected return), as the sidecar sends it."""
    req = requests(prompt, out, session)
    req.ignore_eos = True
    req.custom_params = lease_params(ttl, expect, spread)
    engine.submit(req)
    while not req.finished:
        assert engine.step() or engine.busy
    return req


def due_leases(engine, requests, plugin):
    """Two sessions leased hard: each is expected back at once (inside its prefetch window) and
    its KV is on the GPU, backed up on host."""
    mgr = plugin.manager_of(engine.cache)
    for i, name in enumerate("AB"):
        run_turn(engine, requests, toks(1000 * (i + 1), 100), 10, name, ttl=100, expect=5.0, spread=5.0)
    for _ in range(3):  # let the write-through land and the lease clock tick
        engine.advance_idle(engine.now + 0.1)
    assert mgr.table.count("hard") == 2
    for lease in mgr.table.leases():
        assert mgr.tree.path_state(lease.node_id).unbacked_tokens == 0  # backed up on host
    return mgr


def test_a_queued_request_is_admitted_at_once_when_backed_up_leased_kv_makes_its_room(
        plugin, tiered_engine, requests, admit_step):
    engine = tiered_engine(400)
    mgr = due_leases(engine, requests, plugin)
    running = requests(toks(5000, 20), 100)  # a long decode: it will not free KV soon
    running.ignore_eos = True
    engine.submit(running)
    assert admit_step(engine) == 1
    big = requests(toks(7000, 200), 10)  # fits only if the leased KV (2 x 110) may be evicted
    big.ignore_eos = True
    engine.submit(big)
    admitted = 0
    for _ in range(3):  # the pass that refuses it yields; the next one admits it
        admitted += admit_step(engine)
        if admitted:
            break
    assert admitted == 1 and not engine.waiting_queue
    assert any(r.rid == running.rid for r in engine.running_batch.reqs)  # while the other still runs
    assert mgr.metrics.get("yields", stage="prefill") >= 1
    assert mgr.metrics.get("blocked_passes", outcome="yielded") >= 1
    assert mgr.metrics.total("pressure_releases") == 0  # no lease ended: they yielded
    assert set(l.session_id for l in mgr.table.leases()) == {"A", "B"}  # still leased (soft)


def test_while_a_request_waits_for_room_no_lease_locks_it_again(plugin, tiered_engine, requests, admit_step):
    """A lease that yielded stays soft while a refused request still needs the room, even though
    its session is due (its prefetch window is open)."""
    engine = tiered_engine(400)
    mgr = due_leases(engine, requests, plugin)
    hog = requests(toks(5000, 100), 60)  # running work that holds most of the free KV
    hog.ignore_eos = True
    engine.submit(hog)
    assert admit_step(engine) == 1
    big = requests(toks(7000, 300), 10)  # more than free + all leased KV while hog runs
    big.ignore_eos = True
    engine.submit(big)
    for _ in range(5):
        assert admit_step(engine) == 0
    assert mgr.table.count("hard") == 0  # yielded, and not re-locked while big waits
    assert plugin.pass_state(mgr).blocked_need > 0


def test_without_a_host_tier_a_lease_still_holds_while_requests_run(plugin, make_engine, requests, admit_step):
    """Without a host tier, giving up leased KV costs a recompute: the request waits for running
    work as before (the idle valve releases leases only when nothing runs)."""
    engine = make_engine(400, max_leased_fraction=0.9)
    mgr = plugin.manager_of(engine.cache)
    mgr.on_tick(0.0)
    for i, name in enumerate("AB"):
        run_turn(engine, requests, toks(1000 * (i + 1), 100), 10, name, ttl=100)
    engine.advance_idle(engine.now + 0.1)
    running = requests(toks(5000, 20), 100)
    engine.submit(running)
    assert admit_step(engine) == 1
    engine.submit(requests(toks(7000, 200), 10))
    assert admit_step(engine) == 0
    assert mgr.table.count("hard") == 2 and mgr.metrics.total("yields") == 0


def test_a_refused_pass_says_when_leased_kv_is_locked_by_running_requests_anyway(
        plugin, tiered_engine, requests, admit_step):
    """Agents that share a history: while requests that read a leased session's whole KV run,
    unlocking the lease frees nothing; the refused pass is counted as ``in_use``, not yielded."""
    engine = tiered_engine(400)
    mgr = plugin.manager_of(engine.cache)
    histories = []
    for i, name in enumerate("AB"):
        done = run_turn(engine, requests, toks(1000 * (i + 1), 100), 10, name, ttl=100, expect=5.0, spread=5.0)
        histories.append(list(done.input_ids) + list(done.output_ids))
    for _ in range(3):  # let the write-through land and the lease clock tick
        engine.advance_idle(engine.now + 0.1)
    assert mgr.table.count("hard") == 2
    for i, history in enumerate(histories):  # another agent continues from each whole leased history
        reader = requests(history + toks(9000 + 100 * i, 10), 60)
        reader.ignore_eos = True
        engine.submit(reader)
    assert admit_step(engine) == 2
    big = requests(toks(7000, 200), 10)  # fits only once a reader finishes
    big.ignore_eos = True
    engine.submit(big)
    assert admit_step(engine) == 0
    assert mgr.metrics.get("blocked_passes", outcome="in_use") >= 1
    assert mgr.metrics.get("blocked_passes", outcome="yielded") == 0
    assert mgr.table.count("hard") == 2  # nothing to gain: the leases stay as they were


# ---- lock_due_backed_up = "host_short": a backed-up lease locks only while the host tier is short
# (beside the leased KV it cannot hold another GPU pool); with room on host it only orders eviction


def test_with_room_on_host_a_backed_up_lease_never_keeps_a_waiting_request_from_fitting(
        plugin, tiered_engine, requests, admit_step):
    """Host tier 3x the GPU pool, nearly empty: two sessions due back at once keep their KV on the
    GPU, leased but unlocked; a request that fits only in their room is admitted in its first pass
    (no refused pass, no yield), while other work runs; the leases stay (soft)."""
    engine = tiered_engine(400, lock_due_backed_up="host_short")
    mgr = plugin.manager_of(engine.cache)
    for i, name in enumerate("AB"):
        run_turn(engine, requests, toks(1000 * (i + 1), 100), 10, name, ttl=100, expect=5.0, spread=5.0)
    for _ in range(3):  # the write-through lands, the lease clock ticks: both sessions are due
        engine.advance_idle(engine.now + 0.1)
    assert not mgr.host.host_is_short()
    assert len(mgr.table) == 2 and mgr.table.count("hard") == 0
    for lease in mgr.table.leases():
        state = mgr.tree.path_state(lease.node_id)
        assert state.unbacked_tokens == 0 and state.host_only_tokens == 0  # on the GPU, backed up
    running = requests(toks(5000, 20), 100)  # a long decode: it will not free KV soon
    running.ignore_eos = True
    engine.submit(running)
    assert admit_step(engine) == 1
    big = requests(toks(7000, 200), 10)  # fits only if the leased KV (2 x 110) may be evicted
    big.ignore_eos = True
    engine.submit(big)
    assert admit_step(engine) == 1 and not engine.waiting_queue
    assert mgr.metrics.total("blocked_passes") == 0 and mgr.metrics.total("yields") == 0
    assert {l.session_id for l in mgr.table.leases()} <= {"A", "B"}  # leases kept as long as their KV is


def test_with_the_host_tier_short_a_due_backed_up_lease_locks(plugin, tiered_engine, requests):
    """Host tier the size of the GPU pool (--hicache-ratio 1): once it holds the sessions' copies it
    cannot take another pool of them without evicting host KV, so a due session's backed-up KV is
    locked on the GPU (losing it there could lose it on both tiers)."""
    engine = tiered_engine(400, host_ratio=1, lock_due_backed_up="host_short")
    mgr = due_leases(engine, requests, plugin)  # both hard, backed up
    assert mgr.host.host_is_short()


# ---- defer_with_host_room: while the host tier has room the plugin steps aside (SGLang's LRU order)


@pytest.mark.parametrize("defer, host_ratio, evicted", [
    (True, 3, "leased"),     # room on host: plain LRU, the older (leased) history goes first
    (False, 3, "unleased"),  # the plugin's order: KV no lease expects back goes first
    (True, 1, "unleased"),   # the host is short: the plugin's order applies again
])
def test_with_room_on_host_the_plugin_evicts_in_sglangs_lru_order(
        kit, plugin, tiered_engine, requests, admit_step, defer, host_ratio, evicted):
    """A leased session's history (older) and a history no lease covers (newer), both on the GPU
    and backed up; a request needs the room of one of them. With ``defer_with_host_room`` and room
    on host the older one goes, as under SGLang's own LRU strategy; otherwise (or once the host is
    short) the unleased one goes first, whatever its age."""
    engine = tiered_engine(400, host_ratio=host_ratio, defer_with_host_room=defer)
    mgr = plugin.manager_of(engine.cache)
    leased = run_turn(engine, requests, toks(1000, 100), 10, "A", ttl=100, expect=60.0, spread=1.0)
    for _ in range(3):
        engine.advance_idle(engine.now + 0.1)
    other = requests(toks(3000, 100), 10)
    other.ignore_eos = True
    engine.submit(other)
    while not other.finished:
        assert engine.step() or engine.busy
    for _ in range(3):  # the write-through lands, the lease clock ticks (retier reads the host room)
        engine.advance_idle(engine.now + 0.1)
    assert mgr.host.deferring is (defer and host_ratio == 3)
    assert len(mgr.table) == 1 and mgr.table.count("hard") == 0
    histories = {"leased": list(leased.input_ids) + list(leased.output_ids)[:-1],
                 "unleased": list(other.input_ids) + list(other.output_ids)[:-1]}
    assert all(kit.cached_len(engine.cache, ids) >= 100 for ids in histories.values())
    big = requests(toks(7000, 250), 10)  # free KV (~180) does not hold it: one history must go
    big.ignore_eos = True
    engine.submit(big)
    assert admit_step(engine) == 1
    kept = "unleased" if evicted == "leased" else "leased"
    assert kit.cached_len(engine.cache, histories[evicted]) < 100 <= kit.cached_len(engine.cache, histories[kept])
