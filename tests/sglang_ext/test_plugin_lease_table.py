"""Pure lease bookkeeping and settings (no sglang needed)."""

from __future__ import annotations

import pytest

pytest.importorskip("pydantic")

from sglang_ext.lease_table import (
    HARD,
    SOFT,
    LeaseTable,
    exclusive_tokens,
    union_tokens,
)
from sglang_ext.order import release_order
from sglang_ext.settings import SessionTTLSettings
from sglang_ext.wire import parse_ttl


def test_renewal_replaces_the_previous_lease():
    t = LeaseTable()
    first, old = t.put("s", node_id=10, ttl_s=5, tier=HARD, handle="lock10")
    assert old is None
    second, old = t.put("s", node_id=11, ttl_s=7, tier=HARD, handle="lock11")
    assert old is first and old.handle == "lock10"
    assert t.get("s") is second and len(t) == 1
    assert t.on_node(10) == [] and t.on_node(11) == [second]
    assert second.seq > first.seq


def test_clock_stamps_new_leases_then_expires_them():
    t = LeaseTable()
    t.put("a", 1, ttl_s=2.0, tier=HARD)
    t.put("b", 2, ttl_s=5.0, tier=SOFT)
    assert t.has_unstamped() and t.next_expiry() is None
    assert t.advance(100.0) == []  # stamps: a -> 102, b -> 105
    assert not t.has_unstamped() and t.next_expiry() == 102.0
    assert t.advance(101.9) == []
    assert [l.session_id for l in t.advance(102.0)] == ["a"]
    assert "a" not in t and "b" in t
    assert t.advance(99.0) == []  # the clock never runs backwards
    assert t.clock == 102.0
    assert [l.session_id for l in t.advance(105.5)] == ["b"]
    assert len(t) == 0


def test_soft_node_index_follows_demotion_and_removal():
    t = LeaseTable()
    t.put("a", 7, ttl_s=9, tier=HARD, handle="h")
    assert not t.is_soft_node(7)
    lease = t.demote("a")
    assert lease.tier == SOFT and lease.handle is None and t.is_soft_node(7)
    t.put("b", 7, ttl_s=9, tier=HARD)  # a second session on the same node
    t.pop("a")
    assert not t.is_soft_node(7) and [l.session_id for l in t.on_node(7)] == ["b"]
    assert [l.session_id for l in t.clear()] == ["b"] and len(t) == 0


def test_union_and_exclusive_tokens_share_prefixes():
    system = (1, 100)
    paths = {
        "a": [(3, 40), (2, 10), system],
        "b": [(4, 25), (2, 10), system],
        "c": [(5, 60), system],
    }
    assert union_tokens(paths.values()) == 100 + 10 + 40 + 25 + 60
    assert exclusive_tokens(paths) == {"a": 40, "b": 25, "c": 60}
    assert exclusive_tokens({"solo": paths["a"]}) == {"solo": 150}


def test_release_order_is_least_value_first():
    t = LeaseTable()
    t.put("long_absence", 1, ttl_s=100.0, tier=HARD)
    t.put("soon_back", 2, ttl_s=5.0, tier=HARD)
    t.put("big", 3, ttl_s=100.0, tier=HARD)
    t.put("covered", 4, ttl_s=1000.0, tier=HARD)
    t.put("queued", 5, ttl_s=1000.0, tier=HARD)
    t.advance(0.0)
    tokens = {
        "long_absence": 100,
        "soon_back": 100,
        "big": 1000,
        "covered": 0,
        "queued": 10,
    }
    order = [
        l.session_id for l in release_order(t.leases(), tokens, 0.0, spare={"queued"})
    ]
    # 100/100 s < 1000/100 s < 100/5 s; nothing-to-free next; spare sessions last.
    assert order == ["long_absence", "big", "soon_back", "covered", "queued"]
    # Value is per second still to wait: at t=95 "queued" (10 tok / 905 s) is
    # worth least and "soon_back" (already due) most.
    later = [l.session_id for l in release_order(t.leases(), tokens, 95.0)]
    assert later == ["queued", "long_absence", "big", "soon_back", "covered"]


def test_release_order_breaks_ties_by_grant_order():
    t = LeaseTable()
    for sid in ("x", "y", "z"):
        t.put(sid, hash(sid) % 100, ttl_s=10.0, tier=HARD)
    tokens = {"x": 5, "y": 5, "z": 5}
    assert [l.session_id for l in release_order(t.leases(), tokens, None)] == [
        "x",
        "y",
        "z",
    ]


def test_settings_reject_unknown_keys_and_bad_values():
    s = SessionTTLSettings.from_policy_config(
        {"max_leased_fraction": 0.6, "default_ttl_s": 0}
    )
    assert s.max_leased_fraction == 0.6 and s.default_ttl_s == 0.0
    assert SessionTTLSettings.from_policy_config(None) == SessionTTLSettings()
    with pytest.raises(
        ValueError, match=r"unknown key\(s\) \['max_leased_fracton'\].*allowed keys"
    ):
        SessionTTLSettings.from_policy_config({"max_leased_fracton": 0.6})
    with pytest.raises(ValueError, match="max_leased_fraction"):
        SessionTTLSettings.from_policy_config({"max_leased_fraction": 1.5})


@pytest.mark.parametrize(
    "custom, default, expected",
    [
        ({"session_lease_ttl_s": 12.5}, 0.0, 12.5),
        ({"session_lease_ttl_s": 3}, 0.0, 3.0),
        ({"session_lease_ttl_s": 0}, 30.0, None),  # explicit 0 ends the lease
        ({"session_lease_ttl_s": -1.0}, 0.0, None),
        ({"session_lease_ttl_s": "10"}, 0.0, None),
        ({"session_lease_ttl_s": True}, 0.0, None),
        ({"session_lease_ttl_s": float("inf")}, 0.0, None),
        ({"session_lease_ttl_s": 1e9}, 0.0, 1e9),  # parsed as asked; the lease table bounds it
        (None, 0.0, None),  # no key, default 0: ends the lease
        ({"other": 1}, 45.0, 45.0),  # no key: default_ttl_s
    ],
)
def test_parse_ttl(custom, default, expected):
    assert parse_ttl(custom, default_ttl_s=default) == expected


def test_a_lease_takes_at_most_the_bound_ttl_at_grant_and_at_an_update():
    """Whatever a client asks, a lease lasts at most ``max_ttl_s``; a shorter TTL is kept."""
    t = LeaseTable(max_ttl_s=3600.0)
    lease, _ = t.put("A", 1, 1e9, HARD)
    assert lease.ttl_s == 3600.0
    assert t.restamp("A", ttl_s=12.5).ttl_s == 12.5
    assert t.restamp("A", ttl_s=1e9).ttl_s == 3600.0
    t.advance(10.0)
    assert t.get("A").expires_at == 10.0 + 3600.0


def test_lease_of_a_session_waiting_for_admission_does_not_expire():
    """Its queued request will match the leased KV; expiring it now would let a prefill evict it."""
    t = LeaseTable()
    t.put("queued", 1, ttl_s=1.0, tier=HARD)
    t.put("idle", 2, ttl_s=1.0, tier=HARD)
    t.advance(10.0)
    due = t.advance(20.0, hold={"queued"})
    assert [l.session_id for l in due] == ["idle"]
    assert "queued" in t
    # Once its request is no longer waiting or running, the overdue lease goes.
    assert [l.session_id for l in t.advance(20.1)] == ["queued"]
