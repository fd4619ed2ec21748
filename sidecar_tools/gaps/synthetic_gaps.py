"""Synthetic gap traces with per-tool signal (prior-art §5.3/§5.4 "tool gap: a mixture").

coding-agent (OpenHands/SWE-like): per reply one tool (15 %: two, run one after the other), each
tool's gap a log-normal mixture; overall ~70 % fast (median 0.1-0.4 s), ~25 % medium (3-5 s),
~5 % long (1.5-2 min, capped at 15 min); 3 % of replies ask the user (human gap, median 25 s,
10 % never answered); the final reply calls ``finish`` (OpenHands) and never comes back. Sessions are slower or faster by a log-normal speed factor.
interactive-chat: most replies have no tool and wait for a human (median 20 s, 15 % never come
back), a few tools (search, code execution, retrieval).
Regime change: from the start of session ``regime_change_at * sessions`` on, one tool's gaps are
``slowdown`` times longer (e.g. the test suite moved to a slower runner) - the predictor must adapt.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sidecar_tools.gaps.gap_trace import GapRecord

GAP_CAP_S = 900.0
MAX_CONTEXT = 200_000

# (probability, median seconds, log-space sigma) components of one tool's gap
Mixture = tuple[tuple[float, float, float], ...]


@dataclass(frozen=True)
class Workload:
    tools: dict[str, tuple[float, Mixture]]  # name -> (share of tool replies, gap mixture)
    no_tool_share: float  # replies without tools that wait for a human
    human_gap: Mixture
    abandon_after_human: float  # P(a human-waiting reply is never answered)
    turns_median: float
    turns_range: tuple[int, int]
    two_tool_share: float
    speed_sigma: float
    system_tokens: int
    first_prompt_median: float
    append_median: float
    append_sigma: float
    huge_append_share: float
    output_median: float
    session_interarrival_s: float
    regime_tool: str
    final_tools: tuple[str, ...] = ()  # tools of the session's last reply (it never comes back)


WORKLOADS: dict[str, Workload] = {
    "coding-agent": Workload(
        tools={
            "str_replace_editor": (0.35, ((1.0, 0.15, 0.5),)),
            "execute_bash": (0.45, ((0.62, 0.4, 0.6), (0.35, 4.0, 0.6), (0.03, 120.0, 0.8))),
            "run_tests": (0.08, ((0.5, 5.0, 0.5), (0.5, 90.0, 0.6))),
            "think": (0.05, ((1.0, 0.02, 0.4),)),
            "web_fetch": (0.07, ((1.0, 3.0, 0.6),)),
        },
        no_tool_share=0.03,
        human_gap=((1.0, 25.0, 0.8),),
        abandon_after_human=0.1,
        turns_median=30,
        turns_range=(3, 100),
        two_tool_share=0.15,
        speed_sigma=0.3,
        system_tokens=4000,
        first_prompt_median=1500,
        append_median=875,
        append_sigma=1.2,
        huge_append_share=0.015,
        output_median=200,
        session_interarrival_s=15.0,
        regime_tool="execute_bash",
        final_tools=("finish",),
    ),
    "interactive-chat": Workload(
        tools={
            "web_search": (0.5, ((1.0, 1.5, 0.5),)),
            "code_interpreter": (0.3, ((0.7, 2.0, 0.5), (0.3, 15.0, 0.6))),
            "retrieve_docs": (0.2, ((1.0, 0.3, 0.5),)),
        },
        no_tool_share=0.65,
        human_gap=((0.8, 20.0, 1.0), (0.2, 120.0, 1.0)),
        abandon_after_human=0.15,
        turns_median=8,
        turns_range=(1, 60),
        two_tool_share=0.05,
        speed_sigma=0.2,
        system_tokens=1500,
        first_prompt_median=60,
        append_median=500,
        append_sigma=1.0,
        huge_append_share=0.005,
        output_median=350,
        session_interarrival_s=5.0,
        regime_tool="web_search",
    ),
}


def _sample_mixture(rng: np.random.Generator, mixture: Mixture) -> float:
    probs = np.array([p for p, _, _ in mixture])
    _, median, sigma = mixture[rng.choice(len(mixture), p=probs / probs.sum())]
    return float(median * np.exp(sigma * rng.standard_normal()))


def synthesize_gap_trace(
    workload: str = "coding-agent",
    sessions: int = 200,
    seed: int = 0,
    regime_change_at: float | None = None,
    slowdown: float = 10.0,
    regime_tool: str | None = None,
) -> list[GapRecord]:
    """A deterministic (given ``seed``) gap trace, sorted by t."""
    spec = WORKLOADS[workload]
    rng = np.random.default_rng(seed)
    names = list(spec.tools)
    shares = np.array([spec.tools[n][0] for n in names])
    shares = shares / shares.sum()
    slowed = regime_tool or spec.regime_tool
    starts = np.cumsum(rng.exponential(spec.session_interarrival_s, sessions))
    change_t = None
    if regime_change_at is not None:
        change_t = float(starts[min(int(regime_change_at * sessions), sessions - 1)])

    records: list[GapRecord] = []
    for s in range(sessions):
        sid = f"{workload}-{seed}-{s:05d}"
        lo, hi = spec.turns_range
        turns = int(np.clip(round(spec.turns_median * np.exp(0.6 * rng.standard_normal())), lo, hi))
        speed = float(np.exp(spec.speed_sigma * rng.standard_normal()))
        context = spec.system_tokens + int(spec.first_prompt_median * np.exp(0.5 * rng.standard_normal()))
        t = float(starts[s])
        for turn in range(turns):
            output = int(min(spec.output_median * np.exp(0.8 * rng.standard_normal()), 4000))
            t += 0.3 + output / 60.0  # prefill + decode at ~60 tok/s
            context += output
            last = turn == turns - 1 or context >= MAX_CONTEXT
            if last:
                records.append(GapRecord(sid, list(spec.final_tools), context, None, t))
                break
            if rng.random() < spec.no_tool_share:
                tools: list[str] = []
                gap = None if rng.random() < spec.abandon_after_human else _sample_mixture(rng, spec.human_gap)
            else:
                count = 2 if rng.random() < spec.two_tool_share else 1
                tools = sorted({names[i] for i in rng.choice(len(names), size=count, p=shares)})
                gap = 0.0
                for name in tools:
                    one = _sample_mixture(rng, spec.tools[name][1]) * speed
                    if change_t is not None and name == slowed and t >= change_t:
                        one *= slowdown
                    gap += one
            if gap is not None:
                gap = min(gap, GAP_CAP_S)
            records.append(GapRecord(sid, tools, context, gap, t))
            if gap is None:
                break
            t += gap
            append = spec.append_median * np.exp(spec.append_sigma * rng.standard_normal())
            if rng.random() < spec.huge_append_share:
                append = rng.uniform(10_000, 50_000)
            context += int(append)
    records.sort(key=lambda r: r.t)
    return records
