"""The KV a run's live sessions keep, from its per-turn records (a capacity run saved with --save-runs).

A session is live from its first request to the end of its last reply. Its context, while live:
  queued / prefilling turn k (send .. first token): the history it already had (prompt k-1 + reply k-1);
  decoding turn k (first token .. end): prompt k, growing linearly to prompt k + reply k;
  tool gap after turn k (end .. next send): prompt k + reply k.
Distinct KV counts the shared system prompt once (the reference sessions share one; recorded
sessions none). "Running" is the decoding part only (KV that must sit on the GPU whatever the policy).

Averages are over the steady window: from the arrival of the first measured session to that of the
first cool-down session (the capacity window's measured arrivals). Printed per run, with the gap KV
split by gap length and the shed bound (below).

Shed bound. With distinct KV capped at CAP, a policy without recompute needs avg live KV <= CAP. Above
it, the excess token-seconds must be dropped during tool gaps (a running request's KV cannot be) and
recomputed at the next turn; dropping gap i (context c, length g) saves c*g token-seconds for c
recomputed tokens, so the least recompute drops the longest gaps first (a fractional knapsack, a lower
bound on any policy's recompute). Each dropped gap's recompute costs a prefill of c tokens on top of
the turn's own (the cost model's prefill_time), which is the later turn's TTFT at the least.

    python3 kv_demand.py RUN.json [RUN.json ...] [--cap 173200 --cap 346400]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from sidecar_tools.benchmarks.capacity_slo import DEFAULT_WINDOWS
from sidecar_tools.benchmarks.records import read_turns_csv
from sidecar_tools.simulator.costmodel import load_calibration

DT = 0.02


def load_run(run_path: Path):
    """A capacity run's JSON and turn records: (run, records, dist, window, shared prompt tokens, the
    sessions' turns in arrival order); shed_oracle.py reads runs the same way."""
    run = json.loads(run_path.read_text())
    records = read_turns_csv(run_path.with_name(run_path.stem + "-turns.csv"))
    dist = "reference" if "-reference-" in run_path.name else "traces"
    trace = run.get("trace") or {}
    shared = int(trace.get("shared_prefix_tokens", (trace.get("stats") or {}).get("shared_prefix_tokens", 0)))
    by_session: dict[str, list] = {}
    for r in records:
        by_session.setdefault(r.session, []).append(r)
    sessions = sorted(by_session.values(), key=lambda rs: min(x.send_s for x in rs))
    for rs in sessions:
        rs.sort(key=lambda x: x.turn)
    return run, records, dist, DEFAULT_WINDOWS[dist], shared, sessions


def analyse(run_path: Path, caps: list[int]) -> dict:
    run, records, dist, window, shared, sessions = load_run(run_path)
    arrivals = [rs[0].send_s for rs in sessions]
    t0, t1 = arrivals[window.warmup], arrivals[min(window.warmup + window.measure, len(arrivals) - 1)]
    end = max((r.end_s or r.send_s) for r in records)
    grid = np.arange(0.0, end + DT, DT)
    live = np.zeros_like(grid)      # distinct KV of live sessions, shared prompt not yet added
    running = np.zeros_like(grid)   # decoding requests' KV, shared prompt not yet added
    nrun = np.zeros_like(grid)
    gap_kv = np.zeros_like(grid)
    nlive = np.zeros_like(grid)
    gaps = []  # (context, length) of each tool gap inside the window

    def add(arr, a, b, v0, v1=None):
        i, j = np.searchsorted(grid, [a, b])
        if j <= i:
            return
        if v1 is None:
            arr[i:j] += v0
        else:
            arr[i:j] += np.linspace(v0, v1, j - i, endpoint=False)

    for rs in sessions:
        add(nlive, rs[0].send_s, rs[-1].end_s or rs[-1].send_s, 1.0)
        for k, r in enumerate(rs):
            if not r.ok or r.end_s is None:
                continue
            first = r.send_s + (r.ttft_s or 0.0)
            own = lambda x: max(x - shared, 0)  # noqa: E731
            add(live, r.send_s, first, own(r.history_tokens))
            add(live, first, r.end_s, own(r.prompt_tokens), own(r.prompt_tokens + r.completion_tokens))
            add(running, first, r.end_s, own(r.prompt_tokens), own(r.prompt_tokens + r.completion_tokens))
            add(nrun, first, r.end_s, 1.0)
            if k + 1 < len(rs):
                nxt = rs[k + 1].send_s
                c = own(r.prompt_tokens + r.completion_tokens)
                add(live, r.end_s, nxt, c)
                add(gap_kv, r.end_s, nxt, c)
                if t0 <= r.end_s < t1:
                    gaps.append((c, nxt - r.end_s))
    distinct = live + shared * (nlive > 0)
    running = running + shared * (nrun > 0)
    sel = (grid >= t0) & (grid < t1)
    span = t1 - t0
    cost = load_calibration()[0]
    out = {
        "run": run_path.name, "dist": dist, "rate_per_min": run["capacity_point"]["rate_per_min"],
        "window_s": [round(t0, 1), round(t1, 1)],
        "live_sessions_avg": round(float(nlive[sel].mean()), 1),
        "distinct_kv_avg": round(float(distinct[sel].mean())),
        "distinct_kv_p50": round(float(np.percentile(distinct[sel], 50))),
        "distinct_kv_p90": round(float(np.percentile(distinct[sel], 90))),
        "distinct_kv_max": round(float(distinct[sel].max())),
        "running_kv_avg": round(float(running[sel].mean())),
        "running_kv_p90": round(float(np.percentile(running[sel], 90))),
        "running_kv_max": round(float(running[sel].max())),
        "share_of_time_distinct_over_cap": {str(c): round(float((distinct[sel] > c).mean()), 3) for c in caps},
        "share_of_time_running_over_cap": {str(c): round(float((running[sel] > c).mean()), 3) for c in caps},
        "gap_kv_avg": round(float(gap_kv[sel].mean())),
        "gap_kv_by_length": {},
        "engine_busy_s": run.get("simulator", {}).get("engine_busy_s"),
        "makespan_s": run["summary"]["makespan_s"],
        "recomputed_share": run["summary"]["recomputed_share"],
        "shed": {},
    }
    for lo, hi in ((0, 1), (1, 5), (5, 30), (30, 1e9)):
        kv = sum(c * g for c, g in gaps if lo <= g < hi) / span
        out["gap_kv_by_length"][f"{lo}-{hi if hi < 1e9 else 'inf'} s"] = round(kv)
    # the fractional knapsack: drop the longest gaps first until the average fits
    for cap in caps:
        excess = out["distinct_kv_avg"] - cap
        if excess <= 0:
            out["shed"][str(cap)] = {"excess_kv": round(excess), "recompute_tokens_per_s": 0.0}
            continue
        need = excess * span  # token-seconds to drop over the window
        dropped_tokens, dropped_gaps, prefill_s, saved, slow = 0.0, 0, 0.0, 0.0, 0
        for c, g in sorted(gaps, key=lambda x: -x[1]):
            if saved >= need:
                break
            take = min(1.0, (need - saved) / (c * g)) if c * g > 0 else 0.0
            saved += take * c * g
            dropped_tokens += take * c
            dropped_gaps += 1
            p = cost.prefill_time([(int(c), 0)])
            prefill_s += take * p
            slow += p > 2.0
        feasible = saved >= need - 1e-6
        out["shed"][str(cap)] = {
            "excess_kv": round(excess), "feasible_by_gaps": feasible,
            "gaps_dropped": dropped_gaps, "gaps_in_window": len(gaps),
            "later_turns_in_window": len(gaps),
            "recompute_tokens_per_s": round(dropped_tokens / span, 1),
            "recompute_prefill_s_per_s": round(prefill_s / span, 3),
            "dropped_gaps_with_recompute_over_2s": slow,
            "shortest_gap_dropped_s": round(sorted(gaps, key=lambda x: -x[1])[dropped_gaps - 1][1], 2) if dropped_gaps else None,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--cap", type=int, action="append", default=None)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    caps = a.cap or [173_200, 346_400]
    rows = [analyse(p, caps) for p in a.runs]
    for r in rows:
        print(json.dumps(r))
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
