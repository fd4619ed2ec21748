"""Stock / product pairs of a results folder as one table: makespan ratio, recompute, later-turn TTFT p99 and
the product's longest first turn (door wait + prefill), from the replay's or simulator's JSON + turns CSV. A
pair is ``hicache-X.json`` and ``product-X.json``; a stock run without its product gets its own figures only.
    python3 benchmarks/scripts/sim/overload-seeds-2026-12-03/table.py [DIR]   (default: this folder's results)"""
import json
import re
import sys
from pathlib import Path

from sidecar_tools.benchmarks.load_benchmark import pct
from sidecar_tools.benchmarks.records import read_turns_csv

out = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/sim/overload-seeds-2026-12-03")


def figures(name: str) -> dict | None:
    if not (out / f"{name}.json").exists():
        return None
    summary = json.loads((out / f"{name}.json").read_text())["summary"]
    turns = read_turns_csv(out / f"{name}-turns.csv")
    later = [t.ttft_s for t in turns if t.turn > 0 and t.ttft_s is not None]
    first = [t.ttft_s for t in turns if t.turn == 0 and t.ttft_s is not None]
    return {"makespan": summary["makespan_s"], "recomputed": summary["recomputed_share"],
            "later_p99": pct(later, 99), "first_max": max(first), "failed": summary["turns_failed"]}


def natural(path: Path) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.stem)]


print("| run | stock HiCache | product | x stock | recomputed (stock / product) | later-turn p99 (stock / product) "
      "| longest first turn (stock / product) | failed |")
print("|---|---|---|---|---|---|---|---|")
for path in sorted(out.glob("hicache-*.json"), key=natural):
    run = path.stem.removeprefix("hicache-")
    s, p = figures(f"hicache-{run}"), figures(f"product-{run}")
    if p is None:
        print(f"| {run} | {s['makespan']:.1f} s | - | - | {100 * s['recomputed']:.1f} / - % | {s['later_p99']:.2f} / - s "
              f"| {s['first_max']:.1f} / - s | {s['failed']} / - |")
        continue
    print(f"| {run} | {s['makespan']:.1f} s | {p['makespan']:.1f} s | **{p['makespan'] / s['makespan']:.3f}x** "
          f"| {100 * s['recomputed']:.1f} / {100 * p['recomputed']:.1f} % | {s['later_p99']:.2f} / {p['later_p99']:.2f} s "
          f"| {s['first_max']:.1f} / {p['first_max']:.1f} s | {s['failed']} / {p['failed']} |")
