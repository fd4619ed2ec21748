"""Policy settings and the shipped presets."""

from pathlib import Path

import pytest
from pydantic import ValidationError

from sidecar.policy.settings import AdmissionSettings, PolicySettings
from sidecar.settings import iter_fields, load_settings

CONFIGS = sorted((Path(__file__).parents[3] / "configs").glob("*.toml"))


def test_every_policy_and_admission_field_is_documented_and_simple():
    for section, name, info in iter_fields():
        if section in ("policy", "admission"):
            assert info.description, f"{section}.{name} has no description"
            assert info.annotation in (str, int, float, bool) or "Literal" in str(info.annotation), name


@pytest.mark.parametrize("name", ["coding-agent.toml", "interactive-chat.toml"])
def test_presets_exist_and_load(name):
    assert name in [c.name for c in CONFIGS]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_each_preset_is_valid_and_sets_every_policy_field(path):
    settings = load_settings(path)
    text = path.read_text()
    for field in list(PolicySettings.model_fields) + list(AdmissionSettings.model_fields):
        assert f"\n{field} =" in text, f"{path.name} does not set {field}"
    assert settings.policy.mode == "predictive"


def test_inconsistent_bounds_are_rejected():
    with pytest.raises(ValidationError):
        PolicySettings(min_ttl=10, max_ttl=5)
    with pytest.raises(ValidationError):
        PolicySettings(max_ttl=7200, horizon_s=3600)


def test_flags_override_the_file():
    settings = load_settings(CONFIGS[0], {"policy": {"mode": "fixed", "fixed_ttl": "12"}})
    assert settings.policy.mode == "fixed" and settings.policy.fixed_ttl == 12.0
