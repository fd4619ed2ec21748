"""Simulator pieces that need no SGLang: the CLI stays light, the cost model's arithmetic."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest

from sidecar_tools.simulator.cli import parse_sidecar_policy
from sidecar_tools.simulator.costmodel import DEFAULT_CALIBRATION, CostModel, load_calibration


def test_cli_help_does_not_import_sglang_or_torch():
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from sidecar.cli import main\n"
        "r = CliRunner().invoke(main, ['--help'])\n"
        "assert r.exit_code == 0 and 'simulate' in r.output, r.output\n"
        "r = CliRunner().invoke(main, ['simulate', '--help'])\n"
        "assert r.exit_code == 0 and '--kv-tokens' in r.output and 'calibrate' in r.output, r.output\n"
        "heavy = [m for m in ('sglang', 'torch', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_sidecar_policy_flag():
    assert parse_sidecar_policy("none") is None
    assert parse_sidecar_policy("off") == {"mode": "off"}
    assert parse_sidecar_policy("predictive") == {"mode": "predictive"}
    assert parse_sidecar_policy("fixed:12.5") == {"mode": "fixed", "fixed_ttl": 12.5}
    assert parse_sidecar_policy("fixed") == {"mode": "fixed"}
    with pytest.raises(click.BadParameter):
        parse_sidecar_policy("sometimes")


def test_decode_jump_equals_single_steps():
    m = CostModel(step_s=0.005, decode_seq_s=1e-4, decode_ctx_token_s=3e-8)
    batch, ctx = 7, 70_000
    single = sum(m.decode_time(batch, ctx + i * batch) for i in range(50))
    assert m.decode_jump_time(batch, ctx, 50) == pytest.approx(single)
    for dt in (0.0, 0.001, 0.05, 0.3333, 2.0):
        k = m.decode_steps_to_reach(batch, ctx, dt)
        assert m.decode_jump_time(batch, ctx, k) >= dt
        assert k == 1 or m.decode_jump_time(batch, ctx, k - 1) < dt


def test_prefill_time_counts_causal_attention():
    m = CostModel(step_s=0.0, prefill_token_s=1e-5, prefill_pair_ratio=1e-4)
    # 10 new tokens on 100 cached: 10 * 100 + 10 * 11 / 2 pairs
    assert m.prefill_time([(10, 100)]) == pytest.approx(1e-5 * 10 + 1e-9 * (1000 + 55))
    assert m.prefill_time([(10, 0), (5, 5)]) == pytest.approx(1e-5 * 15 + 1e-9 * (55 + 25 + 15))


def test_committed_calibration_names_its_sources():
    model, doc = load_calibration()
    assert isinstance(model, CostModel)
    names = {s["name"] for s in doc["sources"]}
    assert {"lru-0.5s", "unconstrained-0.5s"} <= names
    assert doc["fit"]["fit_targets"] and all(s.get("gpu") is None or "makespan_s" in s["gpu"] for s in doc["sources"])
    json.dumps(doc)  # plain JSON
    assert DEFAULT_CALIBRATION.name.endswith(".json")
