"""Tabulate the target-search candidates against LRU (simulator runs, not GPU runs).

    python3 benchmarks/scripts/sim/target-search/table.py > benchmarks/results/sim/target-search/table.md
"""
import json
import sys
from pathlib import Path

out = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/sim/target-search")
ROWS = [("lru", "LRU (SGLang default)"), ("shipped", "shipped preset (coding-agent.toml, plugin bound 0.8)"),
        ("fixed10-mlf95", "F10: fixed 10 s leases, no admission gate, kv_pressure_gain 0, plugin bound 0.95"),
        ("fixed15-mlf93", "F15: fixed 15 s leases, no admission gate, kv_pressure_gain 0, plugin bound 0.93"),
        ("pred-mlf90-hr1.0", "P: predictive min_ttl 2, kv_pressure_gain 0, gate headroom 1.0 / 4 turns, bound 0.9, soft_overflow off"),
        ("F10-wait8", "F10-wait8: fixed 10 s leases, gate headroom 0.9 / 30 s horizon / max_wait 8 s, bound 0.93"),
        ("P2-wait3", "P2-wait3: predictive min_ttl 2, kv_pressure_gain 0, gate headroom 0.8 / 30 s / idle full / max_wait 3 s, bound 0.93"),
        ("unconstrained", "unconstrained KV (600K tokens, LRU): the limit")]


def load(name):
    p = out / f"{name}.json"
    return json.loads(p.read_text())["summary"] if p.exists() else None


def verdict(s, base, gap):
    if gap != "0.5":
        return "ok" if s["makespan_s"] <= base["makespan_s"] else "**slower**"
    miss = []
    if base["makespan_s"] / s["makespan_s"] < 1.8:
        miss.append("speed")
    if s["recomputed_share"] > 0.03:
        miss.append("recompute")
    if s["ttft_with_client_wait_p50_s"] > base["ttft_with_client_wait_p50_s"] / 5:
        miss.append("p50")
    if s["ttft_with_client_wait_p90_s"] > base["ttft_with_client_wait_p90_s"] / 3:
        miss.append("p90")
    return "all met" if not miss else "misses " + ", ".join(miss)


for seed in (2, 3, 4):
    print(f"\n### seed {seed}{' (reference trace, the GPU runs)' if seed == 2 else ''}\n")
    print("| config | gap | makespan | speed-up | recomputed | TTFT p50 (x LRU) | TTFT p90 (x LRU) | targets |")
    print("|---|---|---|---|---|---|---|---|")
    for key, label in ROWS:
        for gap in ("0.5", "5", "60"):
            s, base = load(f"{key}-{gap}s-seed{seed}"), load(f"lru-{gap}s-seed{seed}")
            if s is None or base is None:
                continue
            p50, p90 = s["ttft_with_client_wait_p50_s"], s["ttft_with_client_wait_p90_s"]
            print(f"| {label} | {gap} s | {s['makespan_s']:.1f} s | {base['makespan_s'] / s['makespan_s']:.2f}x | "
                  f"{100 * s['recomputed_share']:.1f} % | {p50:.2f} s ({p50 / base['ttft_with_client_wait_p50_s']:.2f}) | "
                  f"{p90:.2f} s ({p90 / base['ttft_with_client_wait_p90_s']:.2f}) | "
                  f"{'-' if key == 'lru' else verdict(s, base, gap)} |")
