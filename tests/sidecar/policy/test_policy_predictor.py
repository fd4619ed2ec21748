"""The return-time predictor: per-tool learning, adaptation, elapsed time, sessions, censoring."""

import math

import numpy as np
import pytest

from sidecar.policy.distribution import GapDistribution
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


# --- cached reads: the same numbers as computing each read afresh (the code before the caches) ---


def _old_global_pmf(p):
    k0 = p.settings.prior_weight
    total = p._global.total
    if total + k0 <= 0:
        return p._prior.copy()
    return (p._global.counts + k0 * p._prior) / (total + k0)


def _old_key_pmf(p, key, global_pmf=None):
    if key == NO_TOOL:
        global_pmf = p._final_answer_prior
    elif global_pmf is None:
        global_pmf = _old_global_pmf(p)
    hist = p._tools.get(key)
    if hist is None:
        return global_pmf
    k1 = p.settings.tool_shrinkage
    total = hist.total
    if total + k1 <= 0:
        return global_pmf
    return (hist.counts + k1 * global_pmf) / (total + k1)


def _old_distribution(p, tools, session):
    keys = tool_keys(tools)
    if len(keys) == 1:
        key = keys[0]
    else:
        medians = {k: GapDistribution(p.grid, _old_key_pmf(p, k)).median() for k in keys}
        key = max(keys, key=lambda k: (medians[k], k))
    return GapDistribution(p.grid, _old_key_pmf(p, key), p._scale(session, key == NO_TOOL))


def _old_next_reply(p, session, context_tokens):
    weights = {k: w for k, w in p._population_mix(context_tokens).items() if w > 0 and k in p._tools}
    total = sum(weights.values())
    global_pmf = _old_global_pmf(p)
    if total <= 0:
        pmf = global_pmf
    else:
        pmf = sum(w / total * _old_key_pmf(p, k, global_pmf) for k, w in weights.items())
    return GapDistribution(p.grid, pmf, p._scale(session))


_TIMES = [0.0, 0.004, 0.01, 0.05, 0.3, 1.0, 2.5, 9.0, 40.0, 300.0, 3000.0, 5000.0]


def _assert_same(new, old):
    np.testing.assert_array_equal(new.pmf, old.pmf)
    np.testing.assert_array_equal(new._cdf_at_edges, old._cdf_at_edges)
    assert new.scale == old.scale
    np.testing.assert_array_equal(new.cdf(np.array(_TIMES)), old.cdf(np.array(_TIMES)))
    for t in _TIMES:
        assert new.cdf(t) == old.cdf(t)
        for q in (0.05, 0.2, 0.5, 0.9):
            assert new.quantile(q, t) == old.quantile(q, t)


def test_cached_reads_equal_a_fresh_computation_through_any_sequence_of_learning():
    """Reads come from caches kept per tool and per context size; through a random mix of gaps,
    censored sessions, retractions, several-tool replies, final answers and tools dropped for
    room, every read must be exactly what computing it afresh gives (the code before the caches),
    also right after the caches are emptied."""
    p = ReturnTimePredictor(PolicySettings(mode="predictive", half_life_obs=15, max_tools=6))
    rng = np.random.default_rng(11)
    names = [f"t{i}" for i in range(9)]
    sessions = [SessionGapStats() for _ in range(4)]
    marks = []
    reads = 0

    def tools():
        r = rng.random()
        if r < 0.15:
            return []
        if r < 0.3:
            return list(rng.choice(names, 2, replace=False))
        return [names[int(rng.integers(len(names)))]]

    for step in range(1500):
        r = rng.random()
        session = sessions[int(rng.integers(4))] if rng.random() < 0.8 else None
        context = int(rng.choice([0, 3000, 9000, 70_000]))
        if r < 0.35:
            p.observe(tools(), float(rng.lognormal(0.0, 1.5)), session, context_tokens=context or None)
        elif r < 0.42:
            marks.append(p.observe_censored(tools(), context_tokens=context or None))
        elif r < 0.47 and marks:
            p.retract(marks.pop(int(rng.integers(len(marks)))))
        elif r < 0.75:
            asked = tools()
            _assert_same(p.distribution(asked, session), _old_distribution(p, asked, session))
            reads += 1
        else:
            _assert_same(p.next_reply_distribution(session, context or None), _old_next_reply(p, session, context or None))
            reads += 1
        if step % 250 == 249:
            before = {tuple(n): p.distribution(n, sessions[0]) for n in ([], ["t1"], ["t2", "t3"])}
            p._shapes.clear()
            p._mixtures.clear()
            p._global_shape = None
            for n, dist in before.items():
                _assert_same(dist, p.distribution(list(n), sessions[0]))
    assert reads > 600


def test_a_cached_distribution_changes_once_an_observation_settles():
    """The caches cannot go stale: a read after a gap is learned (or a censored session counted, or
    taken back) sees it, for the tool itself, the tools shrunk toward the global histogram, final
    answers and the mixture before a reply; a session's speed factor applies to a cached shape."""
    p = ReturnTimePredictor(PolicySettings(mode="predictive", half_life_obs=30))
    for _ in range(20):
        p.observe(["bash"], 1.0, context_tokens=5000)
        p.observe(["edit"], 0.2, context_tokens=5000)
        p.observe([], 10.0, context_tokens=5000)

    def reads():
        return [p.distribution(["bash"]), p.distribution(["edit"]), p.distribution([]),
                p.next_reply_distribution(None, 5000), p.next_reply_distribution()]

    def changed(a, b):
        return [not np.array_equal(x.pmf, y.pmf) for x, y in zip(a, b)]

    first = reads()
    assert changed(first, reads()) == [False] * 5  # nothing learned: the same
    p.observe(["bash"], 30.0, context_tokens=5000)
    second = reads()
    assert changed(first, second) == [True, True, False, True, True]  # final answers: their own prior
    assert second[0].median() > first[0].median()
    p.observe([], 200.0)
    third = reads()
    assert changed(second, third) == [True, True, True, True, True]
    mark = p.observe_censored(["edit"], 5000)
    fourth = reads()
    assert changed(third, fourth) == [True, True, False, True, True]
    assert fourth[1].p_back_ever < third[1].p_back_ever
    p.retract(mark)
    assert changed(fourth, reads()) == [True, True, False, True, True]
    slow = SessionGapStats()
    for _ in range(10):
        p.observe(["bash"], 40.0, slow)
    assert p.distribution(["bash"], slow).median() > 2 * p.distribution(["bash"]).median()
    assert p.distribution(["bash"], slow).pmf is p.distribution(["bash"]).pmf  # one shape, two scales


def test_cached_arrays_are_read_only():
    """Reads share one cached shape: a caller writing into it would change every later read."""
    p = ReturnTimePredictor(PolicySettings(mode="predictive"))
    p.observe(["bash"], 1.0)
    dist = p.distribution(["bash"])
    with pytest.raises(ValueError):
        dist.pmf[0] = 1.0
    with pytest.raises(ValueError):
        p.next_reply_distribution()._cdf_at_edges[1] = 0.5
