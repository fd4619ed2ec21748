"""The overload seeds as one table: makespan ratio, recompute, later-turn TTFT p99, the longest first turn
(door wait + prefill), per seed, from the runs run.sh saved.
    python3 benchmarks/scripts/sim/overload-seeds-2026-12-03/table.py [DIR]"""
import json
import sys
from pathlib import Path

from sidecar_tools.benchmarks.load_benchmark import pct
from sidecar_tools.benchmarks.records import read_turns_csv

out = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/sim/overload-seeds-2026-12-03")


def figures(name: str) -> dict:
    summary = json.loads((out / f"{name}.json").read_text())["summary"]
    turns = read_turns_csv(out / f"{name}-turns.csv")
    later = [t.ttft_s for t in turns if t.turn > 0 and t.ttft_s is not None]
    first = [t.ttft_s for t in turns if t.turn == 0 and t.ttft_s is not None]
    return {"makespan": summary["makespan_s"], "recomputed": summary["recomputed_share"],
            "later_p99": pct(later, 99), "first_max": max(first), "failed": summary["turns_failed"]}


print("| seed | stock HiCache | product | x stock | recomputed (stock / product) | later-turn p99 (stock / product) "
      "| longest first turn (product) | failed |")
print("|---|---|---|---|---|---|---|---|")
for path in sorted(out.glob("hicache-seed*.json"), key=lambda p: int(p.stem.removeprefix("hicache-seed"))):
    seed = path.stem.removeprefix("hicache-seed")
    s, p = figures(f"hicache-seed{seed}"), figures(f"product-seed{seed}")
    print(f"| {seed} | {s['makespan']:.1f} s | {p['makespan']:.1f} s | **{p['makespan'] / s['makespan']:.3f}x** "
          f"| {100 * s['recomputed']:.1f} / {100 * p['recomputed']:.1f} % | {s['later_p99']:.2f} / {p['later_p99']:.2f} s "
          f"| {p['first_max']:.1f} s | {s['failed']} / {p['failed']} |")
