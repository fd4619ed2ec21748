"""The return-time predictor: per-tool learning, adaptation, elapsed time, sessions, censoring."""

import math

import numpy as np
import pytest

from sidecar.policy.predictor import (
    NO_TOOL,
    ReturnTimePredictor,
    SessionGapStats,
    tool_keys,
)
from sidecar.policy.settings import PolicySettings


def lognormal(rng, median, sigma, n):
    return median * np.exp(sigma * rng.standard_normal(n))


@pytest.fixture
def predictor():
    return ReturnTimePredictor(PolicySettings(mode="predictive", half_life_obs=30))


def test_learns_each_tool_separately(predictor):
    rng = np.random.default_rng(1)
    for fast, slow in zip(lognormal(rng, 0.3, 0.3, 200), lognormal(rng, 40.0, 0.3, 200)):
        predictor.observe(["edit"], fast)
        predictor.observe(["run_tests"], slow)
    edit, tests = predictor.distribution(["edit"]), predictor.distribution(["run_tests"])
    assert 0.2 < edit.median() < 0.45
    assert 25 < tests.median() < 60
    assert edit.cdf(2.0) > 0.85 and tests.cdf(2.0) < 0.15


def test_adapts_when_a_tools_gaps_change(predictor):
    rng = np.random.default_rng(2)
    for gap in lognormal(rng, 0.4, 0.3, 200):
        predictor.observe(["bash"], gap)
        predictor.observe(["edit"], gap / 2)
    before = predictor.distribution(["bash"])
    assert before.cdf(2.0) > 0.85

    new_regime = lognormal(rng, 30.0, 0.3, 150)
    for gap in new_regime[:5]:
        predictor.observe(["bash"], gap)
    # a handful of odd gaps moves the estimate but does not overturn it
    assert predictor.distribution(["bash"]).cdf(2.0) > 0.6
    for gap in new_regime[5:]:
        predictor.observe(["bash"], gap)
    after = predictor.distribution(["bash"])
    assert after.cdf(2.0) < 0.15
    assert 15 < after.median() < 60
    # the other tool is untouched
    assert predictor.distribution(["edit"]).median() < 0.5


def test_few_observations_are_shrunk_toward_the_global_distribution(predictor):
    rng = np.random.default_rng(3)
    for gap in lognormal(rng, 0.5, 0.3, 300):
        predictor.observe(["edit"], gap)
    predictor.observe(["rare"], 100.0)
    rare = predictor.distribution(["rare"]).median()
    assert 0.5 < rare < 100.0  # neither the one sample nor the global median
    for _ in range(100):
        predictor.observe(["rare"], 100.0)
    assert 60 < predictor.distribution(["rare"]).median() < 150


def test_unknown_tool_uses_the_global_distribution(predictor):
    for _ in range(100):
        predictor.observe(["edit"], 0.5)
    unseen = predictor.distribution(["never_seen"])
    assert unseen.median() == pytest.approx(predictor.next_reply_distribution().median(), rel=0.3)
    assert "never_seen" not in predictor.known_tools()


def test_elapsed_time_conditioning(predictor):
    for _ in range(100):
        predictor.observe(["build"], 0.5)
        predictor.observe(["build"], 60.0)
    dist = predictor.distribution(["build"])
    assert dist.p_back_within(5.0) == pytest.approx(0.5, abs=0.08)
    # 10 s gone without a return: the fast mode is ruled out
    assert dist.p_back_within(5.0, elapsed=10.0) < 0.05
    assert dist.p_back_within(100.0, elapsed=10.0) > 0.9
    assert 35 < dist.median(elapsed=10.0) < 60  # remaining time ~ 60 - 10


def test_reply_with_several_tools_is_predicted_by_the_slowest(predictor):
    for _ in range(100):
        predictor.observe(["edit"], 0.2)
        predictor.observe(["run_tests"], 50.0)
    both = predictor.distribution(["edit", "run_tests"]).median()
    assert both == pytest.approx(predictor.distribution(["run_tests"]).median())


def test_session_speed_factor_stretches_the_tool_distribution(predictor):
    for _ in range(200):
        predictor.observe(["bash"], 1.0)
    slow = SessionGapStats()
    for _ in range(20):
        predictor.observe(["bash"], 6.0, slow)
    assert predictor.session_scale(slow) > 3.0
    assert predictor.distribution(["bash"], slow).median() > 3 * predictor.distribution(["bash"]).median()
    assert predictor.distribution(["bash"], SessionGapStats()).median() == pytest.approx(
        predictor.distribution(["bash"]).median()
    )


def test_before_the_reply_the_tool_mix_at_this_context_size_decides(predictor):
    # small contexts call a fast tool; large ones mostly finish (never come back) or run tests
    for _ in range(100):
        predictor.observe(["edit"], 0.2, context_tokens=8_000)
        predictor.observe(["run_tests"], 50.0, context_tokens=150_000)
        predictor.observe_censored(["finish"], context_tokens=150_000)
    small = predictor.next_reply_distribution(context_tokens=8_000)
    large = predictor.next_reply_distribution(context_tokens=150_000)
    assert small.median() < 1.0
    assert large.p_back_ever < 0.7 and large.p_back_within(2.0) < 0.1
    overall = predictor.next_reply_distribution()
    assert small.p_back_within(2.0) > overall.p_back_within(2.0) > large.p_back_within(2.0)


def test_closed_without_return_counts_as_never_until_it_returns(predictor):
    for _ in range(50):
        predictor.observe(["finish"], 1.0)
    marks = [predictor.observe_censored(["finish"]) for _ in range(100)]
    dist = predictor.distribution(["finish"])
    assert dist.p_back_ever < 0.3
    assert math.isinf(dist.median())
    for mark in marks:  # they all came back after all
        predictor.retract(mark)
        predictor.observe(["finish"], 120.0, count_mix=False)
    assert predictor.distribution(["finish"]).p_back_ever > 0.95


def test_tool_names_are_normalised():
    assert tool_keys([]) == (NO_TOOL,)
    assert tool_keys(["b", "a", "b"]) == ("a", "b")
    assert tool_keys(["x" * 500]) == ("x" * 64,)


def test_tool_table_is_bounded():
    predictor = ReturnTimePredictor(PolicySettings(max_tools=3))
    for i in range(10):
        predictor.observe([f"tool{i}"], 1.0)
    assert predictor.known_tools() == ["tool7", "tool8", "tool9"]


def test_learning_queued_until_read_predicts_exactly_as_learning_at_once():
    """observe() only queues (it runs on a request's way to the engine); whatever is read next
    must be what the predictor would say had every gap been learned on arrival, in order."""
    settings = PolicySettings(mode="predictive", half_life_obs=20)
    eager, lazy = ReturnTimePredictor(settings), ReturnTimePredictor(settings)
    stats_eager, stats_lazy = [SessionGapStats() for _ in range(3)], [SessionGapStats() for _ in range(3)]
    rng = np.random.default_rng(7)
    tools = [["bash"], ["edit"], ["bash", "read"], []]
    for i in range(300):
        tool, gap, s = tools[i % 4], float(rng.lognormal(0.0, 1.0)), i % 3
        eager.observe(tool, gap, stats_eager[s], context_tokens=1000 * (i % 9))
        eager.settle()
        lazy.observe(tool, gap, stats_lazy[s], context_tokens=1000 * (i % 9))
        if i % 37 == 0:  # a read now and then, as on_turn_end does
            assert lazy.distribution(["bash"], stats_lazy[s]).median() == eager.distribution(["bash"], stats_eager[s]).median()
        if i % 50 == 49:
            mark_e, mark_l = eager.observe_censored(["edit"], 5000), lazy.observe_censored(["edit"], 5000)
            eager.retract(mark_e)
            lazy.retract(mark_l)
    for s in range(3):
        assert lazy.session_scale(stats_lazy[s]) == eager.session_scale(stats_eager[s])
        np.testing.assert_array_equal(
            lazy.next_reply_distribution(stats_lazy[s], 4000).pmf, eager.next_reply_distribution(stats_eager[s], 4000).pmf
        )
    assert lazy.known_tools() == eager.known_tools()
