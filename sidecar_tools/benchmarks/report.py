"""Turn replay runs (``<name>.json``) into a markdown table and a PNG plot.

    python -m sidecar_tools.benchmarks.report benchmarks/results/h200 --baseline lru-0.5s \\
        --md benchmarks/results/h200/table.md --png benchmarks/results/h200/plot.png
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from sidecar_tools.benchmarks.records import load_run


def find_runs(paths: list[str]) -> list[dict[str, Any]]:
    """Run JSONs named directly or found in the given folders, in name order."""
    files: list[Path] = []
    for p in map(Path, paths):
        files.extend(sorted(p.glob("*.json")) if p.is_dir() else [p])
    runs = []
    for f in files:
        run = load_run(f)
        if isinstance(run, dict) and "summary" in run and "name" in run:
            runs.append(run)
    return runs


def _fmt(x: float | None, spec: str, suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def table(runs: list[dict[str, Any]], baseline: str | None = None) -> str:
    """Markdown table; speed-up = baseline makespan / run makespan."""
    base = next((r for r in runs if r["name"] == baseline), None)
    rows = ["| run | makespan | speed-up | recomputed history | TTFT p50 | TTFT p90 | TTFT p99 | failed turns |",
            "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        s = r["summary"]
        speedup = base["summary"]["makespan_s"] / s["makespan_s"] if base and s["makespan_s"] else None
        share = s.get("recomputed_share")
        failed = f"{s['turns_failed']}" + (" (timed out)" if s.get("timed_out") else "")
        rows.append(
            f"| {r['name']} | {_fmt(s['makespan_s'], '.1f', ' s')} | {_fmt(speedup, '.2f', 'x')} | "
            f"{_fmt(None if share is None else 100 * share, '.1f', ' %')} | {_fmt(s['ttft_p50_s'], '.2f', ' s')} | "
            f"{_fmt(s['ttft_p90_s'], '.2f', ' s')} | {_fmt(s['ttft_p99_s'], '.2f', ' s')} | {failed} |"
        )
    return "\n".join(rows) + "\n"


MIN_SHARE_AXIS_PCT = 5.0  # the recompute axis spans at least 0-5 %: a tiny share reads as tiny


def figure(runs: list[dict[str, Any]], title: str = ""):
    """Three panels: makespan, recomputed history share, TTFT percentiles. Every axis starts at 0
    and every bar is labelled with its value, so one run (or shares near 0) cannot fill an axis
    that autoscaled to it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["name"] for r in runs]
    s = [r["summary"] for r in runs]
    y = list(range(len(runs)))
    fig, axes = plt.subplots(1, 3, figsize=(15, 1.5 + 0.45 * len(runs)), sharey=True)
    makespans = [x["makespan_s"] for x in s]
    bars = axes[0].barh(y, makespans, color="tab:blue")
    axes[0].bar_label(bars, labels=[f"{v:.1f} s" for v in makespans], padding=2, fontsize=8)
    axes[0].set_xlim(0, 1.2 * max(makespans + [1e-9]))
    axes[0].set_xlabel("makespan (s)")
    shares = [x.get("recomputed_share") for x in s]
    pct = [100 * v if v is not None else 0.0 for v in shares]
    bars = axes[1].barh(y, pct, color="tab:red")
    axes[1].bar_label(bars, labels=["n/a" if v is None else f"{100 * v:.1f} %" for v in shares], padding=2, fontsize=8)
    axes[1].set_xlim(0, min(100.0, max(MIN_SHARE_AXIS_PCT, 1.2 * max(pct))))
    axes[1].set_xlabel("recomputed history (%)")
    for i, (p, c) in enumerate([("p50", "tab:green"), ("p90", "tab:orange"), ("p99", "tab:purple")]):
        axes[2].barh([v + (i - 1) * 0.27 for v in y], [x.get(f"ttft_{p}_s") or 0 for x in s], height=0.27,
                     color=c, label=p)
    axes[2].set_xlabel("TTFT (s, client)")
    axes[2].set_xscale("symlog", linthresh=0.1)
    axes[2].set_xlim(left=0)
    axes[2].legend(loc="lower right", fontsize=8)
    axes[0].set_yticks(y, names)
    axes[0].invert_yaxis()
    for ax in axes:
        ax.grid(axis="x", alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot(runs: list[dict[str, Any]], path: str | Path, title: str = "") -> None:
    """:func:`figure`, saved as a PNG."""
    import matplotlib.pyplot as plt

    fig = figure(runs, title)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


@click.command()
@click.argument("paths", nargs=-1, required=True)
@click.option("--baseline", default=None, help="Run name the speed-up is measured against (default: first).")
@click.option("--md", "md_path", default=None, type=click.Path(dir_okay=False), help="Write the table here.")
@click.option("--png", "png_path", default=None, type=click.Path(dir_okay=False), help="Write the plot here.")
@click.option("--title", default="")
def main(paths: tuple[str, ...], baseline: str | None, md_path: str | None, png_path: str | None, title: str) -> None:
    """Table (stdout and --md) and plot (--png) of replay runs (JSON files or folders of them)."""
    runs = find_runs(list(paths))
    if not runs:
        raise click.ClickException("no run JSONs found")
    baseline = baseline or runs[0]["name"]
    md = table(runs, baseline)
    click.echo(md, nl=False)
    if md_path:
        header = f"# {title}\n\n" if title else ""
        Path(md_path).write_text(f"{header}Speed-up vs `{baseline}`.\n\n{md}")
    if png_path:
        plot(runs, png_path, title)


if __name__ == "__main__":
    main()
