"""The sidecar's own cost beside a bare relay and smg, in one run: CPU per turn of the process
between the agents and the engine, and the latency outside the engine, at several loads.

    python -m sidecar_tools.benchmarks.proxy_cost --out benchmarks/results/load/cost

Scenarios (each a load-test phase per proxy, on a fresh engine and proxy; see ``load_benchmark``):

* ``long-256``: 256 agents, 20 turns a session, 1,000-token tool results (histories grow to ~21K tokens);
* ``agents-500``: the load test's 500-agent setting (10 turns, 100-token tool results);
* ``open-N`` for each N of ``--open``: ``--open-agents`` agents (default 50) run beside N minus
  them idle sessions opened first and left open (the sidecar keeps them: ``--session-idle-grace``
  3600), so CPU per turn can be read against the number of open sessions.

``--before DIR`` adds a fourth process, ``before``: the sidecar of another checkout (e.g. ``git
worktree add /tmp/sidecar-before <commit>``, launched through ``sidecar_at_commit``), so a change
is measured before and after in the same window, interleaved with the rest.

Every scenario runs ``--reps`` times, the proxies interleaved (their order rotates each
repetition); the table gives medians (and the spread), the sidecar's ratios to the bare relay and
smg, and the issue's targets. Writes ``proxy-cost.json`` (every phase's summary, the machine and
its load average before and after, as it goes), ``proxy-cost.md`` and ``proxy-cost.png`` (CPU per
turn against open sessions).
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import click

from sidecar_tools.benchmarks.load_benchmark import PROXIES, LoadConfig, build_workload, machine_info, run_phase
from sidecar_tools.benchmarks.sidecar_at_commit import commit_of

SIDECAR_ARGS = ("--session-idle-grace=3600",)  # idle sessions stay open for the whole phase
BEFORE = "before"  # the sidecar of another checkout (--before), run as the load test's sidecar mode
COLUMNS = ("sidecar", BEFORE, *PROXIES[1:])  # the report's order
LAUNCH_ENV = "LOAD_TEST_SIDECAR_LAUNCH"


def scenarios(duration: float, open_counts: list[int], open_agents: int, only: set[str] | None) -> list[tuple[str, LoadConfig]]:
    base = LoadConfig(duration=duration, drain=15.0, sidecar_args=SIDECAR_ARGS)
    out = [("long-256", replace(base, sessions=256, turns=20, tool_tokens=1000)),
           ("agents-500", replace(base, sessions=500))]
    for n in open_counts:
        agents = min(open_agents, n)
        out.append((f"open-{n}", replace(base, sessions=agents, idle_sessions=n - agents)))
    return [(name, cfg) for name, cfg in out if only is None or name in only]


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 3) if xs else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def table(result: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """scenario -> proxy -> medians (and the values they are the median of)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for run in result["runs"]:
        s = run["summary"]
        row = out.setdefault(run["scenario"], {}).setdefault(run["proxy"], {"cpu": [], "p50": [], "p99": [], "rps": [], "errors": 0})
        row["cpu"].append((s.get("cpu_ms_per_turn") or {}).get(s.get("proxy", run["proxy"])))  # before: "sidecar"
        row["p50"].append(s["outside_engine_ttft_ms"]["p50"])
        row["p99"].append(s["outside_engine_ttft_ms"]["p99"])
        row["rps"].append(s["requests_per_s"])
        row["errors"] += s["errors"]
    for rows in out.values():
        for row in rows.values():
            row.update(cpu_median=_median(row["cpu"]), p50_median=_median(row["p50"]), p99_median=_median(row["p99"]),
                       rps_median=_median(row["rps"]))
    return out


def targets(t: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    def cpu(scenario, proxy):
        return t.get(scenario, {}).get(proxy, {}).get("cpu_median")

    out: dict[str, Any] = {}
    for scenario in ("long-256", "agents-500"):
        r = _ratio(cpu(scenario, "sidecar"), cpu(scenario, "bare"))
        out[f"{scenario}: sidecar CPU/turn <= 2.0x bare relay"] = {"ratio": r, "met": r is not None and r <= 2.0}
    opens = sorted((int(k.split("-")[1]), k) for k in t if k.startswith("open-"))
    if len(opens) >= 2:
        (lo, lo_key), (hi, hi_key) = opens[0], opens[-1]
        r = _ratio(cpu(hi_key, "sidecar"), cpu(lo_key, "sidecar"))
        out[f"sidecar CPU/turn at {hi} open sessions <= 1.15x that at {lo}"] = {"ratio": r, "met": r is not None and r <= 1.15}
    p99 = _ratio(t.get("long-256", {}).get("sidecar", {}).get("p99_median"), t.get("long-256", {}).get("bare", {}).get("p99_median"))
    out["long-256: sidecar outside-engine TTFT p99 <= 1.3x bare relay"] = {"ratio": p99, "met": p99 is not None and p99 <= 1.3}
    return out


def markdown(result: dict[str, Any]) -> str:
    t = table(result)
    m = result["machine"]
    lines = [
        "# CPU per turn: sidecar, bare relay, smg (one run, interleaved)",
        "",
        f"Command: `{result['command']}`",
        "",
        f"Machine: {m.get('cpus')} CPUs ({m.get('cpu_model')}); load average before {result['load_before']}, "
        f"after {result.get('load_after')}; {result.get('elapsed_s', 0) / 60:.0f} min. Each proxy pinned to its own CPU, "
        "engine + agents on the other. Medians of the repetitions (each value in brackets).",
        "",
        "| scenario | proxy | CPU ms per turn | outside-engine TTFT p50 / p99 ms | turns/s | errors |",
        "|---|---|---|---|---|---|",
    ]
    for scenario, rows in t.items():
        for proxy in COLUMNS:
            row = rows.get(proxy)
            if row is None:
                continue
            values = ", ".join(f"{v:.2f}" for v in row["cpu"] if v is not None)
            lines.append(f"| {scenario} | {proxy} | **{row['cpu_median']}** ({values}) | {row['p50_median']} / {row['p99_median']} "
                         f"| {row['rps_median']} | {row['errors']} |")
        s, b, g = (rows.get(p, {}).get("cpu_median") for p in PROXIES)
        p99 = {p: rows.get(p, {}).get("p99_median") for p in COLUMNS}
        lines.append(f"| {scenario} | sidecar / bare, sidecar / smg | {_ratio(s, b)}x, {_ratio(s, g)}x | "
                     f"p99 {_ratio(p99['sidecar'], p99['bare'])}x bare | | |")
        if BEFORE in rows:
            lines.append(f"| {scenario} | sidecar / before | {_ratio(s, rows[BEFORE]['cpu_median'])}x | "
                         f"p99 {_ratio(p99['sidecar'], p99[BEFORE])}x before, before {_ratio(p99[BEFORE], p99['bare'])}x bare | | |")
    if result.get("before"):
        lines += ["", f"before: the sidecar of `{result['before']['path']}` at `{result['before']['commit']}`."]
    lines += ["", "Targets (issue 28):", ""]
    for name, v in targets(t).items():
        verdict = "not run" if v["ratio"] is None else f"{v['ratio']}x, {'met' if v['met'] else 'MISSED'}"
        lines.append(f"* {name}: {verdict}")
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    t = table(result)
    opens = sorted((int(k.split("-")[1]), k) for k in t if k.startswith("open-"))
    if not opens:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for proxy in COLUMNS:
        xs, ys, lo, hi = [], [], [], []
        for n, key in opens:
            row = t[key].get(proxy)
            values = [v for v in (row or {}).get("cpu", []) if v is not None]
            if values:
                med = statistics.median(values)
                xs.append(n), ys.append(med), lo.append(med - min(values)), hi.append(max(values) - med)
        if xs:
            ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=proxy)
    ax.set_xscale("log")
    ax.set_xticks([n for n, _ in opens], [str(n) for n, _ in opens])
    ax.set_xlabel("open sessions")
    ax.set_ylabel("proxy CPU ms per turn (median, min-max)")
    ax.set_ylim(bottom=0)
    ax.set_title("CPU per turn against open sessions")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


async def _phase(cfg: LoadConfig, work: Any, proxy: str, tokenizer_dir: str, before: str | None, log) -> dict[str, Any]:
    """One load-test phase through ``proxy``; ``before`` runs the load test's sidecar mode with the
    other checkout's sidecar launched in its place."""
    if proxy != BEFORE:
        return await run_phase(cfg, work, proxy, tokenizer_dir, log)
    saved = os.environ.get(LAUNCH_ENV)
    os.environ[LAUNCH_ENV] = f"{shlex.quote(sys.executable)} -m sidecar_tools.benchmarks.sidecar_at_commit {shlex.quote(str(before))}"
    try:
        return await run_phase(cfg, work, "sidecar", tokenizer_dir, log)
    finally:
        if saved is None:
            os.environ.pop(LAUNCH_ENV, None)
        else:
            os.environ[LAUNCH_ENV] = saved


async def run(out: Path, scen: list[tuple[str, LoadConfig]], reps: int, proxies: tuple[str, ...], command: str, log,
              before: str | None = None) -> dict[str, Any]:
    from sidecar_tools.benchmarks.qwen3_tokenizer import build_qwen3_tokenizer

    result: dict[str, Any] = {"command": command, "machine": machine_info(), "load_before": _load(), "runs": [],
                              "scenarios": {name: asdict(cfg) for name, cfg in scen}}
    if before is not None:
        result["before"] = {"path": str(before), "commit": commit_of(before)}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="proxy-cost-tok-") as tmp:
        tokenizer_dir = str(build_qwen3_tokenizer(Path(tmp)))
        works: dict[tuple, Any] = {}
        for name, cfg in scen:
            key = (cfg.system_tokens, cfg.tool_tokens, cfg.reply_pad_tokens)
            if key not in works:
                works[key] = build_workload(cfg, tokenizer_dir)
            for rep in range(reps):
                order = proxies[rep % len(proxies):] + proxies[: rep % len(proxies)]
                for proxy in order:
                    log(f"== {name} rep {rep + 1}/{reps}: {proxy}")
                    phase = await _phase(cfg, works[key], proxy, tokenizer_dir, before, log)
                    summary = phase["summary"]
                    summary.pop("log_tails", None)
                    result["runs"].append({"scenario": name, "rep": rep + 1, "proxy": proxy, "load": _load(), "summary": summary})
                    result["elapsed_s"] = round(time.monotonic() - started, 1)
                    (out / "proxy-cost.json").write_text(json.dumps(result, indent=1) + "\n")
    result["load_after"] = _load()
    result["elapsed_s"] = round(time.monotonic() - started, 1)
    result["table"] = table(result)
    result["targets"] = targets(result["table"])
    return result


@click.command()
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True, help="Folder for proxy-cost.{json,md,png}.")
@click.option("--reps", default=3, show_default=True, help="Repetitions of each scenario (proxies interleaved).")
@click.option("--duration", default=30.0, show_default=True, help="Seconds of new turns per phase.")
@click.option("--open", "open_counts", default="50,250,500,2000", show_default=True, help="Open-session counts of the sweep.")
@click.option("--open-agents", default=50, show_default=True, help="Agents taking turns in the sweep (the rest are idle sessions).")
@click.option("--only", default=None, help="Comma-separated scenarios to run (long-256, agents-500, open-N).")
@click.option("--proxies", default=",".join(PROXIES), show_default=True,
              help=f"Of {', '.join(COLUMNS)} ({BEFORE}: with --before).")
@click.option("--before", type=click.Path(file_okay=False, exists=True), default=None,
              help=f"A checkout of another commit whose sidecar runs beside this one as '{BEFORE}' (added to --proxies).")
def main(out_dir, reps, duration, open_counts, open_agents, only, proxies, before):
    """The sidecar's CPU per turn beside a bare relay and smg, interleaved, at several loads."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    scen = scenarios(duration, [int(n) for n in open_counts.split(",") if n], open_agents, set(only.split(",")) if only else None)
    command = "python -m sidecar_tools.benchmarks.proxy_cost " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    log = lambda msg: click.echo(msg, err=True)  # noqa: E731
    chosen = tuple(proxies.split(","))
    if before is not None and BEFORE not in chosen:
        chosen = (chosen[0], BEFORE, *chosen[1:])
    if BEFORE in chosen and before is None:
        raise click.UsageError(f"the proxy '{BEFORE}' needs --before DIR")
    result = asyncio.run(run(out, scen, reps, chosen, command, log, before))
    (out / "proxy-cost.json").write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result)
    (out / "proxy-cost.md").write_text(text)
    if plot(result, out / "proxy-cost.png"):
        log(f"wrote {out / 'proxy-cost.png'}")
    click.echo(text)


if __name__ == "__main__":
    main()
