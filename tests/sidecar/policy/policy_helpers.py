"""Shared helpers for the policy tests (a fake clock, distributions, a policy factory)."""

from __future__ import annotations

import numpy as np
from prometheus_client import CollectorRegistry

from sidecar.policy.base import EngineCapacity
from sidecar.policy.distribution import GapDistribution, LogTimeGrid
from sidecar.policy.lease_policy import LeasePolicy
from sidecar.policy.settings import AdmissionSettings, PolicySettings


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


GRID = LogTimeGrid(min_s=0.01, horizon_s=3600.0)


def mixture(components, never: float = 0.0, sigma: float = 0.15) -> GapDistribution:
    """A gap distribution: [(probability, median seconds), ...] plus P(never back)."""
    pmf = np.zeros(GRID.size)
    for p, median in components:
        pmf += p * GRID.lognormal_pmf(median, sigma)
    pmf[GRID.overflow] += never
    return GapDistribution(GRID, pmf)


def make_policy(clock=None, capacity=100_000, registry=None, policy=None, admission=None, **table):
    return LeasePolicy(
        PolicySettings(**(policy or {"mode": "predictive"})),
        AdmissionSettings(**(admission or {})),
        EngineCapacity(capacity),
        registry=registry or CollectorRegistry(),
        clock=clock or FakeClock(),
        **table,
    )
