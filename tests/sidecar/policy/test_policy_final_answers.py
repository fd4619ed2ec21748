"""Final answers (replies without tool calls): end-of-session leases, human-paced sessions."""

import numpy as np
import pytest
from policy_helpers import FakeClock, on_store

from sidecar.policy import EngineCapacity, TurnEnd, build_policy
from sidecar.policy.distribution import GapDistribution, LogTimeGrid
from sidecar.policy.final_answers import FinalAnswerStats, with_chance_of_return
from sidecar.policy.predictor import ReturnTimePredictor, SessionGapStats
from sidecar.policy.settings import PolicySettings
from sidecar.settings import load_settings

CONTEXT = 40_000


def policy_and_clock():
    settings = load_settings("configs/coding-agent.toml", {"server": {"session_idle_grace": 5.0}})
    clock = FakeClock()
    return on_store(build_policy(settings, EngineCapacity(0), clock=clock)), clock, settings


def turn(policy, clock, sid, tools, service_s=1.0):
    """One request and its reply; the lease after the turn (the after-turn channel's)."""
    policy.sessions.open(sid)
    policy.on_request(sid, CONTEXT, clock.now)
    policy.lease_request(sid, CONTEXT, clock.now)
    clock.advance(service_s)
    policy.on_turn_end(TurnEnd(sid, CONTEXT, tools, clock.now))
    return policy.after_turn(sid, clock.now)


def sessions_that_end_with_a_final_answer(policy, clock, n=6):
    """Agents that call tools (back after 1 s) and end with a final answer, never to return."""
    for i in range(n):
        for _ in range(4):
            turn(policy, clock, f"done-{i}", ["bash"])
            clock.advance(1.0)
        turn(policy, clock, f"done-{i}", [])
        for _ in range(700):  # past lease + idle grace: the store closes it (learned as "not back")
            clock.advance(1.0)
            policy.sessions.close_due(clock.now)


def test_a_final_answer_gets_the_short_end_of_session_lease_once_final_answers_end_sessions():
    policy, clock, settings = policy_and_clock()
    sessions_that_end_with_a_final_answer(policy, clock)
    assert turn(policy, clock, "new", ["bash"]).ttl_s >= 1.0  # a tool call keeps the predicted lease
    clock.advance(1.0)
    final = turn(policy, clock, "new", [])
    assert final.ttl_s == settings.policy.final_answer_ttl and final.expected_back_s is None


def test_a_session_that_comes_back_after_final_answers_is_human_paced_and_keeps_its_lease():
    """Same population (final answers end sessions), but this agent waits for a person: it came
    back 20 s after each of its final answers, so its next one is leased past 20 s."""
    policy, clock, settings = policy_and_clock()
    sessions_that_end_with_a_final_answer(policy, clock)
    for _ in range(3):
        turn(policy, clock, "chat", ["bash"])
        clock.advance(1.0)
        turn(policy, clock, "chat", [])
        clock.advance(20.0)  # a person reads the answer and writes again
    lease = turn(policy, clock, "chat", [])
    assert lease.ttl_s > 20.0 and lease.expected_back_s is not None


def test_a_final_answer_is_predicted_human_paced_before_anything_is_learned():
    """Cold: a final answer's gap is not the tools' (1 s prior) but a person's (15 s prior)."""
    policy, clock, _ = policy_and_clock()
    lease = turn(policy, clock, "first", [])
    assert lease.expected_back_s > 5.0


def test_gaps_after_final_answers_do_not_stretch_the_sessions_tool_gaps():
    predictor = ReturnTimePredictor(PolicySettings(mode="predictive"))
    for _ in range(200):
        predictor.observe(["bash"], 1.0)
        predictor.observe([], 20.0)
    session = SessionGapStats()
    for _ in range(10):
        predictor.observe(["bash"], 1.0, session)
        predictor.observe([], 120.0, session)  # a slow reader, quick tools
    assert predictor.distribution(["bash"], session).median() == pytest.approx(
        predictor.distribution(["bash"]).median(), rel=0.3
    )
    assert predictor.distribution([], session).median() > 3 * predictor.distribution([]).median()
    assert session.returns_after_final == 10


def test_return_probability_after_final_answers():
    stats = FinalAnswerStats(decay=1.0)
    assert stats.p_population() == 0.5  # nothing known
    for _ in range(8):
        stats.ended()
    assert stats.p_return(0, 4.0) < 0.2  # sessions end after final answers
    assert stats.p_return(4, 4.0) > 0.5  # this one came back four times: human-paced
    stats.returned(retracted_end=True)  # one that ended came back after all
    assert stats.ends == 7 and stats.returns == 1


def test_with_chance_of_return_is_the_mixture_with_never_back():
    """Built without a "never back" array: the same bits as p * pmf + (1 - p) * never."""
    grid = LogTimeGrid()
    dist = GapDistribution(grid, grid.lognormal_pmf(3.0, 1.2), 1.7)
    for p in (0.0, 0.3, 0.77, 1.0):
        never = np.zeros(grid.size)
        never[grid.overflow] = 1.0
        old = GapDistribution(grid, p * dist.pmf + (1.0 - p) * never, dist.scale)
        new = with_chance_of_return(dist, p)
        np.testing.assert_array_equal(new.pmf, old.pmf)
        np.testing.assert_array_equal(new._cdf_at_edges, old._cdf_at_edges)
        assert new.scale == old.scale
