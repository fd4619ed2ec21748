"""Where a run's time went, per session: when each agent got its first token, how long it was
active, and the mean turn latency (from a replay's per-turn CSV).

    python -m benchmarks.timeline benchmarks/results/h200-2026-11-30/*-turns.csv
"""

from __future__ import annotations

import csv
import statistics
import sys
from collections import defaultdict


def summarize(path: str) -> dict:
    sessions: dict[str, list[dict]] = defaultdict(list)
    for row in csv.DictReader(open(path)):
        sessions[row["session"]].append(row)
    first_waits, spans = [], []
    for rows in sessions.values():
        first = min(rows, key=lambda r: int(r["turn"]))
        started = float(first["send_s"]) + float(first["ttft_s"])
        first_waits.append(float(first["ttft_s"]))
        spans.append(max(float(r["end_s"]) for r in rows) - started)
    latencies = [float(r["end_s"]) - float(r["send_s"]) for rows in sessions.values() for r in rows]
    return {
        "first_token_waits_s": sorted(round(w, 1) for w in first_waits),
        "active_span_mean_s": round(statistics.mean(spans), 1),
        "turn_latency_mean_s": round(statistics.mean(latencies), 2),
    }


def main(paths: list[str]) -> None:
    for path in paths:
        s = summarize(path)
        print(path)
        print(f"  first-token waits (s): {s['first_token_waits_s']}")
        print(f"  session active span mean {s['active_span_mean_s']} s; turn latency mean {s['turn_latency_mean_s']} s")


if __name__ == "__main__":
    main(sys.argv[1:])
