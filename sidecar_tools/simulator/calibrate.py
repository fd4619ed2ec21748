"""Fit the cost model to GPU runs: simulate each target run, match its makespan.

A *target* is one GPU run: what it measured (makespan, recomputed share, TTFT) and how to
simulate it (trace, KV budget, eviction policy, client cap, lease, sidecar). Targets come from a
JSON file (``calibration/gpu-readme-runs.json`` holds the GPU README's table) and/or from run
JSONs written by ``sidecar_tools.benchmarks.replay`` / ``benchmarks/run_matrix.sh`` (their config is read
from the run name ``<config>-<mode>-<gap>s`` and the run's own config and trace metadata), or
from a per-turn CSV alone (reference preset, the CSV's gap).

Targets marked ``"fit": true`` drive the fit of every coefficient; ``"fit": [names]`` only the
fit of those coefficients (the HiCache runs inform the host-tier coefficients, not the step
times); the others are held out and only compared. A fit that starts from a calibration file
keeps that file's earlier fits (``earlier_fits``), so the provenance of coefficients it did not
refit stays with them. The objective is the squared log ratio of simulated to GPU makespan, plus
a weak pull of every coefficient toward its physical prior (``CostModel()`` defaults) so an
under-determined fit stays physical. Optimizer: ``scipy.optimize.least_squares`` over log-coefficients.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sidecar_tools.simulator.costmodel import (
    CALIBRATION_DIR,
    DEFAULT_CALIBRATION,
    CostModel,
    load_calibration,
    save_calibration,
)

DEFAULT_TARGETS = sorted(CALIBRATION_DIR.glob("*-runs.json"))
REPO_ROOT = CALIBRATION_DIR.parents[2]  # sidecar_tools/simulator/calibration -> the checkout
SUMMARY_KEYS = ("makespan_s", "recomputed_share", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s")
PRIOR_WEIGHT = 0.05  # residual per e-fold away from the prior coefficient (vs 1 per e-fold of makespan)
TLRU_CONFIG = {"threshold": 4096, "next_prompt_estimate": 1024}

HOST_FIT = ["host_load_tokens_per_s", "host_load_latency_s"]  # what a HiCache run's makespan informs
MATRIX_HICACHE_RATIO = {"overload": 1.0}  # run_matrix.sh: HICACHE_RATIO=3, OVERLOAD_RATIO=1
MATRIX_PRODUCT_PLUGIN = {"max_leased_fraction": 0.8}  # run_matrix.sh PLUGIN_CONFIG

# run_matrix.sh config name -> how to simulate it
MATRIX_CONFIGS: dict[str, dict[str, Any]] = {
    "lru": {"policy": "lru"},
    "tlru": {"policy": "tlru", "policy_config": TLRU_CONFIG},
    "unconstrained": {"policy": "lru", "kv_tokens": 600_000},
    "cap12": {"policy": "lru", "max_concurrent_sessions": 12},
    "cap8": {"policy": "lru", "max_concurrent_sessions": 8},
    "session-radix": {"policy": "lru", "session_radix_cache": True},
    "plugin": {"policy": "session_ttl"},
    "sidecar": {"policy": "session_ttl", "sidecar": {"config": "configs/coding-agent.toml"}},
    "hicache": {"policy": "lru", "hicache_ratio": 3.0},
    "product": {"policy": "session_ttl", "policy_config": MATRIX_PRODUCT_PLUGIN, "hicache_ratio": 3.0,
                "sidecar": {"config": "configs/coding-agent.toml"}},
}
STEP_FIT_CONFIGS = ("lru", "unconstrained", "cap12", "cap8")


def _matrix_fit(config: str) -> bool | list[str]:
    """Which coefficients a GPU run of this matrix config informs."""
    if config in STEP_FIT_CONFIGS:
        return True
    return list(HOST_FIT) if config == "hicache" else False


def _host_tier_spec(run: dict[str, Any], name: str) -> dict[str, Any]:
    """The host pool of a HiCache run: SGLang's own gauge when the run scraped the engine, else
    run_matrix.sh's ratio for the workload."""
    gauges = ((run.get("metrics") or {}).get("engine") or {}).get("gauges_after") or {}
    total = next((v for k, v in gauges.items() if k.split("{", 1)[0] == "sglang:hicache_host_total_tokens"), None)
    if total:
        return {"hicache_size_tokens": int(total) - 1}  # SGLang adds one padding page
    workload = name.rsplit("-", 1)[-1]
    return {"hicache_ratio": MATRIX_HICACHE_RATIO.get(workload, 3.0)}


# --------------------------------------------------------------------------------------------
# Targets


def load_targets(paths: list[str | Path] | str | Path | None) -> list[dict[str, Any]]:
    """Targets from targets JSONs. A target's GPU numbers are inline (``gpu``) or read from a
    GPU run JSON (``gpu_run``, a path relative to the repo root)."""
    if paths is None or paths == []:
        paths = DEFAULT_TARGETS
    elif isinstance(paths, (str, Path)):
        paths = [paths]
    out = []
    for path in paths:
        doc = json.loads(Path(path).read_text())
        for t in doc["targets"]:
            t = dict(t)
            if t.get("gpu_run"):
                run_path = Path(t["gpu_run"])
                run_path = run_path if run_path.is_absolute() else REPO_ROOT / run_path
                summary = json.loads(run_path.read_text())["summary"]
                t["gpu"] = {k: summary.get(k) for k in SUMMARY_KEYS}
                t["source"] = t.get("source") or t["gpu_run"]
            out.append({**t, "source": t.get("source") or doc.get("source"), "targets_file": Path(path).name})
    return out


def target_from_run(path: str | Path, kv_tokens: int = 173_200) -> dict[str, Any] | None:
    """A target from a GPU run JSON (None when its config cannot be simulated)."""
    path = Path(path)
    run = json.loads(path.read_text())
    if not isinstance(run, dict) or "summary" not in run or run.get("config", {}).get("mode") == "simulate":
        return None
    name = run.get("name") or path.stem
    config = next((c for c in sorted(MATRIX_CONFIGS, key=len, reverse=True) if name.startswith(c + "-")), "")
    spec = dict(MATRIX_CONFIGS.get(config) or {})
    if not spec:
        return None
    if "hicache_ratio" in spec:
        spec.pop("hicache_ratio")
        spec.update(_host_tier_spec(run, name))
    spec.setdefault("kv_tokens", kv_tokens)
    cfg = run.get("config", {})
    if cfg.get("max_concurrent_sessions"):
        spec["max_concurrent_sessions"] = cfg["max_concurrent_sessions"]
    if cfg.get("lease_ttl_s") is not None:
        spec["lease_ttl"] = cfg["lease_ttl_s"]
    meta = (run.get("trace") or {}).get("meta") or {}
    if "tool_wait_override_s" in meta:
        spec["tool_wait"] = meta["tool_wait_override_s"]
    trace_file = path.parent / ("trace-overload.jsonl" if name.endswith("-overload") else "trace.jsonl")
    if trace_file.exists():
        spec["trace"] = str(trace_file)
    elif "generator" in meta:
        spec["generator"] = meta["generator"]
    else:
        return None
    s = run["summary"]
    gpu = {k: s.get(k) for k in ("makespan_s", "recomputed_share", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s")}
    return {"name": name, "fit": _matrix_fit(config), "gpu": gpu, "sim": spec, "source": str(path)}


def target_from_turns_csv(path: str | Path, kv_tokens: int = 173_200) -> dict[str, Any] | None:
    """A target from a per-turn CSV alone (no run JSON beside it): the reference preset with the
    CSV's tool gap; makespan = the last turn's end."""
    from statistics import median

    from sidecar_tools.benchmarks.records import read_turns_csv, summarize

    path = Path(path)
    name = path.name.removesuffix("-turns.csv")
    config = next((c for c in sorted(MATRIX_CONFIGS, key=len, reverse=True) if name.startswith(c + "-")), "")
    if not config:
        return None
    records = read_turns_csv(path)
    if not records:
        return None
    spec = {"preset": "reference", "kv_tokens": kv_tokens, **MATRIX_CONFIGS[config]}
    if "hicache_ratio" in spec:
        spec["hicache_ratio"] = MATRIX_HICACHE_RATIO.get(name.rsplit("-", 1)[-1], 3.0)
    gaps = [r.tool_wait_s for r in records if r.tool_wait_s > 0]
    if gaps:
        spec["tool_wait"] = median(gaps)
    s = summarize(records, max(r.end_s or 0.0 for r in records), None)
    gpu = {k: s.get(k) for k in ("makespan_s", "recomputed_share", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s")}
    return {"name": name, "fit": _matrix_fit(config), "gpu": gpu, "sim": spec, "source": str(path)}


def collect_targets(runs: list[str], targets_paths: list[str] | str | None, kv_tokens: int) -> list[dict[str, Any]]:
    targets = load_targets(targets_paths) if (targets_paths or not runs) else []
    for r in runs:
        p = Path(r)
        files = sorted(p.glob("*.json")) + sorted(p.glob("*-turns.csv")) if p.is_dir() else [p]
        for f in files:
            if f.suffix == ".csv":
                if f.with_name(f.name.removesuffix("-turns.csv") + ".json").exists():
                    continue  # the run JSON says more
                t = target_from_turns_csv(f, kv_tokens)
            else:
                t = target_from_run(f, kv_tokens)
            if t is not None:
                targets.append(t)
    if not targets:
        raise ValueError("no simulable targets (give a targets JSON or GPU run JSONs of run_matrix.sh configs)")
    return targets


# --------------------------------------------------------------------------------------------
# Simulating one target


def _trace(spec: dict[str, Any]):
    from sidecar_tools.benchmarks.traces import SynthConfig, build_config, generate, read_any

    if spec.get("trace"):
        trace = read_any(spec["trace"])
    elif spec.get("generator"):
        trace = generate(SynthConfig.model_validate(spec["generator"]))
    else:
        trace = generate(build_config(spec.get("preset", "reference")))
    if spec.get("sessions") or spec.get("turns"):
        trace = trace.head(spec.get("sessions"), spec.get("turns"))
    if spec.get("tool_wait") is not None:
        trace = trace.with_tool_wait(float(spec["tool_wait"]))
    return trace


def host_tier_of(spec: dict[str, Any]):
    """A spec's host tier (``hicache_ratio`` / ``hicache_size_tokens`` / ``hicache_write_policy``), or None."""
    from sidecar_tools.simulator.hicache_cpu import HostTierArgs

    if spec.get("hicache_ratio") is None and spec.get("hicache_size_tokens") is None:
        return None
    return HostTierArgs(ratio=spec.get("hicache_ratio"), size_tokens=spec.get("hicache_size_tokens"),
                        write_policy=spec.get("hicache_write_policy", "write_through"))


def simulate_spec(spec: dict[str, Any], cost: CostModel) -> tuple[dict[str, Any], list[Any], dict[str, Any]]:
    """Run one simulation described by ``spec``; (summary, records, run dict). Several workers:
    ``workers`` (count), ``lose_worker`` (["W@T", ...]), ``shared_l3_gbps`` (a shared L3 store)."""
    from sidecar_tools.benchmarks.clients import ClientOptions
    from sidecar_tools.simulator.engine import SimEngine
    from sidecar_tools.simulator.virtual_replay import SidecarLoop, VirtualReplay
    from sidecar_tools.simulator.l3_store_model import SharedL3
    from sidecar_tools.simulator.workers import WorkerLoss

    trace = _trace(spec)
    workers = int(spec.get("workers", 1))
    engines = [SimEngine(kv_tokens=int(spec.get("kv_tokens", 173_200)), policy=spec.get("policy", "lru"),
                         policy_config=spec.get("policy_config"), cost=cost,
                         session_radix_cache=bool(spec.get("session_radix_cache")), host_tier=host_tier_of(spec))
               for _ in range(workers)]
    engine = engines[0]
    losses = [WorkerLoss.parse(x) for x in spec.get("lose_worker", ())]
    l3 = SharedL3(cost.kv_bytes_per_token, read_gbps=float(spec["shared_l3_gbps"])) if spec.get("shared_l3_gbps") else None
    opts = ClientOptions(lease_ttl_s=spec.get("lease_ttl"), close_sessions=spec.get("close_sessions", True))
    sidecar = None
    replay: VirtualReplay
    if spec.get("sidecar") is not None:
        from sidecar.settings import load_settings

        sc = dict(spec["sidecar"])
        config = sc.pop("config", None)
        if config and not Path(config).exists() and (REPO_ROOT / config).exists():
            config = REPO_ROOT / config
        settings = load_settings(config, {section: dict(values) for section, values in sc.items() if values})
        sidecar = SidecarLoop(settings, engine.kv_tokens, clock=lambda: replay.clock_now,
                              host_tokens=engine.host_pool_tokens() or 0, workers=workers,
                              host_write_policy=spec.get("hicache_write_policy", "write_through"))
    replay = VirtualReplay(trace, engines, opts, max_concurrent_sessions=spec.get("max_concurrent_sessions"),
                           sidecar=sidecar, expected_back_oracle=bool(spec.get("expected_back_oracle")),
                           worker_losses=losses, shared_l3=l3)
    run, records = replay.run()
    return run["summary"], records, run


# --------------------------------------------------------------------------------------------
# Fit


def compare(targets: list[dict[str, Any]], cost: CostModel) -> list[dict[str, Any]]:
    rows = []
    for t in targets:
        if t.get("sim") is None:
            rows.append({"name": t["name"], "fit": False, "gpu": t["gpu"], "sim": None, "note": t.get("note")})
            continue
        s, _, run = simulate_spec(t["sim"], cost)
        sim = {k: s.get(k) for k in SUMMARY_KEYS}
        row = {"name": t["name"], "fit": t.get("fit") or False, "gpu": t["gpu"], "sim": sim, "note": t.get("note")}
        if t.get("gpu_metrics"):
            row["gpu_metrics"], row["sim_metrics"] = t["gpu_metrics"], cache_metrics(run)
        rows.append(row)
    return rows


def cache_metrics(run: dict[str, Any]) -> dict[str, float]:
    """A simulated run's cache figures, in the targets files' ``gpu_metrics`` terms."""
    c = run["metrics"]["engine"]["counters"]
    host = c.get("sim:cached_tokens_host_total", 0.0)
    return {"cached_tokens_host": host, "cached_tokens_device": c.get("sglang:cached_tokens_total", 0.0) - host,
            "evicted_tokens": c.get("sglang:evicted_tokens_total", 0.0),
            "dropped_tokens": c.get("sglang:hicache_dropped_tokens_total", 0.0)}


def informs(target: dict[str, Any], names: list[str]) -> bool:
    """Whether ``target`` takes part in fitting ``names`` (its ``fit``: true = every coefficient)."""
    marked = target.get("fit")
    if isinstance(marked, list):
        return bool(set(marked) & set(names))
    if marked and host_tier_of(target.get("sim") or {}) is None:  # no host tier: no host coefficient
        return any(n not in CostModel.HOST_FITTED for n in names)
    return bool(marked)


def fit(targets: list[dict[str, Any]], start: CostModel, names: list[str], max_evals: int,
        echo: Callable[[str], None] = lambda m: None) -> tuple[CostModel, dict[str, Any]]:
    from scipy.optimize import least_squares

    fittable = (*CostModel.FITTED, *CostModel.HOST_FITTED, "prefill_pair_ratio")
    unknown = [n for n in names if n not in fittable]
    if unknown:
        raise ValueError(f"cannot fit {unknown}; coefficients: {list(fittable)}")
    fit_targets = [t for t in targets if informs(t, names) and t.get("sim") is not None
                   and (t.get("gpu") or {}).get("makespan_s")]
    if not fit_targets:
        raise ValueError(f"no targets marked fit for {names} with a GPU makespan")
    prior = CostModel()
    x0 = [math.log(getattr(start, n)) for n in names]
    evals = {"n": 0}

    def model_at(x) -> CostModel:
        return start.replace(**{n: math.exp(v) for n, v in zip(names, x)})

    def residuals(x):
        evals["n"] += 1
        cost = model_at(x)
        res = []
        for t in fit_targets:
            s, _, _ = simulate_spec(t["sim"], cost)
            res.append(math.log(s["makespan_s"] / t["gpu"]["makespan_s"]))
        for n, v in zip(names, x):
            res.append(PRIOR_WEIGHT * (v - math.log(getattr(prior, n))))
        echo(f"eval {evals['n']}: " + ", ".join(f"{t['name']} {100 * (math.exp(r) - 1):+.1f}%" for t, r in zip(fit_targets, res)))
        return res

    t0 = time.monotonic()
    result = least_squares(residuals, x0, diff_step=0.03, max_nfev=max_evals, xtol=1e-3, ftol=1e-4)
    model = model_at(result.x)
    info = {"method": "scipy.optimize.least_squares on log-coefficients, residual = log(sim/gpu makespan) "
                      f"per fit target + {PRIOR_WEIGHT} x log(coef/prior) per coefficient",
            "fitted": names, "evaluations": evals["n"], "seconds": round(time.monotonic() - t0, 1),
            "cost": float(result.cost), "prior": {n: getattr(prior, n) for n in names},
            "fit_targets": [t["name"] for t in fit_targets]}
    return model, info


def run_calibration(runs: list[str], targets_path: list[str] | str | None, kv_tokens: int, names: list[str],
                    start_path: str | None, out: str | None, max_evals: int,
                    echo: Callable[[str], None] = lambda m: None, command: str | None = None) -> dict[str, Any]:
    targets = collect_targets(runs, targets_path, kv_tokens)
    earlier: list[dict[str, Any]] = []
    if start_path == "prior" or (start_path is None and not DEFAULT_CALIBRATION.exists()):
        start = CostModel()
    else:
        start, start_doc = load_calibration(start_path)
        earlier = earlier_fits(start_doc)
        refit = set(names)  # the new fit supersedes earlier fits of the same coefficients
        earlier = [f for f in earlier if not set(f.get("fitted", [])) <= refit]
    model, info = fit(targets, start, names, max_evals, echo)
    comparison = compare(targets, model)
    if out:
        save_calibration(
            out, model,
            name="h200-qwen3-8b-sglang-0.5.23",
            created_at=datetime.now(UTC).isoformat(timespec="seconds"),
            command=command,
            description="Step-time cost model of SGLang 0.5.23 serving Qwen3-8B (dummy weights, bf16) on one "
                        "H200, Python radix TreeCore, chunked prefill 8192, overlap scheduler on, and of its "
                        "host tier (HiCache: host<->GPU copy rates and latencies, layers a load is pipelined "
                        "over). See simulator/costmodel.py for the formulas.",
            sources=[{"name": t["name"], "fit": t.get("fit") or False, "source": t.get("source"), "gpu": t["gpu"],
                      "sim": t.get("sim"), "note": t.get("note")} for t in targets],
            fit=info,
            earlier_fits=earlier,
            comparison=comparison,
        )
    return {"model": model, "fit": info, "comparison": comparison}


def earlier_fits(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A calibration document's fits, oldest first (its own last fit included, with its command)."""
    out = list(doc.get("earlier_fits") or [])
    if doc.get("fit"):
        out.append({"created_at": doc.get("created_at"), "command": doc.get("command"), **doc["fit"]})
    return out


def fitted_target_names(doc: dict[str, Any]) -> set[str]:
    return {name for f in earlier_fits(doc) for name in f.get("fit_targets", [])}


# --------------------------------------------------------------------------------------------
# Report


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _s(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else f"{x:{spec}} s"


def format_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: GPU vs simulator per target (makespan error in %, recompute error in points)."""
    out = [("| run | used for | GPU makespan | sim makespan | error | GPU recomputed | sim recomputed | error | "
            "GPU TTFT p50 / p90 | sim TTFT p50 / p90 |"),
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        g, s = r["gpu"] or {}, r["sim"] or {}
        gm, sm = g.get("makespan_s"), s.get("makespan_s")
        err_m = f"{100 * (sm / gm - 1):+.1f} %" if gm and sm else "-"
        gr, sr = g.get("recomputed_share"), s.get("recomputed_share")
        err_r = f"{100 * (sr - gr):+.1f} pts" if gr is not None and sr is not None else "-"
        if r.get("fit"):
            use = "fit (host tier)" if isinstance(r["fit"], list) else "fit"
        else:
            use = "held out" if r["sim"] is not None and gm else ("no GPU run" if r["sim"] else "not simulated")
        out.append(f"| {r['name']} | {use} | {_s(gm)} | {_s(sm)} | {err_m} | {_pct(gr)} | {_pct(sr)} | {err_r} | "
                   f"{_s(g.get('ttft_p50_s'), '.2f')} / {_s(g.get('ttft_p90_s'), '.2f')} | "
                   f"{_s(s.get('ttft_p50_s'), '.2f')} / {_s(s.get('ttft_p90_s'), '.2f')} |")
    cache_rows = [r for r in rows if r.get("gpu_metrics") and r.get("sim_metrics")]
    if cache_rows:
        out += ["", "| run | figure | GPU | sim | error |", "|---|---|---|---|---|"]
        for r in cache_rows:
            for key, gpu in r["gpu_metrics"].items():
                sim = r["sim_metrics"].get(key)
                err = f"{100 * (sim / gpu - 1):+.1f} %" if gpu and sim is not None else "-"
                out.append(f"| {r['name']} | {key} | {gpu:,.0f} | {'-' if sim is None else f'{sim:,.0f}'} | {err} |")
    return "\n".join(out) + "\n"




# --------------------------------------------------------------------------------------------
# Fidelity: committed simulator runs against GPU runs of the same name

MAKESPAN_TOLERANCE = 0.20  # the issue's bar: makespan within 20 %
RECOMPUTE_TOLERANCE = 0.05  # recomputed share within 5 points


def normalize_run_name(name: str) -> str:
    """``lru-generate-0.5s`` (run_matrix) and ``lru-0.5s`` (simulator) name the same config."""
    return re.sub(r"-(generate|openai)(?=-)", "", name)


def gpu_numbers(sources: list[str]) -> dict[str, list[dict[str, Any]]]:
    """GPU summaries by normalized config name (several GPU runs may share one), from targets
    JSONs and GPU run JSONs (files or folders)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for src in sources:
        p = Path(src)
        files = sorted(p.glob("*.json")) if p.is_dir() else [p]
        for f in files:
            doc = json.loads(f.read_text())
            if isinstance(doc, dict) and "targets" in doc:
                for t in load_targets([f]):
                    if t.get("gpu"):
                        out.setdefault(normalize_run_name(t["name"]), []).append(
                            {**t["gpu"], "gpu_name": t["name"], "source": t.get("gpu_run") or f.name})
            elif isinstance(doc, dict) and "summary" in doc and doc.get("config", {}).get("mode") != "simulate":
                s = doc["summary"]
                out.setdefault(normalize_run_name(doc.get("name") or f.stem), []).append(
                    {**{k: s.get(k) for k in SUMMARY_KEYS}, "gpu_name": doc.get("name") or f.stem, "source": str(f)})
    for rows in out.values():  # one GPU run may be both in a folder and referenced by a targets file
        seen, unique = set(), []
        for g in rows:
            key = (g["gpu_name"], g.get("makespan_s"))
            if key not in seen:
                seen.add(key)
                unique.append(g)
        rows[:] = unique
    return out


def fidelity_rows(sim_dir: str | Path, gpu_sources: list[str]) -> list[dict[str, Any]]:
    """One row per (simulated run, GPU run of the same config); a row without GPU numbers when none."""
    gpu = gpu_numbers(gpu_sources)
    fitted: set[str] = set()
    try:
        fitted = fitted_target_names(load_calibration()[1])
    except FileNotFoundError:
        pass
    rows = []
    for f in sorted(Path(sim_dir).glob("*.json")):
        run = json.loads(f.read_text())
        if not (isinstance(run, dict) and run.get("config", {}).get("mode") == "simulate"):
            continue
        name = normalize_run_name(run["name"])
        s = run["summary"]
        sim = {k: s.get(k) for k in SUMMARY_KEYS}
        for g in gpu.get(name) or [None]:
            row = {"name": name, "fit": bool(g) and g["gpu_name"] in fitted, "gpu": g, "sim": sim,
                   "wall_s": (run.get("simulator") or {}).get("wall_s")}
            if g and g.get("makespan_s") and sim["makespan_s"]:
                row["makespan_ok"] = abs(sim["makespan_s"] / g["makespan_s"] - 1) <= MAKESPAN_TOLERANCE
                if g.get("recomputed_share") is not None and sim["recomputed_share"] is not None:
                    row["recompute_ok"] = abs(sim["recomputed_share"] - g["recomputed_share"]) <= RECOMPUTE_TOLERANCE
            rows.append(row)
    return rows


def format_fidelity(rows: list[dict[str, Any]]) -> str:
    out = [("| run | GPU makespan | sim makespan | error | GPU recomputed | sim recomputed | error | "
            "GPU TTFT p50 / p90 | sim TTFT p50 / p90 | within bars | GPU numbers |"),
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        g, s = r["gpu"] or {}, r["sim"]
        gm, sm = g.get("makespan_s"), s.get("makespan_s")
        gr, sr = g.get("recomputed_share"), s.get("recomputed_share")
        err_m = f"{100 * (sm / gm - 1):+.1f} %" if gm and sm else "-"
        err_r = f"{100 * (sr - gr):+.1f} pts" if gr is not None and sr is not None else "-"
        if not r["gpu"]:
            ok, src = "no GPU run yet", "missing"
        else:
            ok = "yes" if r.get("makespan_ok") and r.get("recompute_ok", True) else "**no**"
            src = ("fit" if r["fit"] else "held out") + f": {g['gpu_name']} ({Path(g['source']).name})"
        out.append(f"| {r['name']} | {_s(gm)} | {_s(sm)} | {err_m} | {_pct(gr)} | {_pct(sr)} | {err_r} | "
                   f"{_s(g.get('ttft_p50_s'), '.2f')} / {_s(g.get('ttft_p90_s'), '.2f')} | "
                   f"{_s(s.get('ttft_p50_s'), '.2f')} / {_s(s.get('ttft_p90_s'), '.2f')} | {ok} | {src} |")
    return "\n".join(out) + "\n"
