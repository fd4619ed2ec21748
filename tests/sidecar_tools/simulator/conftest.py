"""Fixtures for the simulator tests. SGLang is imported lazily (tests that need it skip without it)."""

from __future__ import annotations

import pytest

# A small trace under KV pressure: 8 sessions x 6 turns of the reference workload in 24,000 tokens.
SMALL = {"preset": "reference", "sessions": 8, "turns": 6, "kv_tokens": 24_000}


@pytest.fixture(scope="session")
def cost():
    pytest.importorskip("sglang")
    from sidecar_tools.simulator.costmodel import load_calibration

    return load_calibration()[0]


@pytest.fixture(scope="session")
def simulate(cost):
    """``simulate(**spec)`` -> (summary, records, run) of one virtual-time replay."""
    from sidecar_tools.simulator.calibrate import simulate_spec

    def run(**spec):
        return simulate_spec({**SMALL, **spec}, cost)

    return run
