"""GapDistribution's scalar reads (plain floats, bisect) give exactly the numpy formulas' numbers."""

import math

import numpy as np
import pytest

from sidecar.policy.distribution import GapDistribution, LogTimeGrid


def _numpy_cdf(dist, t):
    """The scalar cdf as it was: the grid's position rule in math, numpy arrays indexed."""
    grid = dist.grid
    x = max(t / dist.scale, 0.0)
    if x < grid.min_s:
        pos = x / grid.min_s
    else:
        pos = min(1.0 + math.log10(x / grid.min_s) * grid.bins_per_decade, float(grid.n_finite))
    idx = min(int(math.floor(pos)), grid.n_finite - 1)
    return float(dist._cdf_at_edges[idx] + (pos - idx) * dist.pmf[idx])


def _numpy_quantile(dist, q, elapsed=0.0):
    f_a = _numpy_cdf(dist, elapsed) if elapsed > 0 else 0.0
    target = f_a + q * (1.0 - f_a)
    cdf = dist._cdf_at_edges
    if target > cdf[-1] + 1e-12:
        return math.inf
    i = int(np.searchsorted(cdf, target, side="left"))
    if i == 0:
        return 0.0
    lo_edge = i - 1
    mass = dist.pmf[lo_edge]
    frac = 0.0 if mass <= 0 else (target - cdf[lo_edge]) / mass
    pos = lo_edge + min(max(frac, 0.0), 1.0)
    t = pos * dist.grid.min_s if pos <= 1.0 else dist.grid.min_s * 10 ** ((pos - 1.0) / dist.grid.bins_per_decade)
    return float(max(t * dist.scale - elapsed, 0.0))


def test_scalar_reads_equal_the_numpy_formulas():
    grid = LogTimeGrid(min_s=0.01, horizon_s=3600.0)
    rng = np.random.default_rng(3)
    for _ in range(200):
        pmf = rng.random(grid.size) * (rng.random(grid.size) < 0.4)
        pmf[grid.overflow] = rng.random() * 3
        dist = GapDistribution(grid, pmf, float(rng.choice([1.0, 0.3, 4.0])))
        for copy in (dist, dist.scaled(2.5)):
            for t in [0.0, 0.003, 0.01, *rng.lognormal(0.0, 3.0, 20), 4000.0]:
                assert copy.cdf(float(t)) == _numpy_cdf(copy, float(t))
                assert copy.cdf(float(t)) == pytest.approx(float(copy.cdf(np.array([t]))[0]), abs=1e-12)
                for q in (0.0, 0.2, 0.5, 0.97):
                    assert copy.quantile(q, float(t)) == _numpy_quantile(copy, q, float(t))
            assert copy.p_back_ever == float(copy._cdf_at_edges[-1])


def test_scaled_shares_the_shape_and_stretches_time():
    grid = LogTimeGrid()
    dist = GapDistribution(grid, grid.lognormal_pmf(2.0, 1.0))
    slow = dist.scaled(3.0)
    assert slow.pmf is dist.pmf and slow.scale == 3.0
    assert slow.median() == GapDistribution(grid, grid.lognormal_pmf(2.0, 1.0), 3.0).median()
    assert dist.scale == 1.0
