"""The synchronous admission core, without an event loop: offer, pump, cancel, max_wait, 429."""

import pytest
from policy_helpers import FakeClock, make_policy

from sidecar.policy import AdmissionRejected, TurnEnd
from sidecar.policy.admission import AdmissionQueue
from sidecar.policy.placement import WorkerRoom, choose_worker
from sidecar.policy.settings import AdmissionSettings


class Residents:
    """What the gate's callbacks see: granted sessions and their tokens, decisions in order."""

    def __init__(self):
        self.tokens: dict[str, float] = {}
        self.granted: list[str] = []
        self.ungranted: list[str] = []
        self.decisions: list[tuple[str, float | None]] = []

    def projection(self):
        return sum(self.tokens.values()), len(self.tokens)

    def grant(self, sid, prompt_tokens, worker):
        self.granted.append(sid)
        self.tokens[sid] = prompt_tokens

    def ungrant(self, sid):
        self.ungranted.append(sid)
        self.tokens.pop(sid, None)

    def admission(self, decision, waited):  # the metrics interface
        self.decisions.append((decision, waited))


class OnePool:
    """One worker whose room is what the residents project."""

    def __init__(self, budget, residents):
        self.budget, self.residents = budget, residents

    def choose(self, tokens, force=False):
        return choose_worker([WorkerRoom("w", self.budget, *self.residents.projection())], tokens, force)


def queue(clock, residents, capacity=10_000, key_share=1.0, **settings):
    s = AdmissionSettings(**{"enabled": True, "headroom": 1.0, **settings})
    return AdmissionQueue(s, OnePool(s.headroom * capacity, residents), residents.grant,
                          residents.ungrant, clock=clock, metrics=residents, key_share=key_share)


def test_offer_grants_at_once_while_it_fits():
    r = Residents()
    q = queue(FakeClock(), r)
    started = []
    ticket = q.offer("a", 4_000, 4_000, on_grant=lambda: started.append("a"))
    assert ticket.granted and started == ["a"] and r.granted == ["a"]
    assert q.offer("b", 5_000, 6_000).granted  # 4_000 resident + 6_000 projected = budget
    assert q.queue_length == 0 and r.decisions == [("immediate", 0.0), ("immediate", 0.0)]


def test_a_lone_session_starts_even_if_too_big():
    r = Residents()
    assert queue(FakeClock(), r).offer("huge", 50_000, 50_000).granted


def test_pump_lets_waiters_in_fifo_without_overtaking():
    clock, r = FakeClock(), Residents()
    q = queue(clock, r)
    q.offer("big", 8_000, 8_000)
    started = []
    head = q.offer("needs-3000", 3_000, 3_000, on_grant=lambda: started.append("needs-3000"))
    tail = q.offer("needs-1000", 1_000, 1_000, on_grant=lambda: started.append("needs-1000"))
    assert head.waiting and tail.waiting and q.queue_length == 2  # the tail fits, but may not overtake
    assert q.pump() == 0 and started == []
    clock.advance(2.0)
    r.tokens.pop("big")  # the resident session left
    assert q.pump() == 2
    assert started == ["needs-3000", "needs-1000"] and head.granted and tail.granted
    assert r.decisions[-2:] == [("queued", 2.0), ("queued", 2.0)]


def test_full_queue_rejects_with_retry_after_from_the_recent_waits():
    clock, r = FakeClock(), Residents()
    q = queue(clock, r, max_queue=1, retry_after=7.0)
    q.offer("resident", 9_500, 9_500)
    first = q.offer("w0", 1_000, 1_000)
    with pytest.raises(AdmissionRejected) as rejected:
        q.offer("w1", 1_000, 1_000)
    assert rejected.value.retry_after_s == 7.0 and ("rejected", None) in r.decisions
    assert q.queue_length == 1 and r.granted == ["resident"]
    clock.advance(20.0)
    r.tokens.pop("resident")
    q.pump()
    assert first.granted
    assert q.offer("w2", 9_000, 9_000).granted  # next to w0: the budget is full again
    assert q.offer("w3", 1_000, 1_000).waiting
    with pytest.raises(AdmissionRejected) as rejected:
        q.offer("w4", 1_000, 1_000)
    assert rejected.value.retry_after_s == 20.0  # waits longer than the setting: tell that


def test_cancelled_head_leaves_and_the_next_goes_at_once():
    r = Residents()
    q = queue(FakeClock(), r)
    q.offer("a", 9_000, 9_000)
    gone = q.offer("gone", 5_000, 5_000)
    stays = q.offer("stays", 500, 500)
    q.cancel(gone)
    assert gone.state == "cancelled" and stays.granted  # 9_000 + 500 fits once the head is gone
    assert ("cancelled", None) in r.decisions and r.ungranted == []
    q.cancel(gone)  # cancelling twice changes nothing
    assert r.decisions.count(("cancelled", None)) == 1 and q.queue_length == 0


def test_cancelling_a_granted_ticket_ungrants_it_once():
    r = Residents()
    q = queue(FakeClock(), r)
    ticket = q.offer("a", 1_000, 1_000)
    q.cancel(ticket)
    q.cancel(ticket)
    assert r.ungranted == ["a"] and ticket.state == "cancelled" and "a" not in r.tokens


def test_max_wait_lets_the_head_in_regardless_as_time_passes():
    clock, r = FakeClock(), Residents()
    q = queue(clock, r, max_wait=30.0)
    q.offer("a", 9_000, 9_000)
    waiter = q.offer("b", 5_000, 5_000)
    clock.advance(29.9)
    assert q.pump() == 0 and waiter.waiting
    clock.advance(0.1)
    assert q.pump() == 1 and waiter.granted
    assert r.decisions[-1] == ("timeout", pytest.approx(30.0))


def test_policy_offers_admission_without_an_event_loop():
    clock = FakeClock()
    policy = make_policy(clock=clock, capacity=10_000, admission={
        "enabled": True, "headroom": 1.0, "expected_growth_tokens": 2_000, "learn_growth": False})
    started = []
    policy.sessions.open("a")
    policy.sessions.open("b")
    assert policy.offer_admission("a", 3_000, True, on_grant=lambda: started.append("a")).granted  # 5_000
    waiter = policy.offer_admission("b", 3_500, True, on_grant=lambda: started.append("b"))
    assert waiter.waiting and started == ["a"]  # projected 5_500: 10_500 > 10_000
    # a continuing session is never gated nor counted as an admission decision
    assert policy.offer_admission("a", 20_000, False, on_grant=lambda: started.append("a2")).granted
    assert started == ["a", "a2"]
    assert policy.metrics.admission_decisions.labels("immediate")._value.get() == 1
    policy.on_request("a", 3_000, clock.now)
    policy.on_turn_end(TurnEnd("a", 3_100, [], clock.now))
    policy.release_admission("a")
    policy.release_admission("a")
    policy.sessions.forget(policy.sessions.get("a"), "client")  # the policy pumps when residents change
    assert waiter.granted and started == ["a", "a2", "b"]


def test_next_deadline_is_the_heads_max_wait():
    clock, r = FakeClock(), Residents()
    q = queue(clock, r, max_wait=30.0)
    assert q.next_deadline() is None
    q.offer("resident", 9_000, 9_000)
    clock.advance(2.0)
    q.offer("waiter", 5_000, 5_000)
    assert q.next_deadline() == pytest.approx(clock() + 30.0)
