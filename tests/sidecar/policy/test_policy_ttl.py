"""The lease TTL rule: modes, growth with context and with P(return), bounds, pressure, elapsed."""

import pytest
from policy_helpers import mixture

from sidecar.policy.settings import PolicySettings
from sidecar.policy.ttl import LeaseTtlRule


def rule(**overrides) -> LeaseTtlRule:
    return LeaseTtlRule(PolicySettings(**{"mode": "predictive", **overrides}))


def test_off_mode_gives_no_lease():
    assert rule(mode="off").ttl(mixture([(1.0, 1.0)]), 10_000) is None


def test_fixed_mode_gives_the_fixed_ttl_whatever_the_prediction():
    fixed = rule(mode="fixed", fixed_ttl=42.0)
    assert fixed.ttl(mixture([(1.0, 1.0)]), 10_000) == 42.0
    assert fixed.ttl(mixture([], never=1.0), 100) == 42.0
    assert rule(mode="fixed", fixed_ttl=0.0).ttl(None, 10_000) is None


def test_ttl_grows_with_context_size():
    # mostly back within a second, but 20% come back only after ~100 s
    dist = mixture([(0.8, 1.0), (0.2, 100.0)])
    r = rule()
    small, medium, large = (r.ttl(dist, n) for n in (2_000, 40_000, 150_000))
    assert small < 10  # covering the 100 s mode is not worth a short context
    assert large >= 100  # but it is for a long context (recompute grows faster than holding)
    assert small <= medium <= large


def test_ttl_grows_with_the_probability_of_return():
    r = rule()
    likely = r.ttl(mixture([(0.9, 20.0)], never=0.1), 30_000)
    unlikely = r.ttl(mixture([(0.2, 20.0)], never=0.8), 30_000)
    assert likely > 20 > unlikely
    assert unlikely == pytest.approx(r.settings.min_ttl)


def test_ttl_covers_the_return_and_no_more_when_it_is_sure():
    ttl = rule().ttl(mixture([(1.0, 5.0)]), 20_000)
    assert 5.0 < ttl < 15.0


def test_ttl_stays_within_bounds():
    r = rule(min_ttl=2.0, max_ttl=60.0)
    assert r.ttl(mixture([(1.0, 0.05)]), 10_000) >= 2.0
    assert r.ttl(mixture([(1.0, 300.0)]), 190_000) <= 60.0


def test_pressure_shortens_leases():
    r = rule(kv_pressure_gain=4.0)
    dist = mixture([(0.7, 1.0), (0.3, 60.0)])
    assert r.ttl(dist, 60_000, resident_fraction=0.9) < r.ttl(dist, 60_000, resident_fraction=0.0)


def test_elapsed_time_is_taken_into_account():
    # half come back within a second; the rest after ~100 s, which a 5K context is not worth
    dist = mixture([(0.5, 0.5), (0.5, 100.0)])
    r = rule()
    assert r.ttl(dist, 5_000, elapsed=0.0) < 5
    # once 30 s passed, only the slow half is left: not worth holding either
    assert r.ttl(dist, 5_000, elapsed=30.0) == pytest.approx(r.settings.min_ttl)
    # with a large context the remaining slow half is worth waiting for
    assert r.ttl(dist, 150_000, elapsed=30.0) > 70


def test_recompute_cost_is_superlinear():
    r = rule(recompute_quadratic_tokens=65536)
    assert r.recompute_cost_s(131072) > 2 * r.recompute_cost_s(65536)
    assert rule(recompute_quadratic_tokens=0).recompute_cost_s(2000) == pytest.approx(2000 * 5e-5)


def test_expected_saving_is_the_trapezoid_formula():
    """The time steps are computed once per rule: the same bits as differencing them per lease."""
    import numpy as np

    rule = LeaseTtlRule(PolicySettings(mode="predictive"))
    dist = mixture([(0.6, 2.0), (0.3, 40.0)], never=0.1)
    for elapsed, pressure in ((0.0, 0.0), (1.5, 0.4)):
        back = np.asarray(dist.p_back_within(rule.times, elapsed))
        survival = 1.0 - back
        held = np.concatenate(([0.0], np.cumsum(np.diff(rule.times) * (survival[1:] + survival[:-1]) / 2)))
        old = back * rule.recompute_cost_s(20_000) - rule.hold_cost_rate(20_000, pressure) * held
        np.testing.assert_array_equal(rule.expected_saving(dist, 20_000, elapsed, pressure), old)
