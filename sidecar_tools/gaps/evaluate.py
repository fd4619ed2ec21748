"""Offline replay of a gap trace through the live policy code, and scoring of lease policies.

Replay: events in time order through the turn's own policy calls (``sidecar.turn.policy_calls``,
the sequence ``Turn`` makes, so the order cannot drift from the product's) - the session returns at
``t + gap`` (``turn_started``: the predictor learns the gap, the request's lease is chosen for the
context it continues; the trace records no new messages), the next turn ends at its ``t``
(``turn_finished``: the gap starts, and the revised lease goes out when it moved enough, as the
turn sends it; a session's first request is seen only as its reply ends); every simulated
second the lifecycle runs (the session store's close_due: a session that stayed away past
its lease + idle grace is learned as censored, and re-learned if it comes back later). So the
predictor only knows what a live sidecar would have known at each decision.

Scoring, per policy and gap with N context tokens and lease T (no lease = 0):
* hit: back within T (gap <= T: a session back at once, gap 0, finds its KV even without a lease);
  the hit rate counts only gaps that ended (none ended: no hit rate);
* leased token-seconds: N * min(gap, T) (N * T if the session never came back);
* recomputed tokens: N for each return after the lease;
* cost (engine s): kv_cost_weight * leased token-seconds + recompute cost of the misses.
Reference policies: oracle (T = the true gap; never-returning sessions 0) and clairvoyant
(T = gap only where holding is cheaper than recomputing, else 0: the least cost possible).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from sidecar.conversation.store import SessionStore
from sidecar.engine.capacity import EngineCapacity
from sidecar.engine.lease import LeaseRequest
from sidecar.policy.lease_policy import LeasePolicy
from sidecar_tools.gaps.gap_trace import GapRecord
from sidecar.policy.predictor import tool_keys
from sidecar.policy.ttl import LeaseTtlRule
from sidecar.turn.policy_calls import turn_finished, turn_started

_RETURN, _TURN = 0, 1
LIFECYCLE_PERIOD_S = 1.0


@dataclass
class ReplayedGap:
    record: GapRecord
    ttl_request: float  # predictive lease sent with the request (tools unknown)
    ttl_after_turn: float  # the lease in force once the reply's tools are known (revised, else the request's)
    predicted_median_s: float


@dataclass
class PolicyScore:
    name: str
    gaps: int = 0
    returns: int = 0
    hits: int = 0
    leased_token_s: float = 0.0
    recomputed_tokens: int = 0
    cost_s: float = 0.0
    by_tool: dict[str, list[int]] = field(default_factory=dict)  # key -> [returns, hits]

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.returns if self.returns else None

    def as_dict(self, oracle_token_s: float) -> dict:
        return {
            "policy": self.name,
            "hit_rate": None if self.hit_rate is None else round(self.hit_rate, 4),
            "hits": self.hits,
            "returns": self.returns,
            "leased_token_s": round(self.leased_token_s, 1),
            "leased_vs_oracle": round(self.leased_token_s / oracle_token_s, 4) if oracle_token_s else None,
            "recomputed_tokens": self.recomputed_tokens,
            "cost_s": round(self.cost_s, 3),
        }


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def replay_predictive(records: list[GapRecord], settings, on_gap: Callable[[], None] | None = None) -> list[ReplayedGap]:
    """Run the trace through a LeasePolicy in mode=predictive; the TTLs it chose per gap
    (``on_gap`` hears of each gap replayed: a progress bar)."""
    policy_settings = settings.policy.model_copy(update={"mode": "predictive"})
    admission = settings.admission.model_copy(update={"enabled": False})
    clock = _Clock()
    policy = LeasePolicy(
        policy_settings,
        admission,
        EngineCapacity(0),
        max_sessions=max(settings.server.max_sessions, 1),
        idle_grace_s=settings.server.session_idle_grace,
        clock=clock,
    )
    sessions = SessionStore(policy, max(settings.server.max_sessions, 1))
    events: list[tuple[float, int, int]] = [(r.t, _TURN, i) for i, r in enumerate(records)]
    heapq.heapify(events)
    results: list[ReplayedGap | None] = [None] * len(records)
    sent: dict[str, LeaseRequest | None] = {}  # the lease each session's open request carried
    last_lifecycle = -math.inf

    def run_lifecycle(now: float) -> None:
        sessions.close_due(now)

    while events:
        now, kind, i = heapq.heappop(events)
        clock.now = now
        if now - last_lifecycle >= LIFECYCLE_PERIOD_S:
            run_lifecycle(now)
            last_lifecycle = now
        r = records[i]
        sessions.open(r.session_id)  # the session a request or reply belongs to (back, if it was closed)
        if kind == _TURN:
            if r.session_id in sent:
                lease = sent.pop(r.session_id)
            else:  # the session's first request: seen only as its reply ends
                lease = turn_started(policy, r.session_id, r.context_tokens, now)
            revised: list[LeaseRequest] = []
            turn_finished(policy, r.session_id, r.context_tokens, list(r.tool_names), lease, now, revised.append)
            predicted = sessions.record(r.session_id).predicted_gap_s
            ttl_req = lease.ttl_s if lease is not None else 0.0
            results[i] = ReplayedGap(r, ttl_req, revised[0].ttl_s if revised else ttl_req, predicted)
            if on_gap is not None:
                on_gap()
            if r.gap_s is not None:
                heapq.heappush(events, (now + r.gap_s, _RETURN, i))
        else:
            sent[r.session_id] = turn_started(policy, r.session_id, r.context_tokens, now)
    return [g for g in results if g is not None]


def score(name: str, gaps: list[ReplayedGap], ttls: list[float], rule: LeaseTtlRule) -> PolicyScore:
    """Hit rate, leased token-seconds, recompute and cost of leasing ``ttls[i]`` for gap i."""
    result = PolicyScore(name)
    w = rule.settings.kv_cost_weight
    for gap, ttl in zip(gaps, ttls):
        r = gap.record
        result.gaps += 1
        if r.gap_s is None:
            held = r.context_tokens * ttl
        else:
            held = r.context_tokens * min(r.gap_s, ttl)
            hit = r.gap_s <= ttl
            result.returns += 1
            key = "+".join(tool_keys(r.tool_names))
            per_tool = result.by_tool.setdefault(key, [0, 0])
            per_tool[0] += 1
            if hit:
                result.hits += 1
                per_tool[1] += 1
            else:
                result.recomputed_tokens += r.context_tokens
                result.cost_s += rule.recompute_cost_s(r.context_tokens)
        result.leased_token_s += held
        result.cost_s += w * held
    return result


def oracle_ttls(gaps: list[ReplayedGap]) -> list[float]:
    return [g.record.gap_s if g.record.gap_s is not None else 0.0 for g in gaps]


def clairvoyant_ttls(gaps: list[ReplayedGap], rule: LeaseTtlRule) -> list[float]:
    out = []
    for g in gaps:
        r = g.record
        worth = r.gap_s is not None and rule.hold_cost_rate(r.context_tokens) * r.gap_s < rule.recompute_cost_s(r.context_tokens)
        out.append(r.gap_s if worth else 0.0)
    return out


def prediction_error(gaps: list[ReplayedGap]) -> dict:
    """How far the predicted median gap was from the actual one (returned gaps only)."""
    errors = np.array(
        [
            math.log2(max(g.record.gap_s, 1e-3) / max(g.predicted_median_s, 1e-3))
            for g in gaps
            if g.record.gap_s is not None and g.predicted_median_s is not None
        ]
    )
    if errors.size == 0:
        return {"returned_gaps": 0}
    return {
        "returned_gaps": int(errors.size),
        "median_abs_log2_error": round(float(np.median(np.abs(errors))), 3),
        "within_2x": round(float(np.mean(np.abs(errors) <= 1.0)), 4),
        "mean_log2_error": round(float(np.mean(errors)), 3),
    }


def evaluate(records: list[GapRecord], settings, fixed_ttls=(2.0, 30.0, 300.0), on_gap: Callable[[], None] | None = None):
    """(scores by policy, prediction error summary, replayed gaps) for one trace."""
    gaps = replay_predictive(records, settings, on_gap)
    rule = LeaseTtlRule(settings.policy.model_copy(update={"mode": "predictive"}))
    scores = [score("off", gaps, [0.0] * len(gaps), rule)]
    for ttl in fixed_ttls:
        scores.append(score(f"fixed {ttl:g}s", gaps, [ttl] * len(gaps), rule))
    scores.append(score("predictive (request)", gaps, [g.ttl_request for g in gaps], rule))
    scores.append(score("predictive (after turn)", gaps, [g.ttl_after_turn for g in gaps], rule))
    scores.append(score("clairvoyant", gaps, clairvoyant_ttls(gaps, rule), rule))
    scores.append(score("oracle (TTL = gap)", gaps, oracle_ttls(gaps), rule))
    return scores, prediction_error(gaps), gaps


def segment_scores(gaps: list[ReplayedGap], settings, segments: int, fixed_ttls=(30.0,)):
    """Per time segment (equal numbers of gaps, in time order): (label, [scores]) for a few policies."""
    rule = LeaseTtlRule(settings.policy.model_copy(update={"mode": "predictive"}))
    ordered = sorted(gaps, key=lambda g: g.record.t)
    out = []
    for k in range(segments):
        part = ordered[k * len(ordered) // segments : (k + 1) * len(ordered) // segments]
        if not part:
            continue
        label = f"{part[0].record.t:.0f}-{part[-1].record.t:.0f} s"
        scores = [score(f"fixed {ttl:g}s", part, [ttl] * len(part), rule) for ttl in fixed_ttls]
        scores.append(score("predictive (request)", part, [g.ttl_request for g in part], rule))
        scores.append(score("predictive (after turn)", part, [g.ttl_after_turn for g in part], rule))
        scores.append(score("clairvoyant", part, clairvoyant_ttls(part, rule), rule))
        out.append((label, scores))
    return out
