"""``sglang-sidecar capacity``: how many agent sessions per minute one GPU serves within a latency SLO.

Sessions arrive open loop (``open_loop``: Poisson at λ per minute, from the reference distribution
or from recorded sessions); a run is judged over the sessions that arrive in the steady window
(``capacity_slo``: later-turn TTFT p99 <= 2 s, first-turn p99 <= 10 s with the door wait). The same
trace and the same verdict serve both engines:

    # the simulator: bisection for the largest λ that meets the SLO (a capacity-CONFIG-DIST-rR.json)
    sglang-sidecar capacity search --config product --dist traces --hicache-ratio 1 --out DIR
    # given rates in the simulator, or against a URL (the sidecar in front of real SGLang): the knee
    sglang-sidecar capacity run --config product --dist traces --hicache-ratio 1 --rate 14 --rate 16 \\
        --url http://127.0.0.1:8000 --engine-url http://127.0.0.1:30000 --tokenizer DIR --out DIR
    # the flags a configuration starts SGLang / the sidecar with (benchmarks/capacity_gpu.sh)
    sglang-sidecar capacity flags --config product --hicache-ratio 1 --dist traces --part engine
    # table + plot of p99 against λ from capacity JSONs
    sglang-sidecar capacity report DIR --md DIR/table.md --png DIR/plot.png

A configuration is one flag set (``CONFIGS``): SGLang's flags and the sidecar's, as a user starts
them. The simulator runs the same set translated to ``sglang-sidecar simulate``'s flags
(``simulate_flags``), so a change of the product's rule on main is picked up by re-running the same
command, in the simulator and on the GPU alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import math
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from sidecar_tools.benchmarks.capacity_slo import (
    DEFAULT_WINDOWS, SLO, PointResult, Window, capacity_from_points, judge, search_capacity,
)
from sidecar_tools.benchmarks.open_loop import DEFAULT_REAL_TRACES, DISTRIBUTIONS, RecordedPool, open_loop_trace
from sidecar_tools.benchmarks.records import TurnRecord
from sidecar_tools.benchmarks.sidecar_at_commit import commit_of
from sidecar_tools.benchmarks.traces import Trace

KV_TOKENS = 173_200
TRACES_CONTEXT_LENGTH = 65_536  # recorded sessions pass Qwen3-8B's 40,960 (SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1)
PLUGIN_CONFIG = '{"max_leased_fraction": 0.8}'
PRODUCT_SIDECAR_CONFIG = "configs/coding-agent.toml"


@dataclass(frozen=True)
class Deployment:
    """What a user starts: SGLang's flags (besides the KV pool and the host tier, which every
    configuration gets) and the sidecar's."""

    engine: tuple[str, ...]
    sidecar: tuple[str, ...]
    about: str


CONFIGS: dict[str, Deployment] = {
    "hicache": Deployment(("--radix-eviction-policy", "lru"), ("--policy-mode", "off", "--no-admission-enabled"),
                          "stock SGLang + HiCache (LRU), the sidecar as a pass-through"),
    "product": Deployment(("--radix-eviction-policy", "session_ttl", "--radix-eviction-policy-config", PLUGIN_CONFIG),
                          ("--config", PRODUCT_SIDECAR_CONFIG),
                          "SGLang + HiCache + the session_ttl plugin, the sidecar with configs/coding-agent.toml"),
}


def engine_flags(config: str, ratio: float, dist: str, kv_tokens: int = KV_TOKENS,
                 override: list[str] | None = None) -> list[str]:
    """SGLang's flags of a configuration (``override`` replaces the configuration's own part)."""
    own = list(CONFIGS[config].engine) if override is None else list(override)
    flags = ["--max-total-tokens", str(kv_tokens), "--enable-hierarchical-cache", "--hicache-ratio", f"{ratio:g}", *own]
    if dist == "traces":
        flags += ["--context-length", str(TRACES_CONTEXT_LENGTH)]
    return flags


def sidecar_flags(config: str, override: list[str] | None = None) -> list[str]:
    return list(CONFIGS[config].sidecar) if override is None else list(override)


# SGLang flag -> simulate flag (the simulator's engine takes SGLang's own arguments under these names)
_ENGINE_VALUE_FLAGS = {
    "--max-total-tokens": "--kv-tokens", "--radix-eviction-policy": "--policy",
    "--radix-eviction-policy-config": "--policy-config", "--hicache-ratio": "--hicache-ratio",
    "--hicache-size": "--hicache-size", "--hicache-write-policy": "--hicache-write-policy",
    "--context-length": "--context-length", "--chunked-prefill-size": "--chunked-prefill-size",
    "--max-prefill-tokens": "--max-prefill-tokens", "--max-running-requests": "--max-running-requests",
}
_ENGINE_SWITCHES = {"--enable-hierarchical-cache": "--enable-hierarchical-cache", "--enable-hicache": "--enable-hierarchical-cache",
                    "--enable-session-radix-cache": "--session-radix-cache"}
_ENGINE_NO_EFFECT = {"--enable-metrics", "--enable-cache-report"}  # reporting only: the simulator always reports


def simulate_flags(engine: list[str], sidecar: list[str]) -> list[str]:
    """A deployment's SGLang + sidecar flags as ``sglang-sidecar simulate`` flags: SGLang's by
    name, the sidecar's ``--config`` as ``--sidecar-config`` and every other setting flag as
    ``--sidecar-set SECTION.FIELD=VALUE``. A flag the simulator cannot mirror is an error (a run that
    silently dropped it would not be that configuration); the sidecar's [server] flags (ports,
    URLs, tokenizer) have no meaning in a replay and are left out."""
    from sidecar.settings import flag_name, iter_fields

    out: list[str] = []
    i = 0
    while i < len(engine):
        flag = engine[i]
        if flag in _ENGINE_SWITCHES:
            out.append(_ENGINE_SWITCHES[flag])
            i += 1
        elif flag in _ENGINE_NO_EFFECT:
            i += 1
        elif flag in _ENGINE_VALUE_FLAGS and i + 1 < len(engine):
            out += [_ENGINE_VALUE_FLAGS[flag], engine[i + 1]]
            i += 2
        else:
            raise ValueError(f"the simulator has no counterpart of SGLang's {flag}")
    settings = {f"--{flag_name(section, name)}": (section, name, info.annotation is bool)
                for section, name, info in iter_fields()}
    i = 0
    while i < len(sidecar):
        flag = sidecar[i]
        if flag == "--config" and i + 1 < len(sidecar):
            out += ["--sidecar-config", sidecar[i + 1]]
            i += 2
            continue
        negated = flag.startswith("--no-") and f"--{flag[5:]}" in settings
        key = f"--{flag[5:]}" if negated else flag
        if key not in settings:
            raise ValueError(f"not a sidecar setting flag: {flag}")
        section, name, is_bool = settings[key]
        if is_bool:
            value, i = ("false" if negated else "true"), i + 1
        elif i + 1 < len(sidecar):
            value, i = sidecar[i + 1], i + 2
        else:
            raise ValueError(f"{flag} needs a value")
        if section != "server":
            out += ["--sidecar-set", f"{section}.{name}={value}"]
    return out


# --------------------------------------------------------------------------------------------
# One point: a trace at one rate, run and judged


def _ids(trace: Trace, salt: str = "") -> tuple[dict[str, int], dict[str, int]]:
    """Session id as the records name it -> place in arrival order / planned turns."""
    suffix = f"-{salt}" if salt else ""
    return ({s.session_id + suffix: i for i, s in enumerate(trace.sessions)},
            {s.session_id + suffix: len(s.rounds) for s in trace.sessions})


def simulate_run(trace: Trace, flags: list[str], time_limit_s: float) -> tuple[dict[str, Any], list[TurnRecord]]:
    """``sglang-sidecar simulate`` on the trace, in this process (SGLang imported once for every
    point): the run JSON and the per-turn records it saved."""
    from sidecar_tools.benchmarks.records import load_run, read_turns_csv
    from sidecar_tools.benchmarks.traces import save_jsonl
    from sidecar_tools.simulator.cli import simulate

    with tempfile.TemporaryDirectory(prefix="capacity-") as tmp:
        path = Path(tmp) / "trace.jsonl"
        save_jsonl(trace, path)
        args = ["--trace", str(path), *flags, "--time-limit", f"{time_limit_s:g}", "--name", "point", "--out", tmp]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            simulate.main(args=args, prog_name="sglang-sidecar simulate", standalone_mode=False)
        return load_run(Path(tmp) / "point.json"), read_turns_csv(Path(tmp) / "point-turns.csv")


def url_run(trace: Trace, url: str, engine_url: str | None, mode: str, tokenizer: str | None, time_limit_s: float,
            salt: str, request_timeout_s: float, on_turn=None) -> tuple[dict[str, Any], list[TurnRecord]]:
    """The GPU client (``benchmarks.replay``) on the trace: each session starts at its arrival."""
    from sidecar_tools.benchmarks.clients import ClientOptions
    from sidecar_tools.benchmarks.replay import replay

    opts = ClientOptions(close_sessions=True, salt=salt, request_timeout_s=request_timeout_s)
    return asyncio.run(replay(trace, url=url, mode=mode, opts=opts, engine_url=engine_url, time_limit_s=time_limit_s,
                              tokenizer=tokenizer, flush=True, on_turn=on_turn))


def point_from_run(run: dict[str, Any], records: list[TurnRecord], trace: Trace, rate: float, window: Window, slo: SLO,
                   salt: str = "", **extra: Any) -> PointResult:
    arrivals, planned = _ids(trace, salt)
    point = judge(records, arrivals, planned, rate, window, slo)
    s = run["summary"]
    point.extra = {**extra, "last_arrival_s": trace.sessions[-1].start_s,
                   "time_limit_s": round(window.time_limit_s(trace.sessions[-1].start_s), 3), "makespan_s": s["makespan_s"], "recomputed_share": s.get("recomputed_share"),
                   "turns_failed": s["turns_failed"], "timed_out": s.get("timed_out"),
                   "sessions_unfinished": s.get("sessions_unfinished"), "ttft_p99_all_s": s.get("ttft_p99_s")}
    return point


def describe(point: PointResult) -> str:
    def f(x: float | None) -> str:
        return "-" if x is None else "inf" if math.isinf(x) else f"{x:.2f} s"

    return (f"λ {point.rate_per_min:g}/min: later-turn p99 {f(point.later_turn_ttft_p99_s)}, first-turn p99 "
            f"{f(point.first_turn_ttft_p99_s)} ({point.sessions_measured} of {point.sessions_arrived} sessions "
            f"measured, {point.turns_missing} turns missing) -> {'meets' if point.meets_slo else 'misses'} the SLO")


# --------------------------------------------------------------------------------------------
# Results


def result_name(config: str, dist: str, ratio: float) -> str:
    return f"capacity-{config}-{dist}-r{ratio:g}"


def result_dict(points: list[dict[str, Any]], slo: SLO, window: Window, *, config: str, dist: str, ratio: float,
                source: str, seed: int, engine: list[str], sidecar: list[str], command: str,
                search: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"capacity_per_min", "slo", "points", ...}``: what a capacity-CONFIG-DIST-rR.json holds."""
    points = sorted(points, key=lambda p: p["rate_per_min"])
    found = capacity_from_points(points)
    out = {
        "capacity_per_min": found["capacity_per_min"],
        "slo": slo.to_dict(window),
        "points": points,
        "bracket": found["bracket"],
        "bounded": found["bounded"],
        "config": config, "distribution": dist, "hicache_ratio": ratio,
        "source": source,  # "simulator", "gpu" (a URL), or what --source named
        "seed": seed,
        "deployment": {"about": CONFIGS[config].about if config in CONFIGS else None,
                       "sglang_flags": engine, "sidecar_flags": sidecar,
                       "simulate_flags": simulate_flags(engine, sidecar) if source == "simulator" else None},
        "command": command, "git_commit": commit_of(Path(__file__).resolve().parent),
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    if search is not None:
        out["search"] = search
    return out


def merge_points(path: Path, new: list[dict[str, Any]], slo: SLO, window: Window, seed: int,
                 source: str) -> list[dict[str, Any]]:
    """Points already saved at ``path`` (same SLO, window, seed and source), replaced by new ones at the same rate."""
    if not path.exists():
        return new
    old = json.loads(path.read_text())
    if old.get("slo") != slo.to_dict(window) or old.get("seed") != seed or old.get("source") != source:
        raise click.ClickException(f"{path} holds points of another SLO, window, seed or source "
                                   f"({old.get('source')}): use another --out or remove it")
    rates = {p["rate_per_min"] for p in new}
    return [p for p in old["points"] if p["rate_per_min"] not in rates] + new


# --------------------------------------------------------------------------------------------
# CLI


def _common(f):
    options = [
        click.option("--config", "config", type=click.Choice(sorted(CONFIGS)), required=True,
                     help="hicache: stock SGLang + HiCache, sidecar pass-through; product: plugin + sidecar config."),
        click.option("--dist", type=click.Choice(DISTRIBUTIONS), required=True,
                     help="reference: the reference preset's sessions; traces: recorded sessions, with replacement."),
        click.option("--hicache-ratio", "ratio", type=float, required=True, help="SGLang's --hicache-ratio."),
        click.option("--kv-tokens", type=int, default=KV_TOKENS, show_default=True, help="--max-total-tokens."),
        click.option("--engine-flags", default=None,
                     help="Replace the configuration's own SGLang flags (one string; KV, host tier and context length stay)."),
        click.option("--sidecar-flags", default=None, help="Replace the configuration's sidecar flags (one string)."),
        click.option("--trace-file", "trace_files", multiple=True, metavar="FILE[=WEIGHT]",
                     help=f"--dist traces: a recorded trace to sample (repeatable; default: "
                          f"{', '.join(p for p, _ in DEFAULT_REAL_TRACES)}, each session equally likely; "
                          f"FILE alone weighs its number of sessions)."),
        click.option("--seed", type=int, default=2, show_default=True, help="Arrivals and session draws."),
        click.option("--warmup", type=int, default=None,
                     help="Sessions arriving before the measured ones (default: the distribution's, "
                          + ", ".join(f"{d} {w.warmup}" for d, w in DEFAULT_WINDOWS.items()) + ")."),
        click.option("--measure", type=int, default=None,
                     help="Measured sessions (default: " + ", ".join(f"{d} {w.measure}" for d, w in DEFAULT_WINDOWS.items())
                          + ")."),
        click.option("--cooldown", type=int, default=None,
                     help="Sessions arriving after the measured ones, load while they finish (default: "
                          + ", ".join(f"{d} {w.cooldown}" for d, w in DEFAULT_WINDOWS.items()) + ")."),
        click.option("--drain", type=float, default=None,
                     help="s after the last arrival before the run is cut (default: "
                          + ", ".join(f"{d} {w.drain_s:g}" for d, w in DEFAULT_WINDOWS.items()) + ")."),
        click.option("--later-p99", type=float, default=SLO.later_turn_ttft_p99_s, show_default=True,
                     help="SLO: later-turn TTFT p99 (s)."),
        click.option("--first-p99", type=float, default=SLO.first_turn_ttft_p99_s, show_default=True,
                     help="SLO: first-turn TTFT p99, door wait included (s)."),
        click.option("--out", type=click.Path(file_okay=False), required=True, help="Folder of the capacity JSON."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@dataclass
class _Setup:
    config: str
    dist: str
    ratio: float
    seed: int
    window: Window
    slo: SLO
    pool: RecordedPool
    engine: list[str]
    sidecar: list[str]
    out: Path


def _setup(kw: dict[str, Any]) -> _Setup:
    base = DEFAULT_WINDOWS[kw["dist"]]
    try:
        window = Window(base.warmup if kw["warmup"] is None else kw["warmup"],
                        base.measure if kw["measure"] is None else kw["measure"],
                        base.cooldown if kw["cooldown"] is None else kw["cooldown"],
                        base.drain_s if kw["drain"] is None else kw["drain"])
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    sources = []
    for spec in kw["trace_files"]:
        path, _, weight = spec.rpartition("=") if "=" in spec else (spec, "", "")
        try:
            sources.append((path, float(weight) if weight else None))
        except ValueError:
            raise click.BadParameter(f"expected FILE or FILE=WEIGHT, got {spec!r}", param_hint="--trace-file") from None
    engine = engine_flags(kw["config"], kw["ratio"], kw["dist"], kw["kv_tokens"],
                          shlex.split(kw["engine_flags"]) if kw["engine_flags"] is not None else None)
    sidecar = sidecar_flags(kw["config"], shlex.split(kw["sidecar_flags"]) if kw["sidecar_flags"] is not None else None)
    return _Setup(kw["config"], kw["dist"], kw["ratio"], kw["seed"], window, SLO(kw["later_p99"], kw["first_p99"]),
                  RecordedPool(tuple(sources)) if sources else RecordedPool(), engine, sidecar, Path(kw["out"]))


def _trace(setup: _Setup, rate: float) -> Trace:
    try:
        return open_loop_trace(setup.dist, rate, setup.window.sessions, setup.seed, setup.pool)
    except (ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from None


def _command(ctx: click.Context) -> str:
    """The invocation, rebuilt from the options given (as ``simulate`` records its own)."""
    parts = ["sglang-sidecar", "capacity", ctx.command.name]
    for param in ctx.command.params:
        if ctx.get_parameter_source(param.name) in (None, click.core.ParameterSource.DEFAULT):
            continue
        value = ctx.params[param.name]
        if getattr(param, "is_flag", False):
            parts.append(param.opts[0] if value else (param.secondary_opts or param.opts)[0])
        elif isinstance(value, (tuple, list)):
            for v in value:
                parts += [param.opts[0], f"{v:g}" if isinstance(v, float) else str(v)]
        elif value is not None:
            parts += [param.opts[0], f"{value:g}" if isinstance(value, float) else str(value)]
    return shlex.join(parts)


def _limit(setup: _Setup, trace: Trace) -> float:
    return round(setup.window.time_limit_s(trace.sessions[-1].start_s), 3)


def _sim_point(setup: _Setup, rate: float, flags: list[str]) -> PointResult:
    trace = _trace(setup, rate)
    t0 = time.monotonic()
    try:
        run, records = simulate_run(trace, flags, _limit(setup, trace))
    except click.ClickException as exc:
        raise click.ClickException(f"λ {rate:g}/min: {exc.message}") from None
    return point_from_run(run, records, trace, rate, setup.window, setup.slo, engine="simulator",
                          wall_s=round(time.monotonic() - t0, 1))


def _save(setup: _Setup, result: dict[str, Any]) -> Path:
    setup.out.mkdir(parents=True, exist_ok=True)
    path = setup.out / f"{result_name(setup.config, setup.dist, setup.ratio)}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path


@click.group("capacity")
def capacity() -> None:
    """Open-loop capacity at a TTFT SLO: sessions per minute one engine serves (simulator or a URL)."""


@capacity.command("search")
@_common
@click.option("--start", type=float, default=12.0, show_default=True, help="First rate tried (sessions/min).")
@click.option("--tolerance", type=float, default=0.1, show_default=True,
              help="Stop when failing / passing rate - 1 is at most this.")
@click.option("--factor", type=float, default=2.0, show_default=True, help="Bracketing step (x or / per point).")
@click.option("--max-points", type=int, default=8, show_default=True, help="Most rates simulated.")
@click.option("--min-rate", type=float, default=0.5, show_default=True)
@click.option("--max-rate", type=float, default=240.0, show_default=True)
@click.pass_context
def search_cmd(ctx: click.Context, start: float, tolerance: float, factor: float, max_points: int, min_rate: float,
               max_rate: float, **kw: Any) -> None:
    """Bisection in the simulator for the largest λ meeting the SLO; writes capacity-CONFIG-DIST-rR.json."""
    from sidecar_tools.progress import progress_bar

    setup = _setup(kw)
    try:
        flags = simulate_flags(setup.engine, setup.sidecar)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    points: list[dict[str, Any]] = []
    name = result_name(setup.config, setup.dist, setup.ratio)
    bar = progress_bar(max_points, name, unit="rate")

    def evaluate(rate: float) -> bool:
        point = _sim_point(setup, rate, flags)
        points.append(point.to_dict())
        bar.update()
        bar.write(f"{name}: {describe(point)} [{point.extra['wall_s']:.0f} s]", file=sys.stderr)
        return point.meets_slo

    with bar:
        try:
            found = search_capacity(evaluate, start, tolerance=tolerance, factor=factor, min_rate=min_rate,
                                    max_rate=max_rate, max_points=max_points)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    search = {k: found[k] for k in ("rates_tried", "budget_exhausted", "search")}
    result = result_dict(points, setup.slo, setup.window, config=setup.config, dist=setup.dist, ratio=setup.ratio,
                         source="simulator", seed=setup.seed, engine=setup.engine, sidecar=setup.sidecar,
                         command=_command(ctx), search=search)
    path = _save(setup, result)
    click.echo(f"{name} (simulator): capacity {result['capacity_per_min']:g} sessions/min "
               f"(bracket {result['bracket']['passing_per_min']} .. {result['bracket']['failing_per_min']}); saved {path}")


@capacity.command("run")
@_common
@click.option("--rate", "rates", type=float, multiple=True, required=True, help="Arrival rate, sessions/min (repeatable).")
@click.option("--url", default=None, help="Run against this URL (the sidecar in front of SGLang) instead of the simulator.")
@click.option("--engine-url", default=None, help="--url: SGLang's URL (/flush_cache before the run, /metrics diffed).")
@click.option("--mode", type=click.Choice(["openai", "anthropic", "generate"]), default="openai", show_default=True,
              help="--url: the client protocol (benchmarks.replay's).")
@click.option("--tokenizer", default=None, help="--url: tokenizer folder that sizes the texts exactly.")
@click.option("--request-timeout", type=float, default=300.0, show_default=True, help="--url: one request's limit (s).")
@click.option("--source", "source_label", default=None,
              help="What ran the points, recorded as source (default: gpu with --url, simulator without; "
                   "e.g. sim-serve for a dry run against the simulator's HTTP server).")
@click.option("--save-runs/--no-save-runs", default=None,
              help="Also save each rate's run JSON + per-turn CSV (default: with --url).")
@click.option("--not-after", type=float, default=None, metavar="EPOCH_S",
              help="--url: skip a rate whose run could end after this time (its last arrival + the drain): on a "
                   "lent GPU, a point cut when the machine goes would read as a missed SLO.")
@click.pass_context
def run_cmd(ctx: click.Context, rates: tuple[float, ...], url: str | None, engine_url: str | None, mode: str,
            tokenizer: str | None, request_timeout: float, source_label: str | None, save_runs: bool | None,
            not_after: float | None, **kw: Any) -> None:
    """Given rates, in the simulator or against --url; points merge into capacity-CONFIG-DIST-rR.json."""
    from sidecar_tools.benchmarks.records import save_run
    from sidecar_tools.progress import progress_bar

    setup = _setup(kw)
    source = source_label or ("gpu" if url else "simulator")
    flags = None
    if url is None:
        try:
            flags = simulate_flags(setup.engine, setup.sidecar)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    save_runs = bool(url) if save_runs is None else save_runs
    name = result_name(setup.config, setup.dist, setup.ratio)
    points = []
    for rate in rates:
        if not rate > 0:
            raise click.BadParameter(f"rates must be > 0, got {rate:g}", param_hint="--rate")
        trace = _trace(setup, rate)
        limit = _limit(setup, trace)
        if url and not_after is not None and time.time() + limit > not_after:
            click.echo(f"{name}: λ {rate:g}/min skipped: its run could take {limit:.0f} s, past --not-after", err=True)
            continue
        t0 = time.monotonic()
        salt = f"{name}-{rate:g}-{int(time.time())}" if url else ""
        if url:
            with progress_bar(sum(len(s.rounds) for s in trace.sessions), f"{name} λ {rate:g}") as bar:
                run, records = url_run(trace, url, engine_url, mode, tokenizer, limit, salt,
                                       request_timeout, on_turn=lambda rec: bar.update())
        else:
            try:
                run, records = simulate_run(trace, flags, limit)
            except click.ClickException as exc:
                raise click.ClickException(f"λ {rate:g}/min: {exc.message}") from None
        point = point_from_run(run, records, trace, rate, setup.window, setup.slo, salt=salt, engine=source,
                               wall_s=round(time.monotonic() - t0, 1), **({"url": url} if url else {}))
        if save_runs:
            run_name = f"{name}-at-{rate:g}"
            run = {"name": run_name, "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
                   "command": _command(ctx), **run, "capacity_point": point.to_dict()}
            save_run(setup.out, run_name, run, records)
        points.append(point.to_dict())
        click.echo(f"{name} ({source}): {describe(point)}")
    if not points:
        click.echo(f"{name}: no rate run; {setup.out} left as it was")
        return
    setup.out.mkdir(parents=True, exist_ok=True)
    path = setup.out / f"{name}.json"
    merged = merge_points(path, points, setup.slo, setup.window, setup.seed, source)
    result = result_dict(merged, setup.slo, setup.window, config=setup.config, dist=setup.dist, ratio=setup.ratio,
                         source=source, seed=setup.seed, engine=setup.engine, sidecar=setup.sidecar,
                         command=_command(ctx))
    _save(setup, result)
    click.echo(f"{name} ({source}): capacity {result['capacity_per_min']:g} sessions/min over the rates run "
               f"(bracket {result['bracket']['passing_per_min']} .. {result['bracket']['failing_per_min']}); saved {path}")


@capacity.command("flags")
@click.option("--config", "config", type=click.Choice(sorted(CONFIGS)), required=True)
@click.option("--hicache-ratio", "ratio", type=float, required=True)
@click.option("--dist", type=click.Choice(DISTRIBUTIONS), required=True)
@click.option("--kv-tokens", type=int, default=KV_TOKENS, show_default=True)
@click.option("--part", type=click.Choice(["engine", "sidecar", "simulate"]), required=True,
              help="engine: SGLang's flags; sidecar: the sidecar's; simulate: both as simulate flags.")
@click.option("--engine-flags", "engine_override", default=None, help="As for run/search.")
@click.option("--sidecar-flags", "sidecar_override", default=None, help="As for run/search.")
def flags_cmd(config: str, ratio: float, dist: str, kv_tokens: int, part: str, engine_override: str | None,
              sidecar_override: str | None) -> None:
    """Print a configuration's flags, shell-quoted (what benchmarks/capacity_gpu.sh starts)."""
    engine = engine_flags(config, ratio, dist, kv_tokens,
                          shlex.split(engine_override) if engine_override is not None else None)
    sidecar = sidecar_flags(config, shlex.split(sidecar_override) if sidecar_override is not None else None)
    flags = engine if part == "engine" else sidecar if part == "sidecar" else simulate_flags(engine, sidecar)
    click.echo(shlex.join(flags))


@capacity.command("report")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--md", type=click.Path(dir_okay=False), default=None, help="Write the table here.")
@click.option("--png", type=click.Path(dir_okay=False), default=None, help="Write the plot here.")
@click.option("--title", default="", help="Plot title.")
def report_cmd(paths: tuple[str, ...], md: str | None, png: str | None, title: str) -> None:
    """Table and plot (p99 against λ per configuration) of capacity JSONs (files or folders)."""
    from sidecar_tools.benchmarks.capacity_report import figure, find_results, table

    results = find_results(list(paths))
    if not results:
        raise click.ClickException("no capacity-*.json found")
    text = table(results)
    click.echo(text)
    if md:
        Path(md).write_text(text)
    if png:
        figure(results, title).savefig(png, dpi=110, bbox_inches="tight")
        click.echo(f"saved {png}", err=True)


def main() -> None:  # python -m sidecar_tools.benchmarks.capacity
    capacity(prog_name="sglang-sidecar capacity")


if __name__ == "__main__":
    main()
