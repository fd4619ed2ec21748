"""How the door learns the tokens a turn adds (``Projection.learn_growth``).

What a user relies on: a wave of agents starting together is not admitted on the growth of its
shortest first turns (they end first), and the learned growth still follows the workload."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.policy.projection import Projection
from sidecar.policy.settings import AdmissionSettings
from sidecar.settings import load_settings

PRESET = Path(__file__).resolve().parents[3] / "configs" / "coding-agent.toml"


def preset_projection() -> Projection:
    return Projection(load_settings(PRESET, {}).admission, predictor=None)


def test_the_first_turns_to_end_do_not_set_the_growth_alone():
    """The 48-agent overload adds 954 tokens a turn; its first 30 turns to end added ~650 (a short
    reply decodes sooner): the growth the door projects stays near the 1,100 prior, not at 650."""
    projection = preset_projection()
    for _ in range(30):
        projection.learn_growth(650)
    assert projection.growth_tokens > 900


def test_the_learned_growth_follows_the_workload():
    projection = preset_projection()
    for _ in range(30):
        projection.learn_growth(650)
    for _ in range(600):
        projection.learn_growth(954)
    assert projection.growth_tokens == pytest.approx(954, rel=0.02)
    for _ in range(600):  # the workload changes: re-learned within a few hundred turns
        projection.learn_growth(2_000)
    assert projection.growth_tokens == pytest.approx(2_000, rel=0.02)


def test_without_prior_turns_the_growth_is_an_exponential_average():
    projection = Projection(AdmissionSettings(expected_growth_tokens=1_100), predictor=None)
    projection.learn_growth(2_100)
    assert projection.growth_tokens == pytest.approx(1_200)
