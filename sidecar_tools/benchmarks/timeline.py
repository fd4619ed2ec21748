"""Where a run's time went, per session: when each agent got its first token, how long it was
active, and the mean turn latency (from a replay's per-turn CSV).

    python -m sidecar_tools.benchmarks.timeline benchmarks/results/h200-2026-11-30/*-turns.csv
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict

from sidecar_tools.benchmarks.records import TurnRecord, read_turns_csv


def summarize(path: str) -> dict:
    sessions: dict[str, list[TurnRecord]] = defaultdict(list)
    for record in read_turns_csv(path):
        sessions[record.session].append(record)
    first_waits, spans = [], []
    for records in sessions.values():
        first = min(records, key=lambda r: r.turn)
        if first.ttft_s is None:  # the session's first turn failed: no first token to wait for
            continue
        started = first.send_s + first.ttft_s
        first_waits.append(first.ttft_s)
        spans.append(max(r.end_s for r in records if r.end_s is not None) - started)
    latencies = [r.end_s - r.send_s for records in sessions.values() for r in records if r.end_s is not None]
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
