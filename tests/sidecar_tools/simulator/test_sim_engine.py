"""The simulated engine's scheduler against SGLang's real cache and admission code: chunked
prefill, decode jumps, retraction, the plugin's pressure valves, abort and flush."""

from __future__ import annotations

import pytest

pytest.importorskip("sglang")

from sidecar_tools.benchmarks.clients import ClientOptions
from sidecar_tools.benchmarks.traces import build_config, generate
from sidecar_tools.simulator.engine import SimEngine, SimRequest
from sidecar_tools.simulator.virtual_replay import VirtualReplay


def _drain(engine):
    steps = 0
    while engine.busy and steps < 100_000:
        engine.step(None)
        steps += 1
    return steps


def _req(rid, start, n, max_new, done, **kw):
    return SimRequest(rid=rid, input_ids=list(range(start, start + n)), max_new_tokens=max_new,
                      on_update=done.append, **kw)


def test_long_prompt_is_chunked_and_then_fully_cached(cost):
    engine = SimEngine(kv_tokens=60_000, cost=cost)
    done = []
    engine.submit(_req("long", 1000, 20_000, 5, done))
    engine.submit(_req("short", 30_000, 100, 5, done))
    _drain(engine)
    assert engine.counters["sim:prefill_steps_total"] == 3  # 8192 + 8192 + 3616 (+ short) tokens
    assert [s.cached_tokens for s in done] == [0, 0]
    engine.submit(_req("again", 1000, 20_000, 5, done))
    _drain(engine)
    assert done[-1].cached_tokens == 19_999  # SGLang always computes the last prompt token
    assert done[-1].first_token_s - done[-1].arrival_s < done[0].first_token_s


def test_decode_jumps_match_single_steps(cost):
    trace = generate(build_config("reference", sessions=6, turns=4))
    results = []
    for jump in (1, 100_000):
        engine = SimEngine(kv_tokens=20_000, cost=cost, max_jump_steps=jump)
        run, records = VirtualReplay(trace, engine, ClientOptions(close_sessions=True)).run()
        results.append((run["summary"], [(r.session, r.turn, r.cached_tokens) for r in records]))
    (single, rec1), (jumped, rec2) = results
    assert rec1 == rec2  # same admissions and evictions, turn by turn
    assert jumped["makespan_s"] == pytest.approx(single["makespan_s"], rel=1e-6)
    assert jumped["ttft_p90_s"] == pytest.approx(single["ttft_p90_s"], abs=1e-3)


def test_out_of_kv_decode_retracts_in_sglang_order(cost):
    engine = SimEngine(kv_tokens=5000, cost=cost)
    done = []
    engine.submit(_req("r0", 1000, 500, 3000, done, ignore_eos=False))
    engine.run_until(7.0)  # new_token_ratio decays while r0 decodes alone
    engine.submit(_req("r1", 9000, 500, 2500, done, ignore_eos=False))  # admitted on the estimate
    engine.notify()
    _drain(engine)
    assert engine.counters["sglang:num_retracted_requests_total"] == 1
    by_rid = {s.rid: s for s in done}
    assert by_rid["r1"].num_retractions == 1 and by_rid["r0"].num_retractions == 0  # fewest outputs first
    assert [len(s.output_ids) for s in done] == [3000, 2500]
    assert engine.alloc.available_size() + engine.cache.evictable_size() == 5000  # nothing leaked


def test_prefill_valve_releases_a_lease_for_a_head_that_cannot_fit(cost):
    engine = SimEngine(kv_tokens=5000, policy="session_ttl", cost=cost)
    done = []
    engine.submit(_req("a", 1000, 2000, 10, done, session_id="A", custom_params={"session_lease_ttl_s": 600}))
    _drain(engine)
    assert engine.mgr.snapshot()["hard_leases"] == 1
    engine.submit(_req("big", 5000, 4000, 10, done))  # 4000 + 10 > 5000 - 2009 leased
    engine.notify()
    _drain(engine)
    assert [s.rid for s in done] == ["a", "big"]
    assert engine.lease_metrics()["pressure_releases[prefill]"] == 1


def test_decode_valve_releases_leases_before_retracting(cost):
    engine = SimEngine(kv_tokens=5000, policy="session_ttl", cost=cost)
    done = []
    engine.submit(_req("a", 1000, 1000, 10, done, session_id="A", custom_params={"session_lease_ttl_s": 600}))
    _drain(engine)
    engine.submit(_req("r0", 20_000, 500, 3000, done, ignore_eos=False))
    engine.run_until(engine.now + 7)
    engine.submit(_req("r1", 30_000, 500, 1500, done, ignore_eos=False))
    engine.notify()
    _drain(engine)
    assert engine.lease_metrics()["pressure_releases[decode]"] == 1
    assert all(s.finish_reason["type"] == "length" for s in done)


def test_lease_expires_in_virtual_time(cost):
    engine = SimEngine(kv_tokens=50_000, policy="session_ttl", cost=cost)
    done = []
    engine.submit(_req("a", 1000, 1000, 10, done, session_id="A", custom_params={"session_lease_ttl_s": 5}))
    _drain(engine)
    engine.advance_idle(engine.now + 1)
    assert engine.mgr.snapshot()["hard_leases"] == 1
    assert engine.next_lease_expiry() == pytest.approx(done[0].finish_s + 5, abs=0.05)
    engine.advance_idle(engine.next_lease_expiry() + 0.01)
    assert engine.mgr.snapshot()["hard_leases"] == 0
    assert engine.lease_metrics()["expirations[hard]"] == 1


def test_abort_and_flush(cost):
    engine = SimEngine(kv_tokens=20_000, cost=cost)
    done = []
    engine.submit(_req("x", 1000, 1000, 5000, done))
    engine.step(None)  # prefill
    engine.step(engine.now + 0.1)  # some decode
    assert not engine.flush_cache()  # only when idle
    assert engine.abort("x")
    assert done[-1].finish_reason["type"] == "abort" and engine.idle()
    assert engine.flush_cache()
    assert engine.alloc.available_size() == 20_000 and engine.cache.evictable_size() == 0
    with pytest.raises(ValueError):
        engine.submit(_req("toolong", 1000, 40_000, 5000, done))


@pytest.mark.parametrize("prefer", [True, False])
def test_leased_continuations_queue_first_with_the_plugin_setting(cost, prefer):
    engine = SimEngine(kv_tokens=8000, policy="session_ttl", cost=cost,
                       policy_config={"max_leased_fraction": 0.5, "prefer_leased_requests": prefer})
    done = []
    history = list(range(1000, 3000))
    engine.submit(SimRequest(rid="a1", input_ids=history, max_new_tokens=10, session_id="A",
                             custom_params={"session_lease_ttl_s": 600}, on_update=done.append))
    _drain(engine)
    engine.submit(_req("x", 10_000, 5800, 10, done))  # a full recompute, queued first
    a2 = history + done[0].output_ids + list(range(4000, 4500))
    engine.submit(SimRequest(rid="a2", input_ids=a2, max_new_tokens=10, session_id="A",
                             custom_params={"session_lease_ttl_s": 600}, on_update=done.append))
    engine.notify()
    _drain(engine)
    first = {s.rid: s.first_token_s for s in done}
    assert (first["a2"] < first["x"]) is prefer
    assert {s.rid: s.cached_tokens for s in done}["a2"] == 2009  # the leased history was kept
