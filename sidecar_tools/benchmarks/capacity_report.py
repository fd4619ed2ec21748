"""Capacity results (``capacity-CONFIG-DIST-rR.json``) as a markdown table and a plot of TTFT p99
against the arrival rate, one line per configuration and host ratio, one row of panels per
distribution, the SLO drawn across; a rate whose measured turns did not all finish (p99 infinite,
``null`` in the JSON) is drawn as a cross at the top of its panel."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def find_results(paths: list[str]) -> list[dict[str, Any]]:
    """Capacity JSONs named directly or found in the given folders (``capacity-*.json``), in name order."""
    files: list[Path] = []
    for p in map(Path, paths):
        files.extend(sorted(p.glob("capacity-*.json")) if p.is_dir() else [p])
    out = []
    for f in files:
        data = json.loads(f.read_text())
        if isinstance(data, dict) and "capacity_per_min" in data and "points" in data:
            out.append(data)
    return sorted(out, key=lambda r: (r["distribution"], r["hicache_ratio"], r["config"], r["source"]))


def _s(x: float | None) -> str:
    return "miss" if x is None else f"{x:.2f}"


def _s0(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def _label(r: dict[str, Any]) -> str:
    return f"{r['config']} r{r['hicache_ratio']:g}" + (" (GPU)" if r["source"] == "gpu" else "")


def table(results: list[dict[str, Any]]) -> str:
    """One row per result (capacity, its bracket, product over hicache where both exist), then
    every point: rate, both p99s, verdict."""
    slo = results[0]["slo"]
    windows = sorted({(r["distribution"], json.dumps(r["slo"]["window"], sort_keys=True)) for r in results})
    lines = [f"SLO: later-turn TTFT p99 <= {slo['later_turn_ttft_p99_s']:g} s, first-turn TTFT p99 (door wait "
             f"included) <= {slo['first_turn_ttft_p99_s']:g} s, over the measured sessions of each run "
             f"(a turn without a first token counts as infinite).", ""]
    for dist, w in windows:
        w = json.loads(w)
        lines.append(f"- {dist}: arrivals 1-{w['warmup']} warm up, the next {w['measure']} are measured, "
                     f"{w['cooldown']} more arrive after them; the run is cut {w['drain_s']:g} s after the last arrival.")
    lines += ["",
             "| distribution | host ratio | config | source | capacity (sessions/min) | bracket | x hicache | rates run |",
              "|---|---|---|---|---|---|---|---|"]
    by_key = {(r["distribution"], r["hicache_ratio"], r["config"], r["source"]): r for r in results}
    for r in results:
        base = by_key.get((r["distribution"], r["hicache_ratio"], "hicache", r["source"]))
        ratio = (f"{r['capacity_per_min'] / base['capacity_per_min']:.2f}x"
                 if base and base is not r and base["capacity_per_min"] else "-")
        b = r["bracket"]
        bracket = f"{b['passing_per_min'] if b['passing_per_min'] is not None else '-'} .. " \
                  f"{b['failing_per_min'] if b['failing_per_min'] is not None else '-'}"
        lines.append(f"| {r['distribution']} | {r['hicache_ratio']:g} | {r['config']} | {r['source']} | "
                     f"**{r['capacity_per_min']:g}** | {bracket} | {ratio} | {len(r['points'])} |")
    lines += ["", "| distribution | host ratio | config | source | λ (/min) | later-turn p99 (s) | first-turn p99 (s) | "
              "last arrival (s) | turns missing | recomputed | meets |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for p in r["points"]:
            share = p.get("recomputed_share")
            lines.append(f"| {r['distribution']} | {r['hicache_ratio']:g} | {r['config']} | {r['source']} | "
                         f"{p['rate_per_min']:g} | {_s(p['later_turn_ttft_p99_s'])} | {_s(p['first_turn_ttft_p99_s'])} | "
                         f"{_s0(p.get('last_arrival_s'))} | {p['turns_missing']} | "
                         f"{'-' if share is None else f'{100 * share:.1f} %'} | {'yes' if p['meets_slo'] else 'no'} |")
    return "\n".join(lines) + "\n"


def figure(results: list[dict[str, Any]], title: str = ""):
    """Rows: distributions; columns: later-turn and first-turn TTFT p99 against λ (log y)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dists = sorted({r["distribution"] for r in results})
    slo = results[0]["slo"]
    fig, axes = plt.subplots(len(dists), 2, figsize=(12, 4 * len(dists)), squeeze=False)
    colors = {"hicache": "tab:blue", "product": "tab:red"}
    styles = {1.0: "-", 3.0: "--"}
    for row, dist in enumerate(dists):
        for col, (key, limit, what) in enumerate([("later_turn_ttft_p99_s", slo["later_turn_ttft_p99_s"], "later-turn"),
                                                  ("first_turn_ttft_p99_s", slo["first_turn_ttft_p99_s"], "first-turn")]):
            ax = axes[row][col]
            top = 20 * limit
            for r in (x for x in results if x["distribution"] == dist):
                pts = sorted(r["points"], key=lambda p: p["rate_per_min"])
                xs = [p["rate_per_min"] for p in pts]
                ys = [min(p[key], top) if p[key] is not None else top for p in pts]
                color = colors.get(r["config"], "tab:gray")
                line = ax.plot(xs, ys, styles.get(float(r["hicache_ratio"]), ":"), marker="o" if r["source"] != "gpu" else "s",
                               color=color, alpha=0.9 if r["source"] != "gpu" else 0.6, label=_label(r))[0]
                missed = [(x, top) for x, p in zip(xs, pts) if p[key] is None]
                if missed:
                    ax.scatter(*zip(*missed), marker="x", s=70, color=line.get_color(), zorder=3)
                if r["capacity_per_min"]:
                    ax.axvline(r["capacity_per_min"], color=color, linestyle=styles.get(float(r["hicache_ratio"]), ":"),
                               alpha=0.3)
            ax.axhline(limit, color="black", linewidth=1)
            ax.text(ax.get_xlim()[0], limit * 1.08, f" SLO {limit:g} s", fontsize=8, va="bottom")
            ax.set_yscale("log")
            ax.set_xlabel("arrival rate λ (sessions/min)")
            ax.set_ylabel(f"{what} TTFT p99 (s)")
            ax.set_title(f"{dist}: {what} TTFT p99 (x: turns left unfinished)", fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    source = {r["source"] for r in results}
    fig.suptitle(title or f"open-loop capacity ({', '.join(sorted(source))}); vertical lines: capacity", fontsize=11)
    fig.tight_layout()
    return fig
