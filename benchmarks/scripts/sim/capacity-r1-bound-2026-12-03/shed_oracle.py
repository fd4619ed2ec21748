"""An offline (clairvoyant) eviction oracle on an unconstrained run's timeline: how little recompute, and
how many slow later turns, any eviction order needs to keep the distinct KV of the live sessions under
CAP tokens (write-through at ratio 1: the host holds every GPU node, so the two tiers hold one pool's
worth, 173,200 tokens).

The run (600,000 GPU tokens, nothing evicted: kv_demand.py's timeline) gives each session's context at
every instant. Every DT, if the distinct KV exceeds CAP, the oracle drops tokens (tail first, as the
radix tree does) from sessions in a tool gap, knowing when each comes back:
  belady      the session that comes back last first (furthest next use);
  cost-aware  the same order, but first only as much of each session as its next turn can recompute
              within BUDGET s of prefill (cost model), then past that budget, furthest first.
A running or queued request's KV is never dropped; an excess that gap KV cannot cover is reported
(token-seconds that had to wait). Dropped tokens are recomputed when the session's next turn is sent:
that turn's TTFT is the unconstrained one plus the prefill of the dropped tokens (cost model, on top of
the kept prefix). Optimistic for the policy: recompute delays no one else and lengthens no session, and
no load-back time is charged, so a rate this oracle fails is out of reach for every eviction order
under the cap; a rate it passes is not thereby reachable.

    python3 shed_oracle.py RUN.json [...] [--cap 173200] [--budget 1.0] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from sidecar_tools.benchmarks.capacity_slo import SLO, percentile
from sidecar_tools.simulator.costmodel import load_calibration

from kv_demand import load_run  # this folder's: the same run reading

DT = 0.05


def oracle(run_path: Path, cap: int, order: str, budget: float) -> dict:
    run, records, dist, window, shared, sessions = load_run(run_path)
    cost = load_calibration()[0]
    measured = {rs[0].session for i, rs in enumerate(sessions) if window.measured(i)}
    end = max(r.end_s for r in records if r.end_s)
    n = len(sessions)
    dropped = [0.0] * n            # tokens dropped in the current gap
    recompute: dict[tuple[int, int], float] = {}  # (session, turn) -> tokens recomputed at that turn
    kept_at: dict[tuple[int, int], float] = {}
    ptr = [0] * n                  # current turn index per session
    unshed = 0.0
    t = 0.0
    while t < end:
        total = 0.0
        gapers = []
        any_live = False
        for i, rs in enumerate(sessions):
            k = ptr[i]
            while k < len(rs) and rs[k].end_s is not None and t >= rs[k].end_s and k + 1 < len(rs) and t >= rs[k + 1].send_s:
                k += 1
            if k != ptr[i]:
                # the session sent turn k: what was dropped is recomputed now
                if dropped[i] > 0:
                    recompute[(i, k)] = dropped[i]
                    kept_at[(i, k)] = rs[k].history_tokens - dropped[i]
                dropped[i] = 0.0
                ptr[i] = k
            r = rs[k]
            if t < rs[0].send_s or r.end_s is None or (t >= r.end_s and k + 1 == len(rs)):
                continue  # not live
            any_live = True
            first = r.send_s + (r.ttft_s or 0.0)
            if t < r.send_s:
                continue
            if t < first:
                c = r.history_tokens
            elif t < r.end_s:
                c = r.prompt_tokens + r.completion_tokens * (t - first) / max(r.end_s - first, 1e-9)
            else:
                c = r.prompt_tokens + r.completion_tokens
                gapers.append((i, rs[k + 1].send_s, c))
            total += max(c - shared, 0) - dropped[i]
        distinct = total + (shared if any_live else 0)
        excess = distinct - cap
        if excess > 0:
            gapers.sort(key=lambda g: -g[1])  # furthest next use first
            passes = [True, False] if order == "cost-aware" else [False]
            for capped in passes:
                for i, nxt, c in gapers:
                    if excess <= 0:
                        break
                    room = max(c - shared, 0) - dropped[i]
                    if capped:
                        limit = _budget_tokens(cost, c, budget) - dropped[i]
                        room = min(room, max(limit, 0))
                    take = min(room, excess)
                    if take > 0:
                        dropped[i] += take
                        excess -= take
            if excess > 0:
                unshed += excess * DT
        t += DT
    # the later turns' TTFT with the oracle's recompute
    later, first_turns, rec_tokens, hist_tokens = [], [], 0.0, 0
    rec_prefill = 0.0  # s of prefill the oracle's recompute costs, every turn of the run
    for (i, k), d in recompute.items():
        r = sessions[i][k]
        kept, app = int(kept_at[(i, k)]), r.prompt_tokens - r.history_tokens
        rec_prefill += cost.prefill_time([(int(d) + app, kept)]) - cost.prefill_time([(app, kept + int(d))])
    span = end - min(rs[0].send_s for rs in sessions)
    busy = run.get("simulator", {}).get("engine_busy_s") or {}
    slow = 0
    for i, rs in enumerate(sessions):
        for k, r in enumerate(rs):
            if r.session not in measured:
                continue
            if k == 0:
                first_turns.append(r.ttft_s)
                continue
            extra = 0.0
            d = recompute.get((i, k), 0.0)
            if d:
                kept = int(kept_at[(i, k)])
                app = r.prompt_tokens - r.history_tokens
                extra = cost.prefill_time([(int(d) + app, kept)]) - cost.prefill_time([(app, kept + int(d))])
            ttft = (r.ttft_s or 0.0) + extra
            later.append(ttft)
            slow += ttft > SLO.later_turn_ttft_p99_s
        rec_tokens += sum(v for (i2, _), v in recompute.items() if i2 == i)
        hist_tokens += sum(r.history_tokens for r in rs)
    p99 = percentile(later)
    return {"run": run_path.name, "dist": dist, "rate_per_min": run["capacity_point"]["rate_per_min"], "cap": cap,
            "order": order, "budget_s": budget if order == "cost-aware" else None,
            "later_turn_ttft_p99_s": round(p99, 3), "later_turns": len(later), "later_turns_over_2s": slow,
            "first_turn_ttft_p99_s": round(percentile(first_turns), 3),
            "meets_slo_optimistic": p99 <= SLO.later_turn_ttft_p99_s,
            "recomputed_share": round(rec_tokens / max(hist_tokens, 1), 4),
            "unshed_token_s": round(unshed),
            "recompute_prefill_s_per_s": round(rec_prefill / span, 3),
            "unconstrained_engine_busy_per_s": round((busy.get("prefill", 0) + busy.get("decode", 0)) / span, 3)}


def _budget_tokens(cost, context: float, budget: float) -> float:
    """The most tail tokens of a context of ``context`` a turn can recompute within ``budget`` s."""
    lo, hi = 0, int(context)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        kept = int(context) - mid
        if cost.prefill_time([(mid, kept)]) - cost.step_s <= budget:
            lo = mid
        else:
            hi = mid - 1
    return float(lo)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--cap", type=int, default=173_200)
    ap.add_argument("--budget", type=float, default=1.0)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    rows = []
    for p in a.runs:
        for order in ("belady", "cost-aware"):
            row = oracle(p, a.cap, order, a.budget)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
