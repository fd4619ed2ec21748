"""``sglang-sidecar simulate``: the thin click layer (imports nothing heavy until a command runs).

    sglang-sidecar simulate --synthetic reference --kv-tokens 173200 --policy lru
    sglang-sidecar simulate --trace t.jsonl --policy session_ttl --sidecar-policy predictive \\
        --sidecar-config configs/coding-agent.toml --out benchmarks/results/sim --name sidecar
    sglang-sidecar simulate --hicache-ratio 3                             # + SGLang's host tier (HiCache)
    sglang-sidecar simulate --serve --port 30000 --policy session_ttl      # SGLang's HTTP subset
    sglang-sidecar simulate --workers 2 --lose-worker 0@30 --shared-l3    # several workers, one lost
    sglang-sidecar simulate calibrate benchmarks/results/h200             # refit the cost model
"""

from __future__ import annotations

import json
import shlex
import sys
from datetime import UTC
from pathlib import Path
from typing import Any

import click

DEFAULT_SOURCE = click.core.ParameterSource.DEFAULT
PRESET_NAMES = ("default", "reference")  # sidecar_tools.benchmarks.traces.PRESETS (not imported here: keep --help fast)


def parse_sidecar_policy(value: str) -> dict[str, Any] | None:
    """none | off | fixed:T | predictive -> settings overrides for [policy] (None = no sidecar)."""
    v = value.strip().lower()
    if v in ("none", ""):
        return None
    if v == "off":
        return {"mode": "off"}
    if v == "predictive":
        return {"mode": "predictive"}
    if v.startswith("fixed"):
        _, _, ttl = v.partition(":")
        try:
            return {"mode": "fixed", **({"fixed_ttl": float(ttl)} if ttl else {})}
        except ValueError:
            pass
    raise click.BadParameter(f"expected none, off, fixed:SECONDS or predictive, got {value!r}",
                             param_hint="--sidecar-policy")


def parse_sidecar_set(pairs: tuple[str, ...] | list[str]) -> dict[str, dict[str, Any]]:
    """``SECTION.FIELD=VALUE`` pairs -> settings overrides (values validated by the settings model)."""
    out: dict[str, dict[str, Any]] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not name:
            raise click.BadParameter(f"expected SECTION.FIELD=VALUE, got {pair!r}", param_hint="--sidecar-set")
        out.setdefault(section, {})[name.replace("-", "_")] = value.strip()
    return out


def parse_template_tokens(value: str) -> tuple[int, int, int]:
    """A ``TEMPLATE_TOKENS`` name or ``SHARED,FIRST,LATER`` -> (shared, first, later)."""
    from sidecar_tools.benchmarks.traces import TEMPLATE_TOKENS

    if value in TEMPLATE_TOKENS:
        return TEMPLATE_TOKENS[value]
    try:
        shared, first, later = (int(x) for x in value.split(","))
    except ValueError:
        raise click.BadParameter(f"expected {', '.join(TEMPLATE_TOKENS)} or SHARED,FIRST,LATER, got {value!r}",
                                 param_hint="--template-tokens") from None
    return shared, first, later


def _json_option(value: str | None, hint: str) -> dict[str, Any] | None:
    if not value:
        return None
    try:
        data = json.loads(value)
    except ValueError as exc:
        raise click.BadParameter(f"not valid JSON: {exc}", param_hint=hint) from None
    if not isinstance(data, dict):
        raise click.BadParameter("expected a JSON object", param_hint=hint)
    return data


def _display_path(path: str | Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def _command_line(ctx: click.Context) -> str:
    parts = ["sglang-sidecar", "simulate"]
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name)
        if source in (None, click.core.ParameterSource.DEFAULT):
            continue
        value = ctx.params[param.name]
        opt = param.opts[0] if not (getattr(param, "secondary_opts", None) and value is False) else param.secondary_opts[0]
        if getattr(param, "is_flag", False):
            parts.append(opt)
        elif isinstance(value, (tuple, list)):
            for v in value:
                parts += [opt, str(v)]
        elif value is not None:
            parts += [opt, str(value)]
    return shlex.join(parts)


@click.group("simulate", invoke_without_command=True, context_settings={"show_default": True})
@click.option("--trace", "trace_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Trace file: agent-trace-v1, TraceLab round trace or CSV export, LMCache agent trace, OpenAI chats.")
@click.option("--synthetic", type=click.Choice(PRESET_NAMES), default="reference",
              help="Synthetic preset drawn when no --trace is given.")
@click.option("--seed", type=int, default=None, help="Preset seed (default: the preset's).")
@click.option("--sessions", type=int, default=None, help="Only the first N sessions / N sessions.")
@click.option("--turns", type=int, default=None, help="Only the first N rounds / N rounds per session.")
@click.option("--tool-wait", type=float, default=None, help="Fixed tool gap in s (default: the trace's).")
@click.option("--start-spacing", type=float, default=None,
              help="Session i starts at i x S s instead of its recorded start (0: all at once); before --replicate.")
@click.option("--template-tokens", default="none",
              help="Tokens a chat template adds to what the trace sends: qwen3-openai (what the OpenAI path through the "
                   "sidecar renders on the H200 runs: 254 shared + 5 in round 0, 10 a later round), none, or SHARED,FIRST,LATER.")
@click.option("--replicate", type=int, default=1, show_default=True,
              help="Run N copies of every session (copy k: id <id>~r<k>, its own prompts).")
@click.option("--replicate-offset", type=float, default=0.0, show_default=True,
              help="Copy k starts k x S s after the original session's start.")
@click.option("--kv-tokens", type=int, default=173_200, help="KV pool size in tokens (--max-total-tokens), per worker.")
@click.option("--workers", type=click.IntRange(min=1), default=1,
              help="Simulated SGLang workers, each with these flags; new sessions placed by the sidecar's placement.")
@click.option("--lose-worker", "lose_worker", multiple=True, metavar="W@T",
              help="Worker W (0-based) is lost at T virtual seconds: its requests fail and are retried, "
                   "its sessions move (repeatable).")
@click.option("--shared-l3", is_flag=True,
              help="Every worker writes KV through to one shared L3 store (--hicache-storage-backend file on a "
                   "shared path, or mooncake); a re-homed session reads it back instead of recomputing. Needs the host tier.")
@click.option("--l3-read-gbps", type=click.FloatRange(min=0, min_open=True), default=1.5,
              help="--shared-l3: GB/s a worker reads (and writes) the store at (default: SGLang's file backend at "
                   "--page-size 64 as measured on an H200, benchmarks/results/h200-2026-12-01c-l3).")
@click.option("--policy", default="lru",
              help="--radix-eviction-policy: lru, lfu, fifo, mru, filo, priority, slru, tlru, session_ttl (plugin).")
@click.option("--policy-config", default=None,
              help="--radix-eviction-policy-config JSON (tlru default: threshold 4096, next 1024).")
@click.option("--session-radix-cache", is_flag=True,
              help="SGLang's --enable-session-radix-cache (session-referenced KV is evicted last).")
@click.option("--enable-hierarchical-cache", "--enable-hicache", "hicache", is_flag=True,
              help="SGLang's host tier (HiCache); implied by --hicache-ratio/--hicache-size/--hicache-size-tokens.")
@click.option("--hicache-ratio", type=float, default=None,
              help="Host pool / GPU pool size (SGLang's --hicache-ratio; 2.0 when the tier is on without a size).")
@click.option("--hicache-size", "hicache_size_gb", type=float, default=None,
              help="Host pool in GB (SGLang's --hicache-size; tokens = GB / the calibration's kv_bytes_per_token).")
@click.option("--hicache-size-tokens", type=int, default=None, help="Host pool in tokens (overrides ratio and size).")
@click.option("--hicache-write-policy", type=click.Choice(["write_through", "write_through_selective", "write_back"]),
              default="write_through", help="SGLang's --hicache-write-policy.")
@click.option("--expected-back-oracle", is_flag=True,
              help="What-if: every leased request says when its session returns (session_expected_back_s = the "
                   "trace's next gap), as a sidecar that predicted gaps perfectly would; the sidecar does not send it yet.")
@click.option("--lease-ttl", type=float, default=None,
              help="Client-side lease on every request (custom_params.session_lease_ttl_s), no sidecar.")
@click.option("--sidecar-policy", default="none",
              help="The sidecar's policy in the loop: none (raw /generate), off, fixed:T, predictive.")
@click.option("--sidecar-config", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Sidecar TOML config ([policy], [admission]); --sidecar-policy/--admission override it.")
@click.option("--admission/--no-admission", default=None,
              help="Sidecar admission gate (default: the config's, else off).")
@click.option("--sidecar-set", "sidecar_set", multiple=True, metavar="SECTION.FIELD=VALUE",
              help="Override one sidecar setting, e.g. admission.projection_turns=4 (repeatable).")
@click.option("--max-concurrent-sessions", type=int, default=None, help="Client-side cap on live sessions.")
@click.option("--close-sessions/--no-close-sessions", default=True, help="/close_session when a session ends.")
@click.option("--time-limit", type=float, default=None, help="Virtual-time limit of the run (s).")
@click.option("--calibration", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Cost-model calibration JSON (default: simulator/calibration/h200-qwen3-8b.json).")
@click.option("--chunked-prefill-size", type=int, default=8192)
@click.option("--max-prefill-tokens", type=int, default=16384)
@click.option("--max-running-requests", type=int, default=256)
@click.option("--context-length", type=int, default=131_072,
              help="Longest prompt + reply: Qwen3-8B with YaRN (recorded agent sessions pass 40,960, its native length).")
@click.option("--name", default=None, help="Run name (file stem). Default: sim-<policy>-<trace>-<gap>.")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Save <out>/<name>.json and <out>/<name>-turns.csv (the benchmark's format).")
@click.option("--json", "as_json", is_flag=True, help="Print the run's summary as JSON.")
@click.option("--serve", is_flag=True, help="Serve SGLang's HTTP API with the simulated engine instead.")
@click.option("--host", default="127.0.0.1", help="--serve: address.")
@click.option("--port", type=int, default=30000, help="--serve: port.")
@click.option("--time-scale", type=float, default=1.0, help="--serve: virtual seconds per wall-clock second.")
@click.option("--model-name", default="simulated-qwen3-8b", help="--serve: served_model_name.")
@click.option("--tokenizer-path", default=None, help="--serve: tokenizer_path reported by /server_info.")
@click.option("--replies", type=click.Choice(["random", "agent"]), default="random", show_default=True,
              help="--serve: what the model says: random tokens to max_tokens (load tests), or agent: a "
                   "scripted agent's model (a tool call to an offered tool, then a short answer, each ending "
                   "with EOS; needs --tokenizer-path). Timing is the cost model's either way.")
@click.option("--log-level", default="warning")
@click.pass_context
def simulate(ctx: click.Context, **kw: Any) -> None:
    """Replay agent sessions against SGLang's real radix cache on the CPU (or --serve its HTTP API)."""
    if ctx.invoked_subcommand is not None:
        return
    import logging

    logging.basicConfig(level=kw["log_level"].upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    policy_config = _json_option(kw["policy_config"], "--policy-config")
    if policy_config is None and kw["policy"].lower() == "tlru":
        policy_config = {"threshold": 4096, "next_prompt_estimate": 1024}
    sidecar_overrides = parse_sidecar_policy(kw["sidecar_policy"])
    if kw["serve"]:
        if kw["workers"] > 1 or kw["lose_worker"] or kw["shared_l3"]:
            raise click.UsageError("--workers, --lose-worker and --shared-l3 are replay options (--serve is one worker)")
        if kw["expected_back_oracle"]:
            raise click.UsageError("--expected-back-oracle is a replay option (with --serve the client sends what it sends)")
        _serve(kw, policy_config)
        return
    _replay(ctx, kw, policy_config, sidecar_overrides)


def host_tier_args(kw: dict[str, Any]):
    """HiCache flags -> HostTierArgs, or None when the host tier is off."""
    from sidecar_tools.simulator.hicache_cpu import HostTierArgs

    sized = any(kw.get(k) is not None for k in ("hicache_ratio", "hicache_size_gb", "hicache_size_tokens"))
    if not (kw.get("hicache") or sized):
        return None
    try:
        return HostTierArgs(ratio=kw.get("hicache_ratio"), size_gb=kw.get("hicache_size_gb") or 0.0,
                            size_tokens=kw.get("hicache_size_tokens"),
                            write_policy=kw.get("hicache_write_policy") or "write_through")
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _engine(kw: dict[str, Any], policy_config: dict[str, Any] | None):
    from sidecar_tools.simulator.costmodel import load_calibration
    from sidecar_tools.simulator.engine import SimEngine

    cost, _ = load_calibration(kw["calibration"])
    return SimEngine(kv_tokens=kw["kv_tokens"], policy=kw["policy"], policy_config=policy_config, cost=cost,
                     chunked_prefill_size=kw["chunked_prefill_size"], max_prefill_tokens=kw["max_prefill_tokens"],
                     max_running_requests=kw["max_running_requests"], context_length=kw["context_length"],
                     session_radix_cache=kw["session_radix_cache"], host_tier=host_tier_args(kw))


def _describe(engine) -> str:
    tiers = f"{engine.kv_tokens} KV tokens"
    if engine.host_tier is not None:
        tiers += (f" + host tier {engine.host_pool_tokens()} tokens ({engine.host_tier.write_policy}; "
                  f"{engine.cost.describe_host()})")
    return f"{engine.policy}, {tiers}, {engine.cost.describe()}"


def _serve(kw: dict[str, Any], policy_config: dict[str, Any] | None) -> None:
    from sidecar_tools.simulator.server import serve

    try:
        engine = _engine(kw, policy_config)
    except (ValueError, RuntimeError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
    responder = _responder(kw)
    click.echo(f"simulated SGLang ({_describe(engine)}, {kw['replies']} replies) on http://{kw['host']}:{kw['port']}", err=True)
    serve(engine, kw["host"], kw["port"], time_scale=kw["time_scale"], model_name=kw["model_name"],
          tokenizer_path=kw["tokenizer_path"], responder=responder)


def _responder(kw: dict[str, Any]):
    """The model of --serve: None (random tokens) or the scripted agent on --tokenizer-path's tokenizer."""
    if kw["replies"] != "agent":
        return None
    if not kw["tokenizer_path"]:
        raise click.UsageError("--replies agent needs --tokenizer-path (it reads the prompt and writes its reply)")
    from transformers import AutoTokenizer

    from sidecar_tools.simulator.replies import agent_responder

    return agent_responder(AutoTokenizer.from_pretrained(kw["tokenizer_path"]))


def _replay(ctx: click.Context, kw: dict[str, Any], policy_config: dict[str, Any] | None,
            sidecar_overrides: dict[str, Any] | None) -> None:
    from datetime import datetime

    from sidecar_tools.benchmarks.clients import ClientOptions
    from sidecar_tools.benchmarks.records import save_run
    from sidecar_tools.benchmarks.replay import load_trace, print_summary
    from sidecar_tools.simulator.costmodel import DEFAULT_CALIBRATION
    from sidecar_tools.progress import progress_bar
    from sidecar_tools.simulator.virtual_replay import SidecarLoop, VirtualReplay

    if kw["lease_ttl"] is not None and sidecar_overrides is not None:
        raise click.UsageError("--lease-ttl is the client's lease without a sidecar; with --sidecar-policy the sidecar decides")
    trace = load_trace(kw["trace_path"], kw["synthetic"], kw["seed"], kw["sessions"], kw["turns"], kw["tool_wait"])
    try:
        if kw["start_spacing"] is not None:
            trace = trace.with_start_spacing(kw["start_spacing"])
        if kw["template_tokens"] != "none":
            trace = trace.with_template_tokens(*parse_template_tokens(kw["template_tokens"]))
        trace = trace.replicated(kw["replicate"], kw["replicate_offset"])
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    losses, shared_l3 = _faults(kw)
    try:
        engines = [_engine(kw, policy_config) for _ in range(kw["workers"])]
    except (ValueError, RuntimeError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
    engine = engines[0]
    opts = ClientOptions(lease_ttl_s=kw["lease_ttl"], close_sessions=kw["close_sessions"])
    replay: VirtualReplay
    sidecar = None
    sidecar_info = None
    if sidecar_overrides is not None or kw["sidecar_config"] or kw["admission"] is not None or kw["sidecar_set"]:
        from sidecar.settings import SettingsError, load_settings

        overrides = parse_sidecar_set(kw["sidecar_set"])
        if sidecar_overrides:
            overrides.setdefault("policy", {}).update(sidecar_overrides)
        if kw["admission"] is not None:
            overrides.setdefault("admission", {})["enabled"] = kw["admission"]
        try:
            settings = load_settings(kw["sidecar_config"], overrides)
        except SettingsError as exc:
            raise click.ClickException(str(exc)) from None
        sidecar = SidecarLoop(settings, engine.kv_tokens, clock=lambda: replay.clock_now,
                              host_tokens=engine.host_pool_tokens() or 0, workers=kw["workers"],
                              host_write_policy=kw.get("hicache_write_policy") or "write_through")
        sidecar_info = {"config": kw["sidecar_config"], "policy": settings.policy.model_dump(),
                        "admission": settings.admission.model_dump()}
    bar = progress_bar(sum(len(s.rounds) for s in trace.sessions), "simulate")
    replay = VirtualReplay(trace, engines, opts, max_concurrent_sessions=kw["max_concurrent_sessions"],
                           time_limit_s=kw["time_limit"], sidecar=sidecar, on_turn=lambda rec: bar.update(),
                           expected_back_oracle=kw["expected_back_oracle"], worker_losses=losses, shared_l3=shared_l3,
                           report_workers=kw["workers"] > 1 or ctx.get_parameter_source("workers") != DEFAULT_SOURCE)
    started = datetime.now(UTC).isoformat(timespec="seconds")
    try:
        with bar:
            run, records = replay.run()
    except RuntimeError as exc:  # SGLang's own failure (e.g. alloc_token_slots out of memory): its scheduler dies here
        raise click.ClickException(f"simulated SGLang failed at t={engine.now:.3f} s (its scheduler process would "
                                   f"exit here): {str(exc).splitlines()[0]}") from None
    gap = kw["tool_wait"]
    tier = "-hicache" if engine.host_tier is not None else ""
    tier += f"-{kw['workers']}w" if kw["workers"] > 1 else ""
    name = kw["name"] or f"sim-{engine.policy}{tier}-{trace.name}-{'trace' if gap is None else f'{gap:g}s'}"
    run = {"name": name, "started_at": started, "command": _command_line(ctx), **run}
    run["config"].update({
        "engine": "simulated", "kv_tokens": engine.kv_tokens, "radix_eviction_policy": engine.policy,
        "radix_eviction_policy_config": policy_config, "session_radix_cache": engine.session_radix_cache,
        "chunked_prefill_size": engine.chunked_prefill_size,
        "max_prefill_tokens": engine.max_prefill_tokens, "sidecar": sidecar_info,
        "start_spacing_s": kw["start_spacing"], "template_tokens": kw["template_tokens"], "replicate": kw["replicate"], "replicate_offset_s": kw["replicate_offset"],
    })
    if engine.host_tier is not None:
        run["config"]["hicache"] = {**engine.hicache_server_args(), "host_pool_tokens": engine.host_pool_tokens(),
                                    "expected_back_oracle": kw["expected_back_oracle"]}
    run["simulator"].update({"cost_model": engine.cost.to_dict(),
                             "calibration": _display_path(kw["calibration"] or DEFAULT_CALIBRATION)})
    if kw["out"]:
        path = save_run(kw["out"], name, run, records)
        click.echo(f"saved {path}", err=True)
    print_summary(name, run["summary"])
    if "workers" in run:
        from sidecar_tools.simulator.load_report import format_faults, format_workers

        click.echo(format_workers(run["workers"]))
        if run["faults"]["rehomed_sessions"] or run["faults"]["failed_requests"]:
            click.echo(format_faults(run["faults"]))
    if kw["as_json"]:
        shown = run["summary"] if "workers" not in run else \
            {**run["summary"], "workers": run["workers"], "faults": run["faults"]}
        click.echo(json.dumps(shown, indent=1))


def _faults(kw: dict[str, Any]):
    """--lose-worker and --shared-l3 -> (WorkerLoss list, SharedL3 or None), checked before any engine is built."""
    from sidecar_tools.simulator.costmodel import load_calibration
    from sidecar_tools.simulator.l3_store_model import SharedL3
    from sidecar_tools.simulator.workers import WorkerLoss, check_losses

    try:
        losses = [WorkerLoss.parse(x) for x in kw["lose_worker"]]
        check_losses(losses, kw["workers"])
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--lose-worker") from None
    if not kw["shared_l3"]:
        return losses, None
    if host_tier_args(kw) is None:
        raise click.UsageError("--shared-l3 is SGLang's L3 tier, under its host tier: add --hicache-ratio (or --enable-hicache)")
    if kw["workers"] < 2:
        raise click.UsageError("--shared-l3 matters only when a session moves: use --workers 2 or more")
    try:
        cost, _ = load_calibration(kw["calibration"])
    except (ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
    return losses, SharedL3(bytes_per_token=cost.kv_bytes_per_token, read_gbps=kw["l3_read_gbps"])


@simulate.command("calibrate")
@click.argument("runs", nargs=-1, type=click.Path(exists=True))
@click.option("--targets", "targets", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Targets JSON (repeatable). Default without RUNS: simulator/calibration/*-runs.json "
                   "(the GPU README's table and the H200 session of 2026-11-30).")
@click.option("--kv-tokens", type=int, default=173_200, help="KV budget of RUNS (unconstrained-*: 600000).")
@click.option("--fit", "fit_names", default="step_s,prefill_token_s,decode_seq_s,decode_ctx_token_s",
              help="Coefficients to fit (the rest stay at --start's values).")
@click.option("--start", "start_path", default=None,
              help="Calibration JSON to start from, or 'prior' (the physical prior). Default: the committed one.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write the new calibration JSON here.")
@click.option("--max-evals", type=int, default=60, help="Most objective evaluations (each simulates every target).")
def calibrate_cmd(runs: tuple[str, ...], targets: tuple[str, ...], kv_tokens: int, fit_names: str,
                  start_path: str | None, out: str | None, max_evals: int) -> None:
    """Refit the cost model so simulated makespans match GPU runs: RUNS are run JSONs, per-turn CSVs
    or folders of them (run_matrix.sh output); without RUNS, the targets file (the GPU README table)."""
    from sidecar_tools.simulator import calibrate

    try:
        names = [n.strip() for n in fit_names.split(",") if n.strip()]
        command = shlex.join(["sglang-sidecar", "simulate", "calibrate", *sys.argv[sys.argv.index("calibrate") + 1:]]) \
            if "calibrate" in sys.argv else None
        result = calibrate.run_calibration(list(runs), list(targets), kv_tokens, names, start_path, out, max_evals,
                                           echo=lambda m: click.echo(m, err=True), command=command)
    except (ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(calibrate.format_table(result["comparison"]))
    if out:
        click.echo(f"saved {out}", err=True)


@simulate.command("fidelity")
@click.argument("sim_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--gpu", "gpu_sources", multiple=True, type=click.Path(exists=True),
              help="GPU run JSONs / folders (run_matrix.sh output) or targets JSONs. "
                   "Default: the targets files in simulator/calibration/.")
@click.option("--md", type=click.Path(dir_okay=False), default=None, help="Also write the table here.")
def fidelity_cmd(sim_dir: str, gpu_sources: tuple[str, ...], md: str | None) -> None:
    """Compare simulated runs (SIM_DIR) with GPU runs of the same config name
    (lru-generate-0.5s on the GPU = lru-0.5s simulated): makespan within 20 %, recompute within 5 pts."""
    from sidecar_tools.simulator import calibrate

    sources = list(gpu_sources) or [str(p) for p in calibrate.DEFAULT_TARGETS]
    table = calibrate.format_fidelity(calibrate.fidelity_rows(sim_dir, sources))
    click.echo(table)
    if md:
        Path(md).write_text(table)


def main() -> None:  # python -m sidecar_tools.simulator.cli
    sys.exit(simulate())


if __name__ == "__main__":
    main()
