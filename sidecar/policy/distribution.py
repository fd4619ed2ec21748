"""Gap distributions on a log-time grid.

A distribution is a probability mass function over bins: bin 0 = [0, min_s], then
``bins_per_decade`` log-spaced bins up to the horizon, then one overflow bin = "not back within the
horizon" (the session ended or went idle for good). The CDF is piecewise linear in t inside bin 0
and in log t above it. A ``scale`` stretches time (a slow session: F_s(t) = F(t / scale)); the
overflow mass is not stretched.
"""

from __future__ import annotations

import math
from bisect import bisect_left

import numpy as np


class LogTimeGrid:
    """Bin edges shared by every histogram of one predictor."""

    def __init__(self, min_s: float = 0.01, horizon_s: float = 3600.0, bins_per_decade: int = 10):
        if not 0 < min_s < horizon_s:
            raise ValueError("need 0 < min_s < horizon_s")
        self.min_s = float(min_s)
        self.bins_per_decade = int(bins_per_decade)
        log_bins = math.ceil(math.log10(horizon_s / min_s) * bins_per_decade - 1e-9)
        self.horizon_s = min_s * 10 ** (log_bins / bins_per_decade)
        # edges[0] = 0, edges[1] = min_s, ..., edges[n_finite] = horizon
        self.edges = np.concatenate(([0.0], min_s * 10 ** (np.arange(log_bins + 1) / bins_per_decade)))
        self.n_finite = log_bins + 1  # finite bins: [0, min_s] and the log-spaced ones
        self.size = self.n_finite + 1  # plus the overflow bin

    @property
    def overflow(self) -> int:
        return self.n_finite

    def bin_of(self, gap_s: float | None) -> int:
        """Bin index of one gap; None or > horizon goes to the overflow bin."""
        if gap_s is None or gap_s > self.horizon_s:
            return self.overflow
        if gap_s <= self.min_s:
            return 0
        return min(int(np.searchsorted(self.edges, gap_s, side="left")) - 1, self.n_finite - 1)

    def position(self, t) -> np.ndarray:
        """Fractional edge index of each time (0 at t=0, 1 at min_s, n_finite at the horizon)."""
        t = np.maximum(np.asarray(t, dtype=float), 0.0)
        # log10 of a positive number: no warning to silence (np.errstate cost more than the math)
        logpos = 1.0 + np.log10(np.maximum(t, 1e-300) / self.min_s) * self.bins_per_decade
        pos = np.where(t < self.min_s, t / self.min_s, logpos)
        return np.clip(pos, 0.0, float(self.n_finite))

    def lognormal_pmf(self, median_s: float, sigma: float) -> np.ndarray:
        """Discretised log-normal; its mass beyond the horizon goes to the overflow bin."""
        from math import erf, log, sqrt

        def cdf(x: float) -> float:
            if x <= 0:
                return 0.0
            return 0.5 * (1 + erf((log(x) - log(median_s)) / (sigma * sqrt(2))))

        at_edges = np.array([cdf(e) for e in self.edges])
        pmf = np.empty(self.size)
        pmf[: self.n_finite] = np.diff(at_edges)
        pmf[self.overflow] = 1.0 - at_edges[-1]
        return pmf


class GapDistribution:
    """P(back within t), optionally given that ``elapsed`` seconds passed without a return."""

    __slots__ = ("grid", "pmf", "scale", "_cdf_at_edges", "_cdf_list", "_pmf_list")

    def __init__(self, grid: LogTimeGrid, pmf: np.ndarray, scale: float = 1.0):
        total = float(pmf.sum())
        self.grid = grid
        self.pmf = pmf / total if total > 0 else grid.lognormal_pmf(1.0, 1.0)
        self.scale = float(scale)
        self._cdf_at_edges = cdf = np.empty(grid.n_finite + 1)
        cdf[0] = 0.0
        np.cumsum(self.pmf[: grid.n_finite], out=cdf[1:])
        # read-only: scaled() copies share them (the predictor caches one shape per tool)
        self.pmf.flags.writeable = False
        cdf.flags.writeable = False
        self._cdf_list: list[float] | None = None  # plain-float copies for the scalar reads
        self._pmf_list: list[float] | None = None

    def _lists(self) -> tuple[list[float], list[float]]:
        """The cdf at the edges and the pmf as lists, made on the first scalar read (then shared
        by scaled() copies made later): a scalar read then indexes no numpy array."""
        if self._cdf_list is None:
            self._cdf_list = self._cdf_at_edges.tolist()
            self._pmf_list = self.pmf.tolist()
        return self._cdf_list, self._pmf_list

    def scaled(self, scale: float) -> GapDistribution:
        """The same shape stretched by ``scale``, sharing the arrays (no array work)."""
        self._lists()
        new = object.__new__(GapDistribution)
        new.grid = self.grid
        new.pmf = self.pmf
        new.scale = float(scale)
        new._cdf_at_edges = self._cdf_at_edges
        new._cdf_list = self._cdf_list
        new._pmf_list = self._pmf_list
        return new

    def cdf(self, t) -> np.ndarray | float:
        """P(back within t) for t >= 0 (scalar or array; a scalar in plain floats, no array round trip)."""
        if isinstance(t, (int, float)):
            return self._cdf_scalar(float(t))
        pos = self.grid.position(np.asarray(t, dtype=float) / self.scale)
        idx = np.minimum(np.floor(pos).astype(int), self.grid.n_finite - 1)
        frac = pos - idx
        out = self._cdf_at_edges[idx] + frac * self.pmf[idx]
        return float(out) if np.ndim(out) == 0 else out

    def _cdf_scalar(self, t: float) -> float:
        """``cdf`` of one time, with the grid's position rule in math (same values)."""
        grid = self.grid
        x = max(t / self.scale, 0.0)
        if x < grid.min_s:
            pos = x / grid.min_s
        else:
            pos = min(1.0 + math.log10(x / grid.min_s) * grid.bins_per_decade, float(grid.n_finite))
        idx = min(int(math.floor(pos)), grid.n_finite - 1)
        cdf, pmf = self._lists()
        return cdf[idx] + (pos - idx) * pmf[idx]

    @property
    def p_back_ever(self) -> float:
        """P(back within the horizon)."""
        return float(self._cdf_at_edges[-1])

    def p_back_within(self, t, elapsed: float = 0.0):
        """P(back by elapsed + t | not back by elapsed)."""
        f_a = self.cdf(float(elapsed))
        survival = 1.0 - f_a
        if survival <= 1e-12:
            return np.zeros_like(np.asarray(t, dtype=float)) if np.ndim(t) else 0.0
        return (self.cdf(np.asarray(t, dtype=float) + elapsed) - f_a) / survival

    def quantile(self, q: float, elapsed: float = 0.0) -> float:
        """Smallest t with P(back within t | elapsed) >= q; inf if the horizon holds less than q."""
        f_a = self._cdf_scalar(float(elapsed)) if elapsed > 0 else 0.0  # cdf(t <= 0) is 0
        target = f_a + q * (1.0 - f_a)
        cdf, pmf = self._lists()
        if target > cdf[-1] + 1e-12:
            return math.inf
        i = bisect_left(cdf, target)  # = np.searchsorted(side="left"): the cdf is sorted
        if i == 0:
            return 0.0
        lo_edge = i - 1
        mass = pmf[lo_edge]
        frac = 0.0 if mass <= 0 else (target - cdf[lo_edge]) / mass
        pos = lo_edge + min(max(frac, 0.0), 1.0)
        if pos <= 1.0:
            t = pos * self.grid.min_s
        else:
            t = self.grid.min_s * 10 ** ((pos - 1.0) / self.grid.bins_per_decade)
        return float(max(t * self.scale - elapsed, 0.0))

    def median(self, elapsed: float = 0.0) -> float:
        return self.quantile(0.5, elapsed)
