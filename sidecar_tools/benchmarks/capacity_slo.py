"""The capacity benchmark's rules: the steady window, the latency SLO, and the search for the largest
arrival rate that meets it. Pure functions of turn records and rates (no engine, no HTTP), so the
simulator and the GPU driver judge a run by the same code.

Steady window. A run has warm-up + measure + cool-down arrivals; only the measured ones (the
middle of the arrival order) count. Warm-up lets the system fill (the first sessions see an empty
engine); cool-down keeps sessions arriving while the measured ones run, so the last measured
sessions do not finish in an emptying system (the drain); the run is cut ``drain_s`` after the
last arrival.

SLO. Over the measured sessions: TTFT p99 of later turns (turn >= 1) <= 2 s and of first turns
(turn 0; TTFT runs from the request's send, so a wait at the sidecar's admission door is inside it)
<= 10 s. A planned turn of a measured session that did not end with a first token (failed,
refused with 429, cancelled at the time limit, never sent) counts as an infinite TTFT: it misses the
SLO, so a rate that does not finish its measured sessions in time cannot pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from sidecar_tools.benchmarks.records import TurnRecord

PERCENTILE = 99.0


@dataclass(frozen=True)
class Window:
    """Counted in arrivals, in arrival order: the first ``warmup`` sessions fill the system, the
    next ``measure`` are measured, ``cooldown`` more keep arriving while those run; the run is cut
    ``drain_s`` after the last arrival. In sessions, not seconds, so that every rate measures the
    same sessions (``open_loop``'s common random numbers)."""

    warmup: int = 20
    measure: int = 40
    cooldown: int = 20
    drain_s: float = 120.0

    def __post_init__(self) -> None:
        for name in ("warmup", "cooldown"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 sessions, got {getattr(self, name)}")
        if self.measure < 1:
            raise ValueError(f"measure must be >= 1 session, got {self.measure}")
        if self.drain_s < 0:
            raise ValueError(f"drain_s must be >= 0, got {self.drain_s}")

    @property
    def sessions(self) -> int:
        return self.warmup + self.measure + self.cooldown

    def measured(self, index: int) -> bool:
        return self.warmup <= index < self.warmup + self.measure

    def time_limit_s(self, last_arrival_s: float) -> float:
        return last_arrival_s + self.drain_s

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "sessions": self.sessions, "unit": "arrivals, in arrival order",
                "time_limit": "the last arrival + drain_s"}


# Per distribution: warm-up and cool-down about the concurrency at the knee (arrival rate x session
# duration: ~20 reference agents of ~40-60 s at ~20-25/min, ~10 recorded sessions of ~20-60 s at
# ~15/min), as many measured as a GPU point can afford (80 reference arrivals take ~4 min at 20/min).
DEFAULT_WINDOWS = {"reference": Window(20, 40, 20, 120.0), "traces": Window(10, 24, 10, 150.0)}


@dataclass(frozen=True)
class SLO:
    later_turn_ttft_p99_s: float = 2.0
    first_turn_ttft_p99_s: float = 10.0

    def to_dict(self, window: Window) -> dict[str, Any]:
        return {
            **asdict(self), "percentile": PERCENTILE,
            "first_turn_includes_door_wait": True,
            "measured_sessions": "arrivals warmup .. warmup + measure - 1 (0-based, in arrival order)",
            "missing_turns": "a planned turn of a measured session without a first token (failed, 429, cut at "
                             "time_limit_s) counts as an infinite TTFT",
            "window": window.to_dict(),
        }


def percentile(values: Iterable[float], p: float = PERCENTILE) -> float | None:
    """numpy's default (linear) percentile, with ``inf`` allowed: a result that interpolates
    towards an infinite value is infinite (numpy gives nan there). None for no values."""
    xs = sorted(values)
    if not xs:
        return None
    pos = (len(xs) - 1) * p / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    a, b = xs[lo], xs[hi]
    if lo == hi or a == b:
        return a
    if math.isinf(b):
        return math.inf
    return a + (b - a) * (pos - lo)


@dataclass
class PointResult:
    """One arrival rate's run judged against the SLO (``to_dict`` is a ``points`` entry)."""

    rate_per_min: float
    meets_slo: bool
    later_turn_ttft_p99_s: float | None
    first_turn_ttft_p99_s: float | None
    later_turn_ttft_p50_s: float | None
    first_turn_ttft_p50_s: float | None
    sessions_arrived: int
    sessions_measured: int
    turns_measured: int
    turns_missing: int
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        extra = d.pop("extra")
        for k in ("later_turn_ttft_p99_s", "first_turn_ttft_p99_s", "later_turn_ttft_p50_s", "first_turn_ttft_p50_s"):
            v = d[k]
            d[k] = None if v is None or math.isinf(v) else round(v, 4)  # JSON has no infinity: null = missed turns
        return {**d, **extra}


def judge(records: list[TurnRecord], arrivals: dict[str, int], planned_turns: dict[str, int], rate_per_min: float,
          window: Window, slo: SLO) -> PointResult:
    """The SLO verdict of one run. ``arrivals``/``planned_turns``: each session id (as in the
    records) -> its place in arrival order (0-based) / number of turns."""
    measured = {sid for sid, i in arrivals.items() if window.measured(i)}
    got: dict[tuple[str, int], float] = {}
    for r in records:
        if r.session in measured and r.ok and r.ttft_s is not None:
            got[(r.session, r.turn)] = r.ttft_s
    first, later = [], []
    for sid in measured:
        for k in range(planned_turns[sid]):
            (first if k == 0 else later).append(got.get((sid, k), math.inf))
    missing = sum(math.isinf(x) for x in first + later)
    p99_later, p99_first = percentile(later), percentile(first)
    meets = bool(measured) and (p99_first is not None and p99_first <= slo.first_turn_ttft_p99_s) \
        and (p99_later is None or p99_later <= slo.later_turn_ttft_p99_s)
    return PointResult(rate_per_min, meets, p99_later, p99_first, percentile(later, 50), percentile(first, 50),
                       len(arrivals), len(measured), len(first) + len(later), missing)


# --------------------------------------------------------------------------------------------
# Capacity: the largest rate that meets the SLO


def capacity_from_points(points: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """From judged points (``rate_per_min``, ``meets_slo``): the largest passing rate below the
    smallest failing one (a pass above a failure is noise, not capacity). ``bounded`` is False when
    no rate failed (the capacity is at least that) or none passed (0: below the least rate tried)."""
    pts = sorted(points, key=lambda p: p["rate_per_min"])
    failing = [p["rate_per_min"] for p in pts if not p["meets_slo"]]
    first_fail = failing[0] if failing else None
    passing = [p["rate_per_min"] for p in pts if p["meets_slo"] and (first_fail is None or p["rate_per_min"] < first_fail)]
    return {"capacity_per_min": passing[-1] if passing else 0.0,
            "bracket": {"passing_per_min": passing[-1] if passing else None, "failing_per_min": first_fail},
            "bounded": bool(passing) and first_fail is not None}


def search_capacity(evaluate: Callable[[float], bool], start: float, *, tolerance: float = 0.1, factor: float = 2.0,
                    min_rate: float = 0.5, max_rate: float = 240.0, max_points: int = 12,
                    ndigits: int = 2) -> dict[str, Any]:
    """Bracket, then bisect: from ``start`` multiply (or divide) by ``factor`` until the verdict
    flips, then halve the bracket geometrically until failing / passing - 1 <= ``tolerance``.
    ``evaluate(rate) -> meets the SLO``; each rate is evaluated once. Returns the capacity
    (``capacity_from_points``) and the rates in the order tried."""
    if not (min_rate > 0 and min_rate <= start <= max_rate):
        raise ValueError(f"need 0 < min_rate <= start <= max_rate, got {min_rate}, {start}, {max_rate}")
    if not factor > 1 or not tolerance > 0:
        raise ValueError("factor must be > 1 and tolerance > 0")
    verdicts: dict[float, bool] = {}
    order: list[float] = []

    def ask(rate: float) -> bool:
        rate = round(rate, ndigits)
        if rate not in verdicts:
            if len(order) >= max_points:
                raise _Budget
            verdicts[rate] = bool(evaluate(rate))
            order.append(rate)
        return verdicts[rate]

    try:
        rate = start
        if ask(rate):
            while ask(rate) and rate < max_rate:
                rate = min(rate * factor, max_rate)
        else:
            while not ask(rate) and rate > min_rate:
                rate = max(rate / factor, min_rate)
        while True:
            state = capacity_from_points([{"rate_per_min": r, "meets_slo": v} for r, v in verdicts.items()])
            lo, hi = state["bracket"]["passing_per_min"], state["bracket"]["failing_per_min"]
            if lo is None or hi is None or hi / lo - 1 <= tolerance:
                break
            mid = round(math.sqrt(lo * hi), ndigits)
            if mid in (lo, hi):
                break
            ask(mid)
        exhausted = False
    except _Budget:
        exhausted = True
    result = capacity_from_points([{"rate_per_min": r, "meets_slo": v} for r, v in verdicts.items()])
    return {**result, "rates_tried": order, "budget_exhausted": exhausted,
            "search": {"start_per_min": start, "factor": factor, "tolerance": tolerance, "min_rate_per_min": min_rate,
                       "max_rate_per_min": max_rate, "max_points": max_points}}


class _Budget(Exception):
    """The search used its ``max_points``."""
