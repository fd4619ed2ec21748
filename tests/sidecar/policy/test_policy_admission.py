"""Admission of new sessions: fit rule, FIFO order, bound (429), wake-ups, no deadlock."""

import asyncio

import pytest
from policy_helpers import FakeClock, admit, lease_ttl, make_policy

from sidecar.policy import AdmissionRejected, TurnEnd

FAST_POLL = {"poll_interval": 0.01}


def gated(clock, capacity=10_000, **admission):
    settings = {"enabled": True, "headroom": 1.0, "expected_growth_tokens": 0, "learn_growth": False, **FAST_POLL}
    settings.update(admission)
    return make_policy(clock=clock, capacity=capacity, admission=settings)


async def start(policy, order, sid, tokens, new=True):
    await admit(policy, sid, tokens, is_new_session=new)
    order.append(sid)


async def settle():
    for _ in range(5):
        await asyncio.sleep(0)


async def test_admits_immediately_while_it_fits():
    policy = gated(FakeClock())
    await asyncio.wait_for(admit(policy, "a", 4_000, True), 1)
    await asyncio.wait_for(admit(policy, "b", 5_000, True), 1)
    assert policy.gate.queue_length == 0
    assert policy.metrics.admission_decisions.labels("immediate")._value.get() == 2


async def test_waiters_are_let_in_fifo_without_overtaking_when_a_session_leaves():
    clock = FakeClock()
    policy = gated(clock)
    await admit(policy, "big", 8_000, True)
    order: list[str] = []
    first = asyncio.create_task(start(policy, order, "needs-3000", 3_000))
    await settle()
    second = asyncio.create_task(start(policy, order, "needs-1000", 1_000))  # would fit, but must queue
    await settle()
    assert order == [] and policy.gate.queue_length == 2

    policy.release_admission("big")  # finished, no lease: no longer resident
    await asyncio.wait_for(asyncio.gather(first, second), 1)
    assert order == ["needs-3000", "needs-1000"]
    assert policy.gate.queue_length == 0


async def test_head_that_does_not_fit_blocks_later_ones():
    policy = gated(FakeClock())
    await admit(policy, "a", 6_000, True)
    order: list[str] = []
    head = asyncio.create_task(start(policy, order, "head-5000", 5_000))
    await settle()
    tail = asyncio.create_task(start(policy, order, "tail-1000", 1_000))
    await asyncio.sleep(0.05)  # several poll intervals
    assert order == []
    policy.release_admission("a")
    await asyncio.wait_for(asyncio.gather(head, tail), 1)
    assert order == ["head-5000", "tail-1000"]


async def test_full_queue_rejects_with_retry_after():
    policy = gated(FakeClock(), max_queue=2, retry_after=7.0)
    await admit(policy, "resident", 9_500, True)
    waiters = [asyncio.create_task(admit(policy, f"w{i}", 1_000, True)) for i in range(2)]
    await settle()
    with pytest.raises(AdmissionRejected) as rejected:
        await admit(policy, "third", 1_000, True)
    assert rejected.value.retry_after_s >= 7.0
    assert policy.metrics.admission_decisions.labels("rejected")._value.get() == 1
    for w in waiters:
        w.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)
    assert policy.gate.queue_length == 0


async def test_continuing_sessions_are_never_gated():
    policy = gated(FakeClock())
    await admit(policy, "a", 9_900, True)
    await asyncio.wait_for(admit(policy, "a", 20_000, is_new_session=False), 1)


async def test_alone_a_session_is_admitted_even_if_too_big():
    policy = gated(FakeClock())
    await asyncio.wait_for(admit(policy, "huge", 50_000, True), 1)


async def test_cancelled_waiter_leaves_the_queue_and_the_next_one_goes():
    policy = gated(FakeClock())
    await admit(policy, "a", 9_000, True)
    order: list[str] = []
    gone = asyncio.create_task(start(policy, order, "gone", 5_000))
    await settle()
    stays = asyncio.create_task(start(policy, order, "stays", 500))
    await settle()
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    await asyncio.wait_for(stays, 1)  # 9_000 + 500 fits once the head is gone
    assert order == ["stays"]


async def test_expiring_lease_lets_the_waiter_in():
    clock = FakeClock()
    policy = gated(clock, capacity=10_000)
    await admit(policy, "agent", 8_000, True)
    policy.on_request("agent", 8_000, clock.now)
    ttl = lease_ttl(policy, "agent", 8_000, clock.now)
    policy.on_turn_end(TurnEnd("agent", 8_200, ["bash"], clock.now))
    policy.release_admission("agent")  # in its tool gap, under lease: still resident
    order: list[str] = []
    waiter = asyncio.create_task(start(policy, order, "new", 3_000))
    await asyncio.sleep(0.05)
    assert order == []
    clock.advance(ttl + 0.1)
    policy.sessions_to_close(clock.now)  # the periodic call also re-checks the queue
    await asyncio.wait_for(waiter, 1)
    assert order == ["new"]


async def test_max_wait_lets_a_waiter_in_regardless():
    clock = FakeClock()
    policy = gated(clock, max_wait=30.0)
    await admit(policy, "a", 9_000, True)
    waiter = asyncio.create_task(admit(policy, "b", 5_000, True))
    await asyncio.sleep(0.03)
    assert not waiter.done()
    clock.advance(31.0)
    await asyncio.wait_for(waiter, 1)  # the poll notices the timeout
    assert policy.metrics.admission_decisions.labels("timeout")._value.get() == 1


async def test_projection_includes_expected_growth():
    policy = gated(FakeClock(), expected_growth_tokens=2_000)
    await admit(policy, "a", 3_000, True)  # projected 5_000
    waiter = asyncio.create_task(admit(policy, "b", 3_500, True))  # projected 5_500: 10_500 > 10_000
    await asyncio.sleep(0.03)
    assert not waiter.done()
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)


async def test_disabled_admission_lets_everyone_through():
    policy = make_policy(capacity=1_000, admission={"enabled": False})
    for i in range(10):
        await asyncio.wait_for(admit(policy, f"s{i}", 900, True), 1)


async def test_many_concurrent_sessions_all_finish():
    """No deadlock: 50 sessions competing for room for ~3 at a time all get through."""
    clock = FakeClock()
    policy = gated(clock, capacity=10_000, max_queue=100)

    async def session(i):
        sid = f"s{i}"
        await admit(policy, sid, 3_000, True)
        await asyncio.sleep(0.001 * (i % 3))
        policy.on_request(sid, 3_000, clock.now)
        policy.on_turn_end(TurnEnd(sid, 3_100, [], clock.now))
        policy.release_admission(sid)

    await asyncio.wait_for(asyncio.gather(*(session(i) for i in range(50))), 5)
    assert policy.gate.queue_length == 0


async def test_max_wait_is_kept_to_the_deadline_not_to_the_next_poll():
    """A waiter is let through at max_wait itself: before, the deadline was only looked at on
    the periodic pass, so a wait could run a whole poll interval past max_wait."""
    import time

    policy = gated(time.monotonic, max_wait=0.2, poll_interval=5.0)
    await admit(policy, "resident", 9_000)
    started = time.monotonic()
    await asyncio.wait_for(admit(policy, "waiter", 5_000), 2)  # never fits: only max_wait lets it in
    waited = time.monotonic() - started
    assert 0.19 <= waited <= 0.2 + 0.1, waited
