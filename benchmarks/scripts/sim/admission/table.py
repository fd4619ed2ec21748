"""Tabulate the admission runs: makespan / recomputed history / TTFT p50 / p90 (simulated)."""
import json
import sys
from pathlib import Path

out = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/sim/admission")
ROWS = [("lru", "LRU (SGLang default)"), ("before", "product before (8 turns, idle counted in full)"),
        ("after", "product after (`coding-agent.toml`: 20 s horizon, duty_cycle)"),
        ("plugin", "plugin only, client lease 30 s, bound 0.8"),
        ("horizon-only", "ablation: 20 s horizon, idle in full"), ("dutycycle-only", "ablation: duty_cycle, 8 turns")]


def cell(name):
    p = out / f"{name}.json"
    if not p.exists():
        return None
    s = json.loads(p.read_text())["summary"]
    return s


for seed in (2, 3, 4):
    print(f"\n### seed {seed}{' (reference preset, the GPU runs)' if seed == 2 else ''}\n")
    print("| run | 0.5 s gaps | 5 s gaps | 60 s gaps |")
    print("|---|---|---|---|")
    for key, label in ROWS:
        cells, lru = [], []
        for gap in ("0.5", "5", "60"):
            s, base = cell(f"{key}-{gap}s-seed{seed}"), cell(f"lru-{gap}s-seed{seed}")
            if s is None:
                cells.append(None)
                continue
            speed = base["makespan_s"] / s["makespan_s"] if base else float("nan")
            cells.append(f"{s['makespan_s']:.1f} s ({speed:.2f}x) / {100 * s['recomputed_share']:.1f} % / "
                         f"{s['ttft_p50_s']:.2f} / {s['ttft_p90_s']:.2f} s")
        if any(cells):
            print(f"| {label} | " + " | ".join(c or "-" for c in cells) + " |")
