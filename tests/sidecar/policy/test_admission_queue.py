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

    def choose(self, tokens, force=False, share=None):
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


# --------------------------------------------------------------------------- fairness across keys


def _flood(q, keys, per_key):
    """Each flooding key offers ``per_key`` new sessions while nothing fits (429s counted)."""
    refused = 0
    for i in range(per_key):
        for key in keys:
            try:
                q.offer(f"{key}-{i}", 9_000, 9_000, scope=key)  # one at a time fills the pool
            except AdmissionRejected:
                refused += 1
    return refused


@pytest.mark.parametrize("flooders", [1, 2, 3])
def test_flooding_keys_neither_refuse_nor_delay_another_keys_new_session(flooders):
    """N keys flood the queue (each up to its share, together past max_queue): a new session of
    another key still queues, and goes within one round of the keys, not behind all their waiters."""
    clock, r = FakeClock(), Residents()
    q = queue(clock, r, max_queue=64, key_share=0.5)
    q.offer("resident", 9_500, 9_500)  # the pool is full: every new session waits
    keys = [f"flood{k}" for k in range(flooders)]
    _flood(q, keys, 40)
    assert q.queue_length == min(64, 32 * flooders)  # each key up to its share, the queue up to max_queue
    victim = q.offer("victim-0", 9_000, 9_000, scope="victim")  # queued, not refused
    assert victim.waiting and q.queue_length == min(64, 32 * flooders + 1)
    while victim.waiting:  # room for one session at a time: each finishes before the next goes
        r.tokens.clear()
        assert q.pump() == 1
    served_before = r.granted.index("victim-0") - 1  # the resident was first
    assert served_before <= flooders


def test_a_key_past_its_share_is_refused_for_its_own_sessions_only():
    clock, r = FakeClock(), Residents()
    q = queue(clock, r, max_queue=8, key_share=0.5)
    q.offer("resident", 9_500, 9_500)
    for i in range(4):
        q.offer(f"b{i}", 1_000, 1_000, scope="b")
    with pytest.raises(AdmissionRejected) as refused:
        q.offer("b4", 1_000, 1_000, scope="b")
    assert refused.value.code == "key_queue_share_exceeded"
    assert q.offer("a0", 1_000, 1_000, scope="a").waiting


def test_a_displaced_waiter_is_told_and_the_queue_stays_bounded():
    clock, r = FakeClock(), Residents()
    q = queue(clock, r, max_queue=4, key_share=1.0)
    q.offer("resident", 9_500, 9_500)
    told = []
    tickets = [q.offer(f"f{i}", 1_000, 1_000, scope="f") for i in range(4)]
    tickets[-1].on_reject = lambda: told.append("f3")
    assert q.offer("v", 1_000, 1_000, scope="v").waiting
    assert tickets[-1].state == "rejected" and told == ["f3"] and q.queue_length == 4
    with pytest.raises(AdmissionRejected):  # the flooder cannot take it back
        q.offer("f4", 1_000, 1_000, scope="f")
    with pytest.raises(AdmissionRejected):  # nor can the other key grow past an even split
        q.offer("v1", 1_000, 1_000, scope="v")
        q.offer("v2", 1_000, 1_000, scope="v")


def test_one_key_alone_is_served_in_fifo_order():
    clock, r = FakeClock(), Residents()
    q = queue(clock, r)
    q.offer("resident", 9_500, 9_500)
    for i in range(3):
        q.offer(f"s{i}", 1_000, 1_000)
    r.tokens.clear()
    q.pump()
    assert r.granted == ["resident", "s0", "s1", "s2"]
