"""The simulator table of the real traces: every row and the markdown table, one command (no GPU).

    python3 benchmarks/scripts/real-traces/simulate.py [--jobs N] [--no-hicache] [--only ROW ...]
    (= bash benchmarks/scripts/real-traces/simulate.sh)

Each row is one ``sglang-sidecar simulate`` run (the command is stored in its JSON) on a workload
made of a committed trace of ``benchmarks/results/real-traces/``: sessions replicated with stated start offsets so that a
GPU KV budget of 1/2.5 of the summed final contexts is really short. Writes
``benchmarks/results/real-traces/sim/<workload>-<row>.json`` (+ ``-turns.csv``) and ``sim/table.md``
there (``--out`` elsewhere). The simulator is deterministic: the numbers depend only on
the repository (the trace, the policy code, the calibration), not on ``--jobs``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
RESULTS = REPO / "benchmarks" / "results" / "real-traces"  # the traces, and the runs under sim/
OUT = RESULTS / "sim"  # --out changes it
REL = RESULTS.relative_to(REPO)
BUDGET_FRACTION = 1 / 2.5
UNCONSTRAINED_KV = 600_000  # run_matrix.sh's unconstrained limit; checked to hold every context below

# name -> (trace, transform flags, what it is)
WORKLOADS = {
    "tracelab": (f"{REL}/tracelab-examples.jsonl", ["--replicate", "7", "--replicate-offset", "5"],
                 "TraceLab's 2 sessions (Claude Code 49,157 and Codex 12,162 final tokens, started together as "
                 "converted) x 7 copies, copy k starting 5k s later (0-30 s): 14 sessions, 133 calls"),
    "lmcache": (f"{REL}/lmcache-miniswe.jsonl", ["--start-spacing", "1", "--replicate", "2", "--replicate-offset", "0.5"],
                "LMCache mini-swe-agent's 20 sessions, session i starting at i s (recorded: one after the other over "
                "542 s, never more than one live) x 2 copies, the copy 0.5 s after: 40 sessions, 804 calls"),
}

PLUGIN = ["--policy", "session_ttl", "--policy-config", '{"max_leased_fraction": 0.8}']
SIDECAR = ["--sidecar-config", "configs/coding-agent.toml"]
# row -> (flags, label); the product is what the README starts: plugin session_ttl (0.8 lease bound) +
# the sidecar with configs/coding-agent.toml (predictive leases, admission on)
ROWS = {
    "lru": (["--policy", "lru"], "stock SGLang, LRU"),
    "tlru": (["--policy", "tlru"], "stock SGLang, TLRU (threshold 4096, next 1024)"),
    "fixed-10s": (PLUGIN + SIDECAR + ["--sidecar-policy", "fixed:10"], "plugin + sidecar, fixed 10 s leases"),
    "fixed-30s": (PLUGIN + SIDECAR + ["--sidecar-policy", "fixed:30"], "plugin + sidecar, fixed 30 s leases"),
    "product": (PLUGIN + SIDECAR, "**product** (plugin + sidecar, predictive leases)"),
    "product-no-admission": (PLUGIN + SIDECAR + ["--no-admission"], "diagnostic: the product without its admission gate"),
    "product-leases-off": (PLUGIN + SIDECAR + ["--sidecar-policy", "off"], "diagnostic: the product with leases off"),
    "product-no-aging": (["--policy", "session_ttl", "--policy-config", '{"max_leased_fraction": 0.8, "max_priority_wait_s": 1e9}']
                         + SIDECAR, "diagnostic: the product without aging (leased requests first, unbounded)"),
    "unconstrained": (["--policy", "lru", "--kv-tokens", str(UNCONSTRAINED_KV)], "unconstrained limit (600,000 KV tokens)"),
}
HICACHE_ROWS = {
    "hicache": (["--policy", "lru", "--hicache-ratio", "3"], "stock HiCache, ratio 3 (LRU)"),
    "product-hicache": (PLUGIN + SIDECAR + ["--hicache-ratio", "3"], "**product** over HiCache, ratio 3"),
    "product-hicache-no-admission": (PLUGIN + SIDECAR + ["--hicache-ratio", "3", "--no-admission"],
                                     "diagnostic: the product over HiCache without its admission gate"),
    "product-hicache-leases-off": (PLUGIN + SIDECAR + ["--hicache-ratio", "3", "--sidecar-policy", "off"],
                                   "diagnostic: the product over HiCache with leases off"),
}


def workload_trace(name: str):
    sys.path.insert(0, str(REPO))
    from sidecar_tools.benchmarks.traces import load_jsonl

    path, flags, _ = WORKLOADS[name]
    trace = load_jsonl(REPO / path)
    opts = dict(zip(flags[::2], flags[1::2]))
    if "--start-spacing" in opts:
        trace = trace.with_start_spacing(float(opts["--start-spacing"]))
    return trace.replicated(int(opts.get("--replicate", 1)), float(opts.get("--replicate-offset", 0)))


def budget(name: str) -> tuple[int, int]:
    """(summed final contexts, KV budget = 1/2.5 of it rounded to 100 tokens)."""
    total = sum(s.final_context_tokens() for s in workload_trace(name).sessions)
    assert total < UNCONSTRAINED_KV, f"{name}: {total} tokens do not fit the unconstrained pool"
    return total, int(round(total * BUDGET_FRACTION, -2))


def command(workload: str, row: str, flags: list[str], kv: int) -> list[str]:
    path, transform, _ = WORKLOADS[workload]
    kv_flags = [] if "--kv-tokens" in flags else ["--kv-tokens", str(kv)]
    return [sys.executable, "-m", "sidecar", "simulate", "--trace", path, *transform, *kv_flags, *flags,
            "--name", f"{workload}-{row}", "--out", _shown(OUT)]


def _shown(path: Path) -> str:
    """A path as the stored command shows it: relative to the repository when it lies inside."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def run_one(cmd: list[str]) -> tuple[str, float]:
    t0 = time.monotonic()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1], time.monotonic() - t0


def _turns(workload: str, row: str) -> list[dict[str, str]]:
    with (OUT / f"{workload}-{row}-turns.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def _f(x: float | None, spec: str, suffix: str = "") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:{spec}}{suffix}"


def table(workload: str, rows: dict[str, tuple[list[str], str]], base: str) -> str:
    runs = {r: json.loads((OUT / f"{workload}-{r}.json").read_text()) for r in rows if (OUT / f"{workload}-{r}.json").exists()}
    b = runs[base]["summary"]
    out = [f"| run | makespan | x {base} | recomputed history | TTFT p50 | TTFT p90 | TTFT p99 | TTFT max | "
           "first-turn TTFT sum | later-turn TTFT sum | prefill / decode busy | tokens per decode step | failed turns |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r, run in runs.items():
        s = run["summary"]
        turns = _turns(workload, r)
        ttft = [(float(t["ttft_s"]), int(t["turn"])) for t in turns if t["ttft_s"]]
        first = sum(x for x, k in ttft if k == 0)
        later = sum(x for x, k in ttft if k > 0)
        failed = f"{s['turns_failed']}" + (" (timed out)" if s.get("timed_out") else "")
        busy = run["simulator"]["engine_busy_s"]
        counters = run["metrics"]["engine"]["counters"]
        per_step = counters["sglang:generation_tokens_total"] / max(1.0, counters["sim:decode_steps_total"])
        out.append(
            f"| {rows[r][1]} | {_f(s['makespan_s'], '.1f', ' s')} | {_f(b['makespan_s'] / s['makespan_s'], '.2f', 'x')} | "
            f"{_f(100 * s['recomputed_share'], '.1f', ' %')} | {_f(s['ttft_p50_s'], '.2f', ' s')} | "
            f"{_f(s['ttft_p90_s'], '.2f', ' s')} | {_f(s['ttft_p99_s'], '.2f', ' s')} | "
            f"{_f(max((x for x, _ in ttft), default=None), '.1f', ' s')} | {first:.0f} s | {later:.0f} s | "
            f"{busy['prefill']:.0f} / {busy['decode']:.0f} s | {per_step:.2f} | {failed} |")
    return "\n".join(out) + "\n"


def main() -> None:
    global OUT
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2, help="simulations at a time (default 2)")
    ap.add_argument("--no-hicache", action="store_true", help="skip the host-tier rows")
    ap.add_argument("--table-only", action="store_true", help="only rebuild sim/table.md from the JSONs there")
    ap.add_argument("--only", nargs="*", default=None, help="only these rows (e.g. lru product); the table keeps the others' JSONs")
    ap.add_argument("--out", type=Path, default=OUT,
                    help=f"folder of the runs and table.md (default {OUT.relative_to(REPO)})")
    args = ap.parse_args()
    OUT = args.out.resolve()
    all_rows = {**ROWS, **({} if args.no_hicache else HICACHE_ROWS)}
    budgets = {w: budget(w) for w in WORKLOADS}
    jobs = [(w, r, command(w, r, flags, budgets[w][1])) for w in WORKLOADS for r, (flags, _) in all_rows.items()
            if not args.table_only and (args.only is None or r in args.only)]
    OUT.mkdir(exist_ok=True)
    t0 = time.monotonic()
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        for (w, r, _), (line, secs) in zip(jobs, pool.map(lambda j: run_one(j[2]), jobs)):
            print(f"[{secs:5.1f} s] {line}", flush=True)
    print(f"{len(jobs)} runs in {time.monotonic() - t0:.0f} s", flush=True)

    md = ["# Simulator table: the real traces under a short GPU KV budget", "",
          "Generated by `bash benchmarks/scripts/real-traces/simulate.sh` (`simulate.py`); raw runs in `sim/`.",
          "TTFT includes the sidecar's admission wait; first-turn / later-turn TTFT sum: seconds spent waiting",
          "for a first token on sessions' first turns (admission) and on their later turns (queueing, recompute).",
          "Prefill / decode busy: simulated engine seconds in each; tokens per decode step: how wide the decode batch was.", ""]
    for w, (path, transform, what) in WORKLOADS.items():
        total, kv = budgets[w]
        md += [f"## {w}: {what}", "",
               f"`{path}` with `{' '.join(transform)}`; summed final contexts {total:,} tokens; "
               f"GPU KV budget {kv:,} tokens (1/2.5).", "", table(w, ROWS, "lru")]
        if not args.no_hicache or all((OUT / f"{w}-{r}.json").exists() for r in HICACHE_ROWS):
            md += [f"With the host tier (`--hicache-ratio 3`: {3 * kv:,} host tokens), against stock HiCache:", "",
                   table(w, {**HICACHE_ROWS, "lru": ROWS["lru"]}, "hicache")]
    (OUT / "table.md").write_text("\n".join(md))
    print((OUT / "table.md").read_text())


if __name__ == "__main__":
    main()
