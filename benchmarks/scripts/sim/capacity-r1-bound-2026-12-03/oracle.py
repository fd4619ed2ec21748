"""Capacity searches (or single rates) of idealised engines the simulator can express, as upper bounds
on what any cache / admission policy reaches with stock's engine flags (173,200 GPU KV tokens):

  free-host-r10   GPU 173,200, host ratio 10 (holds every session's KV), host<->GPU copies free
                  (rate 1e12 tokens/s, no latency): no recompute, no load wait; only GPU room for the
                  running batch and the engine's compute remain. Bounds every cache policy at ratio 1
                  (whose host holds a tenth of this and whose loads cost time).
  free-host-r2    the same with host ratio 2: 2 x 173,200 distinct tokens, i.e. both of ratio 1's pools
                  holding distinct KV (the physical limit of ratio 1's memory), loads free, LRU.
  free-host-r1    ratio 1, write-through (stock's tier), loads free: stock's distinct KV (one pool's worth).
  unconstrained   600,000 GPU tokens, nothing evicted (the limit of limits-2026-12-02).

Each point is the capacity benchmark's own (same trace, window, seed, SLO: capacity.simulate_run and
point_from_run); only the simulate flags and the calibration differ. The sidecar is stock's pass-through
(policy off, admission off) unless --sidecar-flags says otherwise.

    python3 oracle.py search --engine free-host-r10 --dist reference --start 24 --out DIR
    python3 oracle.py run --engine free-host-r10 --dist traces --rate 14.46 --out DIR
"""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import time
from datetime import UTC, datetime
from pathlib import Path

from sidecar_tools.benchmarks.capacity import (
    CONFIGS, KV_TOKENS, engine_flags, point_from_run, simulate_flags, simulate_run,
)
from sidecar_tools.benchmarks.capacity_slo import DEFAULT_WINDOWS, SLO, capacity_from_points, search_capacity
from sidecar_tools.benchmarks.open_loop import open_loop_trace
from sidecar_tools.simulator.costmodel import DEFAULT_CALIBRATION

FREE = {"host_load_tokens_per_s": 1e12, "host_load_latency_s": 0.0,
        "host_write_tokens_per_s": 1e12, "host_write_latency_s": 0.0}
ENGINES = {  # name -> (kv tokens, host ratio, free copies)
    "free-host-r10": (KV_TOKENS, 10.0, True),
    "free-host-r2": (KV_TOKENS, 2.0, True),
    "free-host-r1": (KV_TOKENS, 1.0, True),
    "unconstrained": (600_000, 1.0, False),
    "r1": (KV_TOKENS, 1.0, False),  # stock's engine as it is (the H200 calibration): for --sim-flag what-ifs
}


def free_calibration(out: Path) -> Path:
    doc = json.loads(DEFAULT_CALIBRATION.read_text())
    doc = copy.deepcopy(doc)
    doc["name"] += "-free-host-copies"
    doc["description"] = "The H200 calibration with free host<->GPU copies (what-if bound): " + doc["description"]
    doc["model"].update(FREE)
    path = out / "calibration-free-host.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["search", "run"])
    ap.add_argument("--engine", choices=sorted(ENGINES), required=True)
    ap.add_argument("--dist", choices=["reference", "traces"], required=True)
    ap.add_argument("--config", choices=sorted(CONFIGS), default="hicache")
    ap.add_argument("--sidecar-flags", default=None)
    ap.add_argument("--engine-flags", default=None, help="replace the configuration's own SGLang flags")
    ap.add_argument("--sim-flag", action="append", default=[], help="extra simulate flag (e.g. --expected-back-oracle)")
    ap.add_argument("--tag", default="", help="suffix of the result's name")
    ap.add_argument("--rate", type=float, action="append", default=[])
    ap.add_argument("--start", type=float, default=20.0)
    ap.add_argument("--max-points", type=int, default=6)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    kv, ratio, free = ENGINES[a.engine]
    a.out.mkdir(parents=True, exist_ok=True)
    engine = engine_flags(a.config, ratio, a.dist, kv, shlex.split(a.engine_flags) if a.engine_flags else None)
    sidecar = list(CONFIGS[a.config].sidecar) if a.sidecar_flags is None else shlex.split(a.sidecar_flags)
    flags = simulate_flags(engine, sidecar) + a.sim_flag
    if free:
        flags += ["--calibration", str(free_calibration(a.out))]
    window, slo, seed = DEFAULT_WINDOWS[a.dist], SLO(), 2
    points = []

    def evaluate(rate: float) -> bool:
        trace = open_loop_trace(a.dist, rate, window.sessions, seed)
        t0 = time.monotonic()
        run, records = simulate_run(trace, flags, round(window.time_limit_s(trace.sessions[-1].start_s), 3))
        point = point_from_run(run, records, trace, rate, window, slo, engine="simulator",
                               wall_s=round(time.monotonic() - t0, 1))
        d = point.to_dict()
        points.append(d)
        print(f"{a.engine} {a.config}{' ' + a.tag if a.tag else ''} {a.dist} λ {rate:g}: later p99 {d['later_turn_ttft_p99_s']}, first p99 "
              f"{d['first_turn_ttft_p99_s']}, recomputed {d['recomputed_share']} -> "
              f"{'meets' if d['meets_slo'] else 'misses'}", flush=True)
        return point.meets_slo

    search = None
    if a.mode == "search":
        found = search_capacity(evaluate, a.start, tolerance=0.1, factor=1.5, min_rate=0.5, max_rate=240.0,
                                max_points=a.max_points)
        search = {k: found[k] for k in ("rates_tried", "budget_exhausted", "search")}
    else:
        for r in a.rate:
            evaluate(r)
    points.sort(key=lambda p: p["rate_per_min"])
    found = capacity_from_points(points)
    tag = "" if a.config == "hicache" and a.sidecar_flags is None else f"-{a.config}" + ("-custom" if a.sidecar_flags else "")
    name = f"oracle-{a.engine}{tag}{'-' + a.tag if a.tag else ''}-{a.dist}"
    result = {"capacity_per_min": found["capacity_per_min"], "bracket": found["bracket"], "bounded": found["bounded"],
              "engine": a.engine, "kv_tokens": kv, "hicache_ratio": ratio, "free_host_copies": free,
              "config": a.config, "distribution": a.dist, "seed": seed, "slo": slo.to_dict(window),
              "sglang_flags": engine, "simulate_flags": flags, "sidecar_flags": sidecar, "points": points, "search": search,
              "created_at": datetime.now(UTC).isoformat(timespec="seconds")}
    path = a.out / f"{name}.json"
    if a.mode == "run" and path.exists():  # merge single rates into an earlier file
        old = json.loads(path.read_text())
        rates = {p["rate_per_min"] for p in points}
        points = sorted([p for p in old["points"] if p["rate_per_min"] not in rates] + points,
                        key=lambda p: p["rate_per_min"])
        found = capacity_from_points(points)
        result.update(points=points, capacity_per_min=found["capacity_per_min"], bracket=found["bracket"],
                      bounded=found["bounded"], search=old.get("search"))
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{name}: capacity {result['capacity_per_min']} (bracket {result['bracket']}); saved {path}")


if __name__ == "__main__":
    main()
