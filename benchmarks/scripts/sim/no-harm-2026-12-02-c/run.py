"""The no-harm simulator table (issue 24), round c: stock HiCache vs the product and candidate lock rules.

    PYTHONPATH=. python3 benchmarks/scripts/sim/no-harm-2026-12-02-c/run.py [--jobs N] [--only W ...] [--rows R ...]
        [--out DIR] [--table-only]

Round c (this script, from round b's): the stock rows (``hicache``) are round b's files, copied
(``--copy-stock``: the LRU path did not change); the rows are round b's product (``product-b``:
``lock_due_backed_up`` true, still the default, so ``product`` would be the same run) and the candidate
rules for backed-up leases of issue 24 (``cand-*``: plugin settings passed on ``--policy-config``), on
the six workloads of the no-harm table (and miniswe with its copies 0.4 / 0.6 s apart). Run as
``--copy-stock --rows cand-hostshort product-b cand-nolock cand-fcfs``, then ``--copy-stock --only
miniswe-o0.4 miniswe-o0.6 --rows cand-hostshort``.

Each cell is one ``sglang-sidecar simulate`` run (its command is stored in its JSON, and all of them
in commands.txt); the workloads are the ones ``benchmarks/run_matrix.sh`` runs on the GPU, with
the same traces and replication. Writes DIR/<row>-<workload>.json (+ -turns.csv) and DIR/table.md.
The simulator is deterministic: the figures depend only on the repository.

Beyond the 2026-12-01 table: on the ratio-1 workloads the rows ``product-wait120`` (the preset with
``max_wait = 120``: the door's trade-off) and ``hicache-wb`` / ``product-wb`` (both with SGLang's
``--hicache-write-policy write_back``: the host tier then holds only what the GPU gave up, twice the
distinct KV of write-through at ratio 1; another engine flag, so not the no-harm pair), and the workloads ``miniswe-o0.4`` / ``miniswe-o0.6`` (miniswe with its
copies 0.4 / 0.6 s apart instead of 0.5 s: how much its TTFT tail moves with nothing but the
arrival pattern). The table adds the longest first-turn TTFT (door wait + prefill) and how many
first turns waited over 60 s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
HERE = REPO / "benchmarks" / "results" / "sim" / "no-harm-2026-12-02-c"
ROUND_B = REPO / "benchmarks" / "results" / "sim" / "no-harm-2026-12-02-b"  # where its results live
REAL = "benchmarks/results/real-traces"
OVERLOAD = "benchmarks/results/h200-2026-12-01/trace-overload.jsonl"
KV = 173_200
UNCONSTRAINED_KV = 600_000

# workload -> (trace flags, host-tier ratio); the same as run_matrix.sh's
WORKLOADS = {
    "0.5s": (["--synthetic", "reference", "--tool-wait", "0.5"], 3),
    "5s": (["--synthetic", "reference", "--tool-wait", "5"], 3),
    "tracelab": (["--trace", f"{REAL}/tracelab-examples.jsonl", "--replicate", "7", "--replicate-offset", "20",
                  "--context-length", "65536"], 3),
    "miniswe": (["--trace", f"{REAL}/lmcache-miniswe.jsonl", "--start-spacing", "1", "--replicate", "2",
                 "--replicate-offset", "0.5", "--context-length", "65536"], 3),
    "overload": (["--trace", OVERLOAD, "--tool-wait", "0.5"], 1),
    "tracelab-r1": (["--trace", f"{REAL}/tracelab-examples.jsonl", "--replicate", "7", "--replicate-offset", "20",
                     "--context-length", "65536"], 1),
    "miniswe-o0.4": (["--trace", f"{REAL}/lmcache-miniswe.jsonl", "--start-spacing", "1", "--replicate", "2",
                      "--replicate-offset", "0.4", "--context-length", "65536"], 3),
    "miniswe-o0.6": (["--trace", f"{REAL}/lmcache-miniswe.jsonl", "--start-spacing", "1", "--replicate", "2",
                      "--replicate-offset", "0.6", "--context-length", "65536"], 3),
}
PLUGIN_CONFIG = {"max_leased_fraction": 0.8}


def _product(ratio, **plugin):
    # the rules as this round ran them: defer_with_host_room (round d, now the default) off; the waiting-
    # prefix refresh that round d added to the plugin has no setting, so a re-run differs by it
    plugin = {"defer_with_host_room": False, **plugin}
    return ["--policy", "session_ttl", "--policy-config", json.dumps({**PLUGIN_CONFIG, **plugin}),
            "--sidecar-config", "configs/coding-agent.toml", "--hicache-ratio", str(ratio)]


ROWS = {
    "hicache": lambda r: ["--policy", "lru", "--hicache-ratio", str(r)],
    "product": lambda r: _product(r),  # the shipped defaults
    # candidates (every one names its rule, so the rows do not depend on the defaults)
    "cand-hostshort": lambda r: _product(r, lock_due_backed_up="host_short"),  # round c's rule
    "product-b": lambda r: _product(r, lock_due_backed_up=True),  # round b's defaults
    "cand-nolock": lambda r: _product(r, lock_due_backed_up=False),
    "cand-fcfs": lambda r: _product(r, lock_due_backed_up=True, prefer_leased_requests=False),
    "cand-wait05": lambda r: _product(r, lock_due_backed_up=True, max_priority_wait_s=0.5),
}
# the six rows of the no-harm table, and miniswe with its copies 0.4 / 0.6 s apart (how far its tail
# moves with the arrival pattern alone; round b's stock rows of those too)
WORKLOADS = {k: v for k, v in WORKLOADS.items()
             if k in ("0.5s", "5s", "tracelab", "miniswe", "overload", "tracelab-r1", "miniswe-o0.4", "miniswe-o0.6")}
UNCONSTRAINED_ON = ()
RATIO_1_ONLY = ()


def command(row: str, workload: str) -> list[str]:
    flags, ratio = WORKLOADS[workload]
    kv = UNCONSTRAINED_KV if row == "unconstrained" else KV
    return [sys.executable, "-m", "sidecar", "simulate", *flags, "--kv-tokens", str(kv), *ROWS[row](ratio),
            "--name", f"{row}-{workload}", "--out", str(OUT.relative_to(REPO) if OUT.is_relative_to(REPO) else OUT)]


def run_one(cmd: list[str]) -> str:
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


def _turn_p99_later(path: Path) -> float | None:
    import csv

    with path.open(newline="") as f:
        xs = sorted(float(t["ttft_s"]) for t in csv.DictReader(f) if t["ttft_s"] and int(t["turn"]) > 0)
    return xs[min(len(xs) - 1, int(round(0.99 * (len(xs) - 1))))] if xs else None


def _first_turns(path: Path) -> tuple[float, int]:
    """(the longest first-turn TTFT, first turns over 60 s): the door wait is part of it."""
    import csv

    with path.open(newline="") as f:
        xs = [float(t["ttft_s"]) for t in csv.DictReader(f) if t["ttft_s"] and int(t["turn"]) == 0]
    return (max(xs) if xs else 0.0), sum(x > 60 for x in xs)


def table() -> str:
    out = ["| workload | run | makespan | x hicache | recomputed | TTFT p50 | x | TTFT p90 | x | TTFT p99 | x | "
           "later-turn p99 | first-turn max | > 60 s | failed |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in WORKLOADS:
        base = OUT / f"hicache-{w}.json"
        b = json.loads(base.read_text())["summary"] if base.exists() else None
        for row in ROWS:
            p = OUT / f"{row}-{w}.json"
            if not p.exists():
                continue
            s = json.loads(p.read_text())["summary"]
            later = _turn_p99_later(OUT / f"{row}-{w}-turns.csv")
            first, over = _first_turns(OUT / f"{row}-{w}-turns.csv")

            def ratio(key: str) -> str:
                return f"{s[key] / b[key]:.2f}x" if b and b[key] else "-"

            out.append(f"| {w} | {row} | {s['makespan_s']:.1f} s | {ratio('makespan_s')} | "
                       f"{100 * s['recomputed_share']:.1f} % | {s['ttft_p50_s']:.2f} s | {ratio('ttft_p50_s')} | "
                       f"{s['ttft_p90_s']:.2f} s | {ratio('ttft_p90_s')} | {s['ttft_p99_s']:.2f} s | "
                       f"{ratio('ttft_p99_s')} | {later:.2f} s | {first:.1f} s | {over} | {s['turns_failed']} |")
    return "\n".join(out) + "\n"


def main() -> None:
    global OUT
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", nargs="*", default=None, help="workloads")
    ap.add_argument("--rows", nargs="*", default=None, help="rows (hicache product unconstrained)")
    ap.add_argument("--out", default=str(HERE))
    ap.add_argument("--table-only", action="store_true")
    ap.add_argument("--copy-stock", action="store_true", help="take the hicache rows from round b (LRU path unchanged)")
    args = ap.parse_args()
    OUT = Path(args.out).resolve()
    OUT.mkdir(parents=True, exist_ok=True)
    jobs = [(r, w) for w in WORKLOADS for r in ROWS
            if (args.only is None or w in args.only) and (args.rows is None or r in args.rows)
            and (r != "unconstrained" or w in UNCONSTRAINED_ON) and (r not in RATIO_1_ONLY or WORKLOADS[w][1] == 1)]
    if args.copy_stock:
        import shutil

        for w in WORKLOADS:
            for suffix in (".json", "-turns.csv"):
                shutil.copy(ROUND_B / f"hicache-{w}{suffix}", OUT / f"hicache-{w}{suffix}")
        jobs = [(r, w) for r, w in jobs if r != "hicache"]
    if not args.table_only:
        cmds = [command(r, w) for r, w in jobs]
        with (OUT / "commands.txt").open("a") as f:
            for c in cmds:
                f.write(" ".join(c[1:] if c[0] == sys.executable else c).replace("-m sidecar", "python3 -m sidecar", 1) + "\n")
        t0 = time.monotonic()
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            for (r, w), line in zip(jobs, pool.map(run_one, cmds)):
                print(f"[{time.monotonic() - t0:6.0f} s] {line}", flush=True)
    md = table()
    (OUT / "table.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
