"""Where an engine's time went during a run: SGLang's own batch log lines, binned over time.

SGLang logs every prefill batch and every 40th decode batch with the running and queued requests
and the KV token usage (locked KV: running requests and hard leases; free and evictable cache are
not counted). Binned, they show when a run was bound by GPU KV (usage near 1, requests queued
inside SGLang) and how many requests decoded at once, which is what a makespan is made of.

    python -m sidecar_tools.benchmarks.engine_timeline LOG [LOG ...] [--bin 5] [--md F] [--png F]
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import click

_LINE = re.compile(r"^\[(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] (?P<kind>Prefill|Decode) batch, (?P<fields>.*)$")
_FIELD = re.compile(r"#?(?P<key>[a-z][a-z -]*[a-z]):\s*(?P<value>[-0-9.]+)")


@dataclass(frozen=True)
class BatchLine:
    at_s: float  # seconds since the run's first batch line
    kind: str  # "prefill" or "decode"
    running: int
    queued: int
    token_usage: float
    new_tokens: int  # prefill lines only
    cached_tokens: int  # prefill lines only


def read_batch_lines(path: str | Path) -> list[BatchLine]:
    """Batch lines of one SGLang log (one run), timed from the first batch that carried a real prompt."""
    raw = []
    for line in Path(path).read_text(errors="replace").splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        fields = {f.group("key"): float(f.group("value")) for f in _FIELD.finditer(m.group("fields"))}
        raw.append((datetime.strptime(m.group("at"), "%Y-%m-%d %H:%M:%S"), m.group("kind").lower(), fields))
    # SGLang's warm-up and the replay's probes are prompts of a few tokens: start at the first real one.
    start = next((i for i, (_, _, f) in enumerate(raw) if f.get("new-token", 0) > 64 or f.get("running-req", 0) > 1), 0)
    raw = raw[start:]
    if not raw:
        return []
    t0 = raw[0][0]
    return [
        BatchLine(
            at_s=(at - t0).total_seconds(),
            kind=kind,
            running=int(f.get("running-req", 0)),
            queued=int(f.get("queue-req", 0)),
            token_usage=f.get("token usage", 0.0),
            new_tokens=int(f.get("new-token", 0)),
            cached_tokens=int(f.get("cached-token", 0)),
        )
        for at, kind, f in raw
    ]


def binned(lines: list[BatchLine], bin_s: float) -> list[dict]:
    """One row per ``bin_s`` seconds: mean running/queued requests and KV usage, prefill tokens."""
    bins: dict[int, list[BatchLine]] = {}
    for line in lines:
        bins.setdefault(int(line.at_s // bin_s), []).append(line)
    return [
        {
            "from_s": index * bin_s,
            "running": round(statistics.mean(l.running for l in group), 1),
            "queued": round(statistics.mean(l.queued for l in group), 1),
            "token_usage": round(statistics.mean(l.token_usage for l in group), 2),
            "prefilled_tokens": sum(l.new_tokens for l in group),
            "cached_tokens": sum(l.cached_tokens for l in group),
        }
        for index, group in sorted(bins.items())
    ]


def kv_bound_share(lines: list[BatchLine], usage: float = 0.85) -> float:
    """Share of batch lines with requests queued inside SGLang while KV usage was at least ``usage``."""
    if not lines:
        return 0.0
    return sum(1 for l in lines if l.queued > 0 and l.token_usage >= usage) / len(lines)


def markdown(runs: dict[str, list[dict]], bin_s: float) -> str:
    names = list(runs)
    head = "| from | " + " | ".join(f"{n}: running / queued / KV used" for n in names) + " |"
    rows = [head, "|---|" + "---|" * len(names)]
    length = max(len(b) for b in runs.values())
    for i in range(length):
        cells = []
        for n in names:
            b = runs[n][i] if i < len(runs[n]) else None
            cells.append(f"{b['running']:.0f} / {b['queued']:.0f} / {b['token_usage']:.2f}" if b else "")
        rows.append(f"| {i * bin_s:.0f} s | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def plot(runs: dict[str, list[dict]], out: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    for name, bins in runs.items():
        xs = [b["from_s"] for b in bins]
        axes[0].plot(xs, [b["running"] for b in bins], label=name)
        axes[1].plot(xs, [b["queued"] for b in bins], label=name)
        axes[2].plot(xs, [b["token_usage"] for b in bins], label=name)
    for ax, label in zip(axes, ("running requests", "queued in SGLang", "GPU KV used (locked)")):
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    axes[0].set_title(title)
    axes[2].set_xlabel("seconds since the run's first batch")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


@click.command()
@click.argument("logs", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--bin", "bin_s", default=5.0, show_default=True, help="Seconds per row.")
@click.option("--md", type=click.Path(dir_okay=False), help="Write the table here.")
@click.option("--png", type=click.Path(dir_okay=False), help="Write the plot here.")
@click.option("--title", default="SGLang batches over time")
def main(logs: tuple[str, ...], bin_s: float, md: str | None, png: str | None, title: str) -> None:
    """Running and queued requests and KV usage over a run, from SGLang logs (one per run)."""
    runs, lines_of = {}, {}
    for path in logs:
        name = Path(path).stem.removeprefix("sglang-")
        lines_of[name] = read_batch_lines(path)
        if not lines_of[name]:
            raise click.ClickException(f"{path}: no SGLang batch lines (is it an SGLang log?)")
        runs[name] = binned(lines_of[name], bin_s)
    for name, lines in lines_of.items():
        decode = [l.running for l in lines if l.kind == "decode"]
        click.echo(
            f"{name}: {lines[-1].at_s:.0f} s of batches; mean decode batch {statistics.mean(decode):.1f} requests; "
            f"KV-bound with a queue in {kv_bound_share(lines):.0%} of batch lines"
        )
    table = markdown(runs, bin_s)
    click.echo(table)
    if md:
        Path(md).write_text(table)
    if png:
        plot(runs, png, title)


if __name__ == "__main__":
    main()
