"""How long SGLang should keep a session's KV after a turn (the lease TTL).

Modes: ``off`` = no lease (None), ``fixed`` = ``fixed_ttl`` for every turn, ``predictive`` =

    T* = argmax_T  P(back within T | elapsed) * R(N)  -  c(N) * E[min(gap - elapsed, T)]

clamped to [min_ttl, max_ttl], where
    R(N) = recompute_s_per_token * N * (1 + N / recompute_quadratic_tokens)   engine seconds saved
                                                                              by a hit,
    c(N) = kv_cost_weight * N * (1 + kv_pressure_gain * resident_fraction)     engine seconds per
                                                                              second of holding.
Holding costs only until the session returns, hence E[min(gap, T)]. Equivalently, extending the
lease pays while the return hazard f(T) / (1 - F(T)) exceeds c(N) / R(N): the lease grows with the
context (R grows faster than c) and with the probability of coming back, and shrinks as the pool
fills. Of leases within 1% of the best saving the shortest is taken (once the session is surely
back, a longer lease gains nothing). This is Continuum's rule ("hold while P(return <= t) x reload cost > memory x t") with the
expected, not worst-case, holding time.
"""

from __future__ import annotations

import numpy as np

from sidecar.policy.distribution import GapDistribution
from sidecar.policy.settings import PolicySettings

NEAR_BEST = 0.01  # a longer lease must add more than 1% to the expected saving to be chosen


class LeaseTtlRule:
    def __init__(self, settings: PolicySettings):
        self.settings = settings
        lo = settings.min_ttl
        hi = settings.max_ttl
        grid = np.geomspace(min(0.01, hi), hi, 200)
        self._times = np.unique(np.concatenate(([0.0, lo, hi], grid)))
        self._candidates = self._times >= lo
        self._steps = np.diff(self._times)  # constant: not recomputed per lease

    def recompute_cost_s(self, tokens: float) -> float:
        """Engine seconds to recompute a context of ``tokens`` tokens."""
        q = self.settings.recompute_quadratic_tokens
        quad = 1.0 + (tokens / q if q > 0 else 0.0)
        return self.settings.recompute_s_per_token * tokens * quad

    def hold_cost_rate(self, tokens: float, resident_fraction: float = 0.0) -> float:
        """Engine seconds charged per second of holding ``tokens`` idle tokens."""
        pressure = 1.0 + self.settings.kv_pressure_gain * max(resident_fraction, 0.0)
        return self.settings.kv_cost_weight * tokens * pressure

    def ttl(
        self,
        dist: GapDistribution | None,
        tokens: int,
        elapsed: float = 0.0,
        resident_fraction: float = 0.0,
    ) -> float | None:
        """The lease TTL the mode asks for; None = no lease."""
        mode = self.settings.mode
        if mode == "off":
            return None
        if mode == "fixed":
            return self.settings.fixed_ttl if self.settings.fixed_ttl > 0 else None
        if dist is None or tokens <= 0:
            return self.settings.min_ttl
        return self.predictive_ttl(dist, tokens, elapsed, resident_fraction)

    def predictive_ttl(
        self, dist: GapDistribution, tokens: int, elapsed: float = 0.0, resident_fraction: float = 0.0
    ) -> float:
        """The shortest lease within 1% of the best expected saving (min_ttl if none saves)."""
        saving = np.where(self._candidates, self.expected_saving(dist, tokens, elapsed, resident_fraction), -np.inf)
        best = float(saving.max())
        if best <= 0:
            return float(self.settings.min_ttl)
        good_enough = int(np.argmax(saving >= best * (1 - NEAR_BEST)))
        return float(self._times[good_enough])

    def expected_saving(
        self, dist: GapDistribution, tokens: int, elapsed: float = 0.0, resident_fraction: float = 0.0
    ) -> np.ndarray:
        """Expected engine seconds saved by a lease of each length in ``self.times``."""
        back = np.asarray(dist.p_back_within(self._times, elapsed))
        survival = 1.0 - back
        held = np.empty_like(back)
        held[0] = 0.0
        np.cumsum(self._steps * (survival[1:] + survival[:-1]) / 2, out=held[1:])
        return back * self.recompute_cost_s(tokens) - self.hold_cost_rate(tokens, resident_fraction) * held

    @property
    def times(self) -> np.ndarray:
        return self._times
