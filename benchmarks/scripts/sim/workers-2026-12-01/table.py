"""Tabulate the worker runs (run.sh): how many workers for the overload trace, and a worker loss
with and without the shared L3 store. Reads <name>.json from OUT, prints markdown."""
import json
import sys
from pathlib import Path

out = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/sim/workers-2026-12-01")


def run(name):
    p = out / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None


def pct(x):
    return "-" if x is None else f"{100 * x:.1f} %"


print("### How many workers (48 agents x 16 turns, 0.5 s gaps, per worker 173,200 GPU KV tokens + host ratio 1)\n")
print("| run | workers | makespan | recomputed history | TTFT p50 | TTFT p90 | TTFT p99 | sessions per worker | busy per worker | admission waits (s) |")
print("|---|---|---|---|---|---|---|---|---|---|")
for config, label in (("stock", "stock HiCache (LRU)"), ("product", "the product")):
    for n in (1, 2, 3):
        r = run(f"{config}-{n}w")
        if r is None:
            continue
        s, ws = r["summary"], r.get("workers")
        placed = " / ".join(str(w["sessions_placed"]) for w in ws) if ws else "48"
        busy = " / ".join(f"{100 * w['busy_fraction']:.0f} %" for w in ws) if ws else \
            f"{100 * sum(r['simulator']['engine_busy_s'].values()) / s['makespan_s']:.0f} %"
        waits = " / ".join(f"{w['admission_waits']} ({w['admission_wait_s']:.0f})" for w in ws) if ws else "-"
        print(f"| {label} | {n} | {s['makespan_s']:.1f} s | {pct(s['recomputed_share'])} | {s['ttft_p50_s']:.2f} s | "
              f"{s['ttft_p90_s']:.2f} s | {s['ttft_p99_s']:.2f} s | {placed} | {busy} | {waits} |")

print("\n### Worker 0 of 3 lost at 30 s (the product)\n")
print("| run | makespan | recomputed history | failed requests | re-homed sessions | their history | "
      "recomputed on the new worker | read from L3 | L3 read time | re-homed TTFT mean / max |")
print("|---|---|---|---|---|---|---|---|---|---|")
for name, label in (("product-3w", "no loss"), ("product-3w-lose0", "loss, recompute"),
                    ("product-3w-lose0-l3-0.25", "loss, shared L3 0.25 GB/s"), ("product-3w-lose0-l3-1", "loss, shared L3 1 GB/s"), ("product-3w-lose0-l3-4", "loss, shared L3 4 GB/s"),
                    ("product-3w-lose0-l3-16", "loss, shared L3 16 GB/s")):
    r = run(name)
    if r is None:
        continue
    s, f = r["summary"], r["faults"]
    l3 = f.get("l3")
    read_s = "-" if not l3 else f"{l3['read_s']:.1f} s"
    ttft = "-" if f["rehomed_ttft_mean_s"] is None else f"{f['rehomed_ttft_mean_s']:.2f} / {f['rehomed_ttft_max_s']:.2f} s"
    print(f"| {label} | {s['makespan_s']:.1f} s | {pct(s['recomputed_share'])} | {f['failed_requests']} | "
          f"{f['rehomed_sessions']} | {f['rehome_history_tokens']:,} | {f['rehomed_recomputed_tokens']:,} | "
          f"{f['rehomed_l3_read_tokens']:,} | {read_s} | {ttft} |")
lost = run("product-3w-lose0")
if lost and lost["faults"].get("l3_break_even_gbps"):
    print(f"\nBreak-even L3 read bandwidth for the re-homed histories (mean, past the shared prompt): "
          f"{lost['faults']['l3_break_even_gbps']} GB/s (`l3_store_model.break_even_gbps`, idle-engine prefill).")
