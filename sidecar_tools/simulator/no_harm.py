"""The no-harm table of issue 24 in the simulator: configurations (rows) over the GPU matrix's workloads.

Each cell is one ``sglang-sidecar simulate`` run (its command is stored in its JSON, and all of them in
``commands.txt``); the workloads are the ones ``benchmarks/run_matrix.sh`` runs on the GPU, with the same
traces and replication, so a round of the table is a dry run of a GPU sitting. A round names its rows (the
flags each adds for a host-tier ratio) and where its results live; the simulator is deterministic, so the
figures depend only on the repository. Writes ``<out>/<row>-<workload>.json`` (+ ``-turns.csv``) and
``<out>/table.md`` with, beside the matrix's figures, the later-turn p99, the longest first-turn TTFT (door
wait + prefill) and how many first turns took over 60 s.
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REAL = "benchmarks/results/real-traces"
OVERLOAD = "benchmarks/results/h200-2026-12-01/trace-overload.jsonl"
KV = 173_200
UNCONSTRAINED_KV = 600_000


def _miniswe(offset: str) -> list[str]:
    return ["--trace", f"{REAL}/lmcache-miniswe.jsonl", "--start-spacing", "1", "--replicate", "2",
            "--replicate-offset", offset, "--context-length", "65536"]


_TRACELAB = ["--trace", f"{REAL}/tracelab-examples.jsonl", "--replicate", "7", "--replicate-offset", "20",
             "--context-length", "65536"]

_OPENAI = ["--template-tokens", "qwen3-openai"]

# workload -> (trace flags, host-tier ratio); the same as run_matrix.sh's. miniswe-o0.4 / -o0.6 are
# miniswe with its copies 0.4 / 0.6 s apart: how far its tail moves with the arrival pattern alone;
# *-n26: the reference with 26 agents (past where a per-agent count of the shared prompt stops fitting);
# *-openai: the prompts as the OpenAI path renders them on the GPU (the chat template's tokens added).
WORKLOADS: dict[str, tuple[list[str], int]] = {
    "0.5s": (["--synthetic", "reference", "--tool-wait", "0.5"], 3),
    "5s": (["--synthetic", "reference", "--tool-wait", "5"], 3),
    "tracelab": (_TRACELAB, 3),
    "miniswe": (_miniswe("0.5"), 3),
    "overload": (["--trace", OVERLOAD, "--tool-wait", "0.5"], 1),
    "tracelab-r1": (_TRACELAB, 1),
    "miniswe-o0.4": (_miniswe("0.4"), 3),
    "miniswe-o0.6": (_miniswe("0.6"), 3),
    "0.5s-n26": (["--synthetic", "reference", "--sessions", "26", "--tool-wait", "0.5"], 3),
    "5s-n26": (["--synthetic", "reference", "--sessions", "26", "--tool-wait", "5"], 3),
    "0.5s-openai": (["--synthetic", "reference", "--tool-wait", "0.5", *_OPENAI], 3),
    "5s-openai": (["--synthetic", "reference", "--tool-wait", "5", *_OPENAI], 3),
    "5s-openai-n26": (["--synthetic", "reference", "--sessions", "26", "--tool-wait", "5", *_OPENAI], 3),
}
MATRIX_WORKLOADS = ("0.5s", "5s", "tracelab", "miniswe", "overload", "tracelab-r1")

Flags = Callable[[int], list[str]]


def stock(ratio: int) -> list[str]:
    """Stock SGLang with its host tier (the baseline: ``hicache`` in the GPU matrix)."""
    return ["--policy", "lru", "--hicache-ratio", str(ratio)]


def product(plugin: dict, ratio: int, *extra: str) -> list[str]:
    """The plugin with ``plugin`` as its config and the sidecar's preset, at a host-tier ratio."""
    return ["--policy", "session_ttl", "--policy-config", json.dumps(plugin),
            "--sidecar-config", "configs/coding-agent.toml", "--hicache-ratio", str(ratio), *extra]


def unconstrained(_ratio: int) -> list[str]:
    """Nothing evicted (UNCONSTRAINED_KV tokens, no host tier): the limit any policy can reach."""
    return ["--policy", "lru"]


@dataclass
class Round:
    """One round of the table: its rows, its workloads and where its results live."""

    out: Path
    rows: dict[str, Flags]
    workloads: tuple[str, ...] = MATRIX_WORKLOADS
    unconstrained_on: tuple[str, ...] = ()  # workloads that get the ``unconstrained`` row
    ratio_1_only: tuple[str, ...] = ()  # rows run on the ratio-1 workloads only
    # take the ``hicache`` rows from these rounds, the first that has each (the LRU path unchanged)
    stock_from: Path | tuple[Path, ...] | None = None

    def stock_file(self, workload: str, suffix: str) -> Path | None:
        """The earlier round's ``hicache-<workload><suffix>``, if one has it."""
        rounds = (self.stock_from,) if isinstance(self.stock_from, Path) else self.stock_from or ()
        return next((d / f"hicache-{workload}{suffix}" for d in rounds if (d / f"hicache-{workload}{suffix}").exists()),
                    None)

    def cells(self, only: list[str] | None, rows: list[str] | None) -> list[tuple[str, str]]:
        return [(r, w) for w in self.workloads for r in self.rows
                if (only is None or w in only) and (rows is None or r in rows)
                and (r != "unconstrained" or w in self.unconstrained_on)
                and (r not in self.ratio_1_only or WORKLOADS[w][1] == 1)]

    def command(self, row: str, workload: str, out: Path) -> list[str]:
        flags, ratio = WORKLOADS[workload]
        kv = UNCONSTRAINED_KV if row == "unconstrained" else KV
        where = out.relative_to(REPO) if out.is_relative_to(REPO) else out
        return [sys.executable, "-m", "sidecar", "simulate", *flags, "--kv-tokens", str(kv), *self.rows[row](ratio),
                "--name", f"{row}-{workload}", "--out", str(where)]


def _run_one(cmd: list[str]) -> str:
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1]


def _ttfts(path: Path, first: bool) -> list[float]:
    with path.open(newline="") as f:
        return [float(t["ttft_s"]) for t in csv.DictReader(f) if t["ttft_s"] and (int(t["turn"]) == 0) == first]


def _p99(xs: list[float]) -> float | None:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.99 * (len(xs) - 1))))] if xs else None


def table(out: Path, rows: list[str], workloads: list[str]) -> str:
    """Every cell found under ``out``, each ratio against the ``hicache`` row of its workload."""
    lines = ["| workload | run | makespan | x hicache | recomputed | TTFT p50 | x | TTFT p90 | x | TTFT p99 | x | "
             "later-turn p99 | first-turn max | > 60 s | failed |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in workloads:
        base = out / f"hicache-{w}.json"
        b = json.loads(base.read_text())["summary"] if base.exists() else None
        for row in rows:
            p = out / f"{row}-{w}.json"
            if not p.exists():
                continue
            s = json.loads(p.read_text())["summary"]
            turns = out / f"{row}-{w}-turns.csv"
            later = _p99(_ttfts(turns, first=False))
            firsts = _ttfts(turns, first=True)

            def ratio(key: str) -> str:
                return f"{s[key] / b[key]:.2f}x" if b and b[key] else "-"

            lines.append(
                f"| {w} | {row} | {s['makespan_s']:.1f} s | {ratio('makespan_s')} | "
                f"{100 * s['recomputed_share']:.1f} % | {s['ttft_p50_s']:.2f} s | {ratio('ttft_p50_s')} | "
                f"{s['ttft_p90_s']:.2f} s | {ratio('ttft_p90_s')} | {s['ttft_p99_s']:.2f} s | {ratio('ttft_p99_s')} | "
                f"{later:.2f} s | {max(firsts, default=0.0):.1f} s | {sum(x > 60 for x in firsts)} | "
                f"{s['turns_failed']} |")
    return "\n".join(lines) + "\n"


def run(round_: Round, argv: list[str] | None = None, description: str = "") -> None:
    """The round's command line: ``[--jobs N] [--only W ...] [--rows R ...] [--out DIR] [--table-only]``."""
    ap = argparse.ArgumentParser(description=description or __doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", nargs="*", default=None, help=f"workloads ({' '.join(round_.workloads)})")
    ap.add_argument("--rows", nargs="*", default=None, help=f"rows ({' '.join(round_.rows)})")
    ap.add_argument("--out", default=str(round_.out))
    ap.add_argument("--table-only", action="store_true")
    if round_.stock_from is not None:
        ap.add_argument("--copy-stock", action="store_true",
                        help=f"take the hicache rows from {round_.stock_from} where they are (LRU path unchanged)")
    args = ap.parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    cells = round_.cells(args.only, args.rows)
    if getattr(args, "copy_stock", False):
        copied = {w for _, w in cells if round_.stock_file(w, ".json") is not None}
        for w in copied:
            for suffix in (".json", "-turns.csv"):
                shutil.copy(round_.stock_file(w, suffix), out / f"hicache-{w}{suffix}")
        cells = [(r, w) for r, w in cells if r != "hicache" or w not in copied]
    if not args.table_only:
        cmds = [round_.command(r, w, out) for r, w in cells]
        with (out / "commands.txt").open("a") as f:
            for c in cmds:
                f.write(shlex.join(["python3", *c[1:]]) + "\n")
        t0 = time.monotonic()
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            for line in pool.map(_run_one, cmds):
                print(f"[{time.monotonic() - t0:6.0f} s] {line}", flush=True)
    md = table(out, list(round_.rows), list(round_.workloads))
    (out / "table.md").write_text(md)
    print(md)
