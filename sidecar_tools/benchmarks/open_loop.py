"""Open-loop session arrivals: a seeded Poisson process of agent sessions, as a trace.

A closed-loop replay (a fixed set of agents, all there from the start) measures how fast one batch
drains; a service is sized by how many agents *arrive* per minute at a latency SLO. Here sessions
arrive as a Poisson process at rate λ (sessions per minute); each one is
drawn from a distribution (the reference preset's generator, or recorded sessions sampled with
replacement). The result is an ordinary ``Trace`` whose ``start_s`` are the arrival times, so every
existing replay (the simulator's ``VirtualReplay``, the GPU client ``benchmarks.replay``) plays it
as it is: open loop needs no engine-side change.

Common random numbers: the arrivals of rate λ are one unit-rate Poisson process's points scaled by
60/λ, and arrival ``i`` is the same session at every rate. A run has a fixed number of arrivals
(the window is counted in sessions, ``capacity_slo.Window``), so a higher λ compresses the very same
sessions into less time: p99(λ) moves with the load, not with which sessions happened to land in
a window of seconds, and a bisection over λ sees a smooth curve instead of sampling noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sidecar_tools.benchmarks.traces import Session, Trace, build_config, generate, load_jsonl

REAL_TRACES_DIR = Path("benchmarks/results/real-traces")
# weight None: the file's number of sessions, i.e. every recorded session equally likely (TraceLab's
# 2 sessions 2 of 22 times, LMCache's 20 the rest)
DEFAULT_REAL_TRACES: tuple[tuple[str, float | None], ...] = (
    (str(REAL_TRACES_DIR / "tracelab-examples.jsonl"), None),
    (str(REAL_TRACES_DIR / "lmcache-miniswe.jsonl"), None),
)
DISTRIBUTIONS = ("reference", "traces")
# arrival streams of one seed: the unit-rate process, the choice of recorded sessions
_ARRIVALS, _DRAWS = 0, 1


def _unit_points(seed: int):
    """The points of a unit-rate Poisson process, in order, seeded (one stream of exponential gaps)."""
    rng = np.random.default_rng([seed, _ARRIVALS])
    t = 0.0
    while True:
        for g in rng.exponential(1.0, 256):
            t += float(g)
            yield t


def _check_rate(rate_per_min: float) -> float:
    if not rate_per_min > 0:
        raise ValueError(f"the arrival rate must be > 0 sessions per minute, got {rate_per_min}")
    return rate_per_min / 60.0


def poisson_arrivals(rate_per_min: float, window_s: float, seed: int) -> list[float]:
    """Arrival times (s) in [0, window_s) of a Poisson process of ``rate_per_min`` sessions per minute."""
    per_s = _check_rate(rate_per_min)
    if not window_s > 0:
        raise ValueError(f"the arrival window must be > 0 s, got {window_s}")
    out = []
    for u in _unit_points(seed):
        if u / per_s >= window_s:
            return out
        out.append(round(u / per_s, 4))


def first_arrivals(rate_per_min: float, n: int, seed: int) -> list[float]:
    """The first ``n`` arrival times (s) of the same process: arrival ``i`` of rate λ is the unit
    process's point ``i`` x 60/λ, so every rate has the same sessions, in the same order."""
    per_s = _check_rate(rate_per_min)
    if n < 1:
        raise ValueError(f"need at least one arrival, got {n}")
    points = _unit_points(seed)
    return [round(next(points) / per_s, 4) for _ in range(n)]


@dataclass(frozen=True)
class RecordedPool:
    """Recorded sessions to sample from with replacement: each arrival picks a source file by its
    weight, then one of its sessions uniformly. A weight of None is the file's number of sessions:
    with every weight None, each recorded session is equally likely."""

    sources: tuple[tuple[str, float | None], ...] = DEFAULT_REAL_TRACES

    def load(self) -> list[tuple[str, list[Session], float]]:
        out = []
        for path, weight in self.sources:
            if weight is not None and not weight > 0:
                raise ValueError(f"{path}: weight must be > 0, got {weight}")
            trace = load_jsonl(_resolve(path))
            if not trace.sessions:
                raise ValueError(f"{path}: no sessions")
            out.append((trace.name, trace.sessions, float(len(trace.sessions)) if weight is None else weight))
        return out


def _resolve(path: str) -> Path:
    """A relative path from the working directory, else from the repository root (the defaults)."""
    p = Path(path)
    if p.is_absolute() or p.exists():
        return p
    in_repo = Path(__file__).resolve().parents[2] / p
    return in_repo if in_repo.exists() else p


def draw_sessions(dist: str, n: int, seed: int, pool: RecordedPool | None = None) -> tuple[list[Session], int, dict]:
    """``n`` sessions of a distribution, arrival ``i`` the same for every ``n`` > i:
    (sessions, shared prefix tokens, what was drawn from)."""
    if dist == "reference":
        config = build_config("reference", seed=seed, sessions=max(n, 1))
        trace = generate(config)
        return trace.sessions[:n], trace.shared_prefix_tokens, {"preset": "reference", "seed": seed}
    if dist == "traces":
        sources = (pool or RecordedPool()).load()
        rng = np.random.default_rng([seed, _DRAWS])
        weights = np.array([w for _, _, w in sources], dtype=float)
        weights /= weights.sum()
        sessions = []
        for i in range(n):
            name, pool_sessions, _ = sources[int(rng.choice(len(sources), p=weights))]
            picked = pool_sessions[int(rng.integers(len(pool_sessions)))]
            sessions.append(picked.model_copy(update={"session_id": f"a{i:04d}-{name}-{picked.session_id}"}))
        drawn = {"sources": [{"trace": name, "sessions": len(s), "weight": w} for name, s, w in sources],
                 "files": [p for p, _ in (pool or RecordedPool()).sources], "seed": seed,
                 "sampling": "with replacement: a source by weight, then one of its sessions uniformly; recorded gaps"}
        return sessions, 0, drawn  # the recordings share no system prompt (their shared_prefix_tokens is 0)
    raise ValueError(f"unknown distribution {dist!r} (expected one of {', '.join(DISTRIBUTIONS)})")


def open_loop_trace(dist: str, rate_per_min: float, sessions: int, seed: int = 2,
                    pool: RecordedPool | None = None) -> Trace:
    """``sessions`` sessions of ``dist`` arriving as a Poisson process at ``rate_per_min``: session
    ``i`` starts at the ``i``-th arrival. Seed 2 makes the first 24 reference arrivals the reference
    preset's 24 sessions."""
    arrivals = first_arrivals(rate_per_min, sessions, seed)
    drawn_sessions, shared, drawn = draw_sessions(dist, sessions, seed, pool)
    timed = [s.model_copy(update={"start_s": t}) for s, t in zip(drawn_sessions, arrivals)]
    meta = {"open_loop": {"distribution": dist, "rate_per_min": rate_per_min, "sessions": sessions,
                          "seed": seed, "last_arrival_s": arrivals[-1], "drawn_from": drawn}}
    return Trace(name=f"open-loop-{dist}-{rate_per_min:g}pm", shared_prefix_tokens=shared, sessions=timed, meta=meta)
