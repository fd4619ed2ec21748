"""Scheduler-side hooks: lease clock, valves, /server_info. The clock and /server_info go
through SGLang's real (hooked) methods; the valves run in the simulator's scheduler loop
(``make_engine``), which calls the plugin's hooks where SGLang's Scheduler would."""

from __future__ import annotations

import time
import types

import pytest

pytest.importorskip("sglang")


def toks(base: int, n: int):
    return list(range(base, base + n))


class Anything:
    """Stands in for every Scheduler attribute a method touches but we do not test."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = Anything()
        object.__setattr__(self, name, value)
        return value

    def __call__(self, *args, **kwargs):
        return None


def test_rank0_clock_ticks_drive_expiry_on_every_rank(kit, plugin, make_engine, requests):
    from sglang.srt.managers.scheduler import Scheduler

    engine0 = make_engine(256, tick_interval_s=0.5)  # rank 0's queues, for _poll_timeout_aborts

    def rank(cache=None):
        cache = cache or kit.make_cache(256, config={"tick_interval_s": 0.5})
        sched = Anything()
        sched.tree_cache = cache
        sched.metrics_collector = None  # --enable-metrics off
        sched.waiting_queue = []  # no session is waiting: leases expire on time
        sched.running_batch.reqs = []
        Scheduler.init_request_dispatcher(
            sched
        )  # real method + the plugin's AFTER hook
        return cache, sched, plugin.manager_of(cache)

    (c0, s0, m0), (c1, s1, m1) = rank(engine0.cache), rank()
    poll = types.MethodType(Scheduler._poll_timeout_aborts, engine0)
    assert poll() == []  # idle and nothing leased: no tick, the loop stays quiet

    for cache in (c0, c1):  # both ranks finish the same request identically
        kit.finish(cache, "A", toks(1000, 30), toks(1900, 5), ttl=1.0)
    [tick] = poll()  # an unstamped lease asks for a tick at once
    assert isinstance(tick, plugin.LeaseClockTick)
    for sched in (s0, s1):
        assert (
            sched._request_dispatcher(tick) is None
        )  # what process_input_requests does
    assert (
        m0.table.get("A").expires_at == m1.table.get("A").expires_at == tick.now + 1.0
    )
    assert poll() == []  # idle, lease not due yet

    time.sleep(1.05)
    assert "A" in m1.table  # no rank expires on its own clock
    [tick] = poll()
    for sched in (s0, s1):
        sched._request_dispatcher(tick)
    assert "A" not in m0.table and "A" not in m1.table
    assert c0.protected_size() == c1.protected_size() == 0

    engine0.submit(requests(toks(1, 5), 4))  # busy: regular ticks
    time.sleep(0.55)
    assert len(poll()) == 1
    assert poll() == []  # not again within tick_interval_s
    time.sleep(0.55)
    assert len(poll()) == 1


def _decode_scenario(kit, make_engine, plugin, requests, admit_step, release_on_decode_pressure: bool):
    engine = make_engine(
        400, max_leased_fraction=0.9, release_on_decode_pressure=release_on_decode_pressure
    )
    cache = engine.cache
    mgr = plugin.manager_of(cache)
    mgr.on_tick(0.0)
    kit.finish(cache, "A", toks(1000, 100), toks(1900, 10), ttl=100)
    kit.finish(cache, "B", toks(2000, 100), toks(2900, 10), ttl=100)
    for i in range(2):
        engine.submit(requests(toks(5000 + 100 * i, 20), 30))
    assert admit_step(engine) == 2
    # Meanwhile another agent's turn ends and is leased: the pool is now tight.
    kit.finish(cache, "C", toks(3000, 120), toks(3900, 10), ttl=100)
    assert cache.token_to_kv_pool_allocator.available_size() == 10
    for _ in range(100):
        engine.step()
        if engine.idle():
            break
    return engine, mgr


def _retractions(engine) -> float:
    return engine.counters.get("sglang:num_retracted_requests_total", 0)


def test_decode_valve_releases_leases_before_retracting(kit, plugin, make_engine, requests, admit_step):
    engine, mgr = _decode_scenario(kit, make_engine, plugin, requests, admit_step, True)
    assert len(requests.done) == 2 and _retractions(engine) == 0
    assert mgr.metrics.get("pressure_releases", stage="decode") >= 1
    assert mgr.table.count("hard") >= 1  # only as many leases as needed went


def test_without_decode_release_sglang_retracts(kit, plugin, make_engine, requests, admit_step):
    engine, mgr = _decode_scenario(kit, make_engine, plugin, requests, admit_step, False)
    assert _retractions(engine) >= 1
    assert mgr.metrics.get("pressure_releases", stage="decode") == 0


def test_prefill_valve_waits_while_requests_run(kit, plugin, make_engine, requests, admit_step):
    engine = make_engine(400, max_leased_fraction=0.9)
    cache = engine.cache
    mgr = plugin.manager_of(cache)
    mgr.on_tick(0.0)
    kit.finish(cache, "A", toks(1000, 100), toks(1900, 10), ttl=100)
    kit.finish(cache, "B", toks(2000, 100), toks(2900, 10), ttl=900)
    engine.submit(requests(toks(5000, 20), 30))
    assert admit_step(engine) == 1
    big = requests(toks(7000, 170), 10)  # needs 181 > 180 ever free beside leases
    engine.submit(big)
    while not engine.running_batch.is_empty():
        assert admit_step(engine) == 0  # refused, but the running one will free KV
        assert mgr.metrics.total("pressure_releases") == 0 and len(mgr.table) == 2
    assert admit_step(engine) == 0  # now stuck: the valve acts ...
    assert mgr.metrics.get("pressure_releases", stage="prefill") == 1
    assert [l.session_id for l in mgr.table.leases()] == ["A"]  # B: longest absence/token
    assert admit_step(engine) == 1  # ... and it runs
    assert [r.rid for r in engine.running_batch.reqs] == [big.rid]


def test_server_info_carries_lease_stats(kit, plugin):
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput
    from sglang.srt.managers.scheduler_components.internal_state import (
        SchedulerInternalStateController,
    )

    cache = kit.make_cache(256)
    kit.finish(cache, "A", toks(1000, 30), toks(1900, 5), ttl=10)
    out = GetInternalStateReqOutput(internal_state={"other": 1})
    controller = types.SimpleNamespace(
        scheduler=types.SimpleNamespace(tree_cache=cache)
    )
    hook = SchedulerInternalStateController.get_internal_state
    assert hasattr(hook, "__wrapped__")
    plugin.get_internal_state(out, controller, None)
    stats = out.internal_state["session_ttl"]
    assert (
        stats["hard_leases"] == 1
        and stats["leased_tokens"] == 35
        and out.internal_state["other"] == 1
    )


def _queue_with_a_recompute_ahead_of_a_continuation(kit, plugin, make_engine, requests, prefer: bool):
    engine = make_engine(400, max_leased_fraction=0.9, prefer_leased_requests=prefer)
    cache = engine.cache
    mgr = plugin.manager_of(cache)
    mgr.on_tick(0.0)
    kit.finish(cache, "A", toks(1000, 150), toks(1900, 10), ttl=100)
    kit.finish(cache, "B", toks(2000, 150), toks(2900, 10), ttl=100)  # 320 of 400 tokens leased
    recompute = requests(toks(7000, 100), 10, "C")  # history gone: needs 112 > 80 free
    continuation = requests(toks(1000, 150) + toks(1900, 10) + toks(3000, 20), 10, "A")
    engine.submit(recompute)
    engine.submit(continuation)
    return engine, mgr, continuation


def test_leased_continuation_is_not_stalled_behind_a_recompute(kit, plugin, make_engine, requests, admit_step):
    engine, mgr, continuation = _queue_with_a_recompute_ahead_of_a_continuation(
        kit, plugin, make_engine, requests, True)
    assert admit_step(engine) == 1
    assert [r.rid for r in engine.running_batch.reqs] == [continuation.rid]
    assert mgr.metrics.total("pressure_releases") == 0 and len(mgr.table) == 2


def test_without_reordering_the_recompute_blocks_and_costs_a_lease(kit, plugin, make_engine, requests, admit_step):
    """Control: FCFS keeps the recompute at the head; nothing runs, so the valve must take a lease."""
    engine, mgr, continuation = _queue_with_a_recompute_ahead_of_a_continuation(
        kit, plugin, make_engine, requests, False)
    assert admit_step(engine) == 0
    assert mgr.metrics.get("pressure_releases", stage="prefill") == 1 and len(mgr.table) == 1


def test_an_unleased_request_waits_behind_leased_ones_only_max_priority_wait_s(
        kit, plugin, make_engine, requests):
    """Aging: the recompute goes behind the continuation at first, and back to its arrival place
    (the head) once it has waited max_priority_wait_s of the lease clock; without aging a steady
    stream of leased continuations would keep it at the tail for ever."""
    engine = make_engine(400, max_leased_fraction=0.9, max_priority_wait_s=2.0)
    mgr = plugin.manager_of(engine.cache)
    mgr.on_tick(10.0)
    kit.finish(engine.cache, "A", toks(1000, 150), toks(1900, 10), ttl=100)
    recompute = requests(toks(7000, 100), 10, "C")
    continuation = requests(toks(1000, 150) + toks(1900, 10) + toks(3000, 20), 10, "A")
    engine.submit(recompute)
    engine.submit(continuation)
    queue = engine.waiting_queue
    order = lambda: [r.rid for r in queue]  # noqa: E731
    plugin.leased_first(queue, mgr)
    assert order() == [continuation.rid, recompute.rid]
    mgr.on_tick(11.9)
    plugin.leased_first(queue, mgr)
    assert order() == [continuation.rid, recompute.rid]
    mgr.on_tick(12.0)
    plugin.leased_first(queue, mgr)
    assert order() == [recompute.rid, continuation.rid]  # arrival order again
