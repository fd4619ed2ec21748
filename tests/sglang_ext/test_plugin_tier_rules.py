"""Host-tier rules, expectations on the lease clock and the wire payloads (no SGLang cache)."""

from __future__ import annotations

import pickle

import pytest

from sglang_ext import tiers
from sglang_ext.lease_table import HARD, SOFT, Lease, LeaseTable
from sglang_ext.settings import SessionTTLSettings
from sglang_ext.wire import parse_expectation
from sglang_ext.wire import (
    EXPECTED_BACK_PARAM,
    EXPECTED_SPREAD_PARAM,
    LEASE_TTL_PARAM,
    after_turn_state,
    lease_params,
    parse_after_turn_key,
)

S = SessionTTLSettings(host_load_tokens_per_s=1000.0, reload_margin_s=0.1)


def lease(expect=None, spread=0.0, expected_at=None) -> Lease:
    out = Lease("A", 7, 60.0, 1, SOFT, expires_at=61.0, expect_s=expect, spread_s=spread)
    out.expected_at = expected_at
    return out


def test_critical_window_spans_reload_before_earliest_to_margin_after_latest():
    # 500 tokens reload in 0.5 s; expected at 10 +- 1
    assert tiers.critical_window(lease(2.0, 1.0, expected_at=10.0), 500, 5.0, S) == (8.4, 11.1)
    assert tiers.critical_window(lease(), 500, 5.0, S) is None  # no expectation: never due


def test_lock_only_unbacked_or_due_kv_on_the_gpu():
    due, idle = lease(2.0, expected_at=10.0), lease(2.0, expected_at=30.0)
    on_gpu = tiers.PathState(device_tokens=500)
    unbacked = tiers.PathState(device_tokens=500, unbacked_tokens=20)
    partly_host = tiers.PathState(device_tokens=300, host_only_tokens=200)
    assert tiers.wants_hard(due, on_gpu, 9.5, S)
    assert not tiers.wants_hard(idle, on_gpu, 9.5, S)
    assert tiers.wants_hard(idle, unbacked, 9.5, S)  # a recompute otherwise
    assert tiers.wants_hard(idle, on_gpu, 9.5, S, busy=True)  # its request is queued
    assert not tiers.wants_hard(due, partly_host, 9.5, S)  # a lock would not avoid the reload
    assert not tiers.wants_hard(due, on_gpu, 10.2, S)  # overdue: released


def test_host_short_locks_backed_up_kv_only_while_the_host_tier_is_short():
    due = lease(2.0, expected_at=10.0)
    on_gpu = tiers.PathState(device_tokens=500)
    unbacked = tiers.PathState(device_tokens=500, unbacked_tokens=20)
    short = S.model_copy(update={"lock_due_backed_up": "host_short"})
    assert tiers.wants_hard(due, on_gpu, 9.5, short, host_is_short=True)
    assert not tiers.wants_hard(due, on_gpu, 9.5, short, host_is_short=False)  # a reload at worst
    assert not tiers.wants_hard(due, on_gpu, 9.5, short, busy=True, host_is_short=False)
    assert tiers.wants_hard(due, unbacked, 9.5, short, host_is_short=False)  # a recompute otherwise
    assert S.lock_due_backed_up is True and S.defer_with_host_room is True  # the defaults
    # defer_with_host_room (default): with room on host the plugin steps aside, locks included
    assert not tiers.wants_hard(due, on_gpu, 9.5, S, host_is_short=False)
    assert tiers.wants_hard(due, on_gpu, 9.5, S, host_is_short=True)
    always = S.model_copy(update={"defer_with_host_room": False})  # true: whatever the host holds
    assert tiers.wants_hard(due, on_gpu, 9.5, always, host_is_short=False)
    never = S.model_copy(update={"lock_due_backed_up": False})
    assert not tiers.wants_hard(due, on_gpu, 9.5, never, host_is_short=True)
    assert tiers.host_short(1200, 801, 400) and not tiers.host_short(1200, 800, 400)


@pytest.mark.parametrize("value", [True, False, "host_short"])
def test_lock_due_backed_up_accepts_its_three_values(value):
    assert SessionTTLSettings.from_policy_config({"lock_due_backed_up": value}).lock_due_backed_up == value


def test_lock_due_backed_up_rejects_other_strings():
    with pytest.raises(ValueError, match="lock_due_backed_up"):
        SessionTTLSettings.from_policy_config({"lock_due_backed_up": "sometimes"})


def test_prefetch_is_due_a_reload_of_the_host_part_before_the_return():
    host = tiers.PathState(device_tokens=100, host_only_tokens=400)  # 0.4 s + 0.1 s margin
    assert not tiers.wants_prefetch(lease(2.0, expected_at=10.0), host, 9.4, S)
    assert tiers.wants_prefetch(lease(2.0, expected_at=10.0), host, 9.5, S)
    issued = lease(2.0, expected_at=10.0)
    issued.prefetch = "issued"
    assert not tiers.wants_prefetch(issued, host, 9.5, S)
    assert not tiers.wants_prefetch(lease(2.0, expected_at=10.0), tiers.PathState(500), 9.5, S)
    assert tiers.next_change(lease(2.0, expected_at=10.0), host, 5.0, S) == pytest.approx(9.5)
    assert tiers.next_change(lease(2.0, expected_at=10.0), host, 9.6, S) == pytest.approx(10.1)


def test_expected_return_is_stamped_by_the_clock_and_restamped_after_a_turn():
    table = LeaseTable()
    table.put("A", 1, 60.0, HARD, expect_s=2.0, spread_s=0.5)
    assert table.has_unstamped()
    table.advance(3.0)
    a = table.get("A")
    assert (a.expected_at, a.expires_at, a.spread_s) == (5.0, 63.0, 0.5)
    assert a.due_back(3.0) == 5.0 and not table.has_unstamped()
    table.restamp("A", expect_s=1.0)
    assert table.has_unstamped()  # rank 0 ticks promptly to stamp it
    table.advance(4.0)
    assert table.get("A").expected_at == 5.0 and table.get("A").expires_at == 63.0
    table.put("B", 2, 10.0, HARD)
    table.advance(4.5)
    assert table.get("B").expected_back(4.5) is None and table.get("B").due_back(4.5) == 14.5
    assert table.restamp("nobody", ttl_s=1.0) is None


def test_expectation_params():
    assert parse_expectation({EXPECTED_BACK_PARAM: 1.5, EXPECTED_SPREAD_PARAM: 0.2}) == (1.5, 0.2)
    assert parse_expectation({EXPECTED_BACK_PARAM: -1, EXPECTED_SPREAD_PARAM: "x"}) == (None, 0.0)
    assert parse_expectation({EXPECTED_BACK_PARAM: float("inf")}) == (None, 0.0)
    assert parse_expectation(None) == (None, 0.0)


def test_tier_settings_are_validated():
    with pytest.raises(ValueError, match="host_load_tokens_per_s"):
        SessionTTLSettings.from_policy_config({"host_load_tokens_per_s": 0})
    with pytest.raises(ValueError, match="reload_margin_s"):
        SessionTTLSettings.from_policy_config({"reload_margin_s": -1})
    s = SessionTTLSettings.from_policy_config({"prefetch": False, "tier_aware": False})
    assert not s.prefetch and not s.tier_aware


def test_wire_builds_what_the_plugin_parses():
    assert lease_params(12.5) == {LEASE_TTL_PARAM: 12.5}
    assert lease_params(12.5, 0.8, 0.3) == {
        LEASE_TTL_PARAM: 12.5, EXPECTED_BACK_PARAM: 0.8, EXPECTED_SPREAD_PARAM: 0.3,
    }
    body = after_turn_state("agent:7", ttl_s=0, expected_back_s=0.8)
    assert body == {"server_args": {"sglang_ext:ttl:agent:7": 0.0, "sglang_ext:expect:agent:7": 0.8}}
    assert [parse_after_turn_key(k) for k in body["server_args"]] == [("ttl", "agent:7"), ("expect", "agent:7")]
    assert parse_after_turn_key("pp_max_micro_batch_size") is None
    for bad in ("sglang_ext:ttl", "sglang_ext:bogus:A", "sglang_ext:ttl:"):
        with pytest.raises(ValueError, match="malformed plugin key"):
            parse_after_turn_key(bad)
    with pytest.raises(ValueError):
        after_turn_state("A")


def test_expectation_keys_survive_sglang_request_validation(plugin):
    from sglang.srt.entrypoints.api_contract import generate_contract_error
    from sglang.srt.sampling.sampling_params import SamplingParams

    custom = lease_params(12.5, 0.8, 0.3)
    body = {"input_ids": [1, 2], "session_id": "a", "sampling_params": {"max_new_tokens": 4, "custom_params": custom}}
    assert generate_contract_error(body) is None
    sp = SamplingParams(max_new_tokens=4, custom_params=custom)
    sp.normalize(None)
    sp.verify(1000)
    assert pickle.loads(pickle.dumps(sp)).custom_params == custom
