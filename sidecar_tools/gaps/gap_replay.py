"""``sglang-sidecar gap-replay``: replay recorded (or synthetic) tool gaps through the predictor and
print, per lease policy, the hit rate and leased token-seconds against the oracle (TTL = true gap).
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from sidecar_tools.gaps.gap_trace import GapTraceError, read_gap_trace, write_gap_trace
from sidecar_tools.gaps.evaluate import evaluate, segment_scores
from sidecar_tools.gaps.synthetic_gaps import WORKLOADS, synthesize_gap_trace
from sidecar_tools.progress import progress_bar
from sidecar.settings import SettingsError, load_settings


def _parse_overrides(pairs: tuple[str, ...]) -> dict[str, dict[str, str]]:
    overrides: dict[str, dict[str, str]] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        section, dot, name = key.partition(".")
        if not sep or not dot:
            raise click.BadParameter(f"expected SECTION.FIELD=VALUE, got {pair!r}", param_hint="--set")
        overrides.setdefault(section, {})[name.replace("-", "_")] = value
    return overrides


def _share(value: float | None, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.1%}"


def format_segments(segments) -> str:
    """Hit rate and cost per time segment: shows leases adapting after a regime change."""
    names = [s.name for s in segments[0][1]]
    lines = ["", "by time segment: hit rate / cost (s)"]
    lines.append(f"{'segment':<18}" + "".join(f" {n:>24}" for n in names))
    for label, scores in segments:
        cells = "".join(f" {f'{_share(s.hit_rate, 0)} / {s.cost_s:.0f}':>24}" for s in scores)
        lines.append(f"{label:<18}{cells}")
    return "\n".join(lines)


def format_report(scores, error: dict, header: str) -> str:
    oracle = next(s for s in scores if s.name.startswith("oracle"))
    lines = [header, ""]
    lines.append(
        f"{'policy':<24} {'hit rate':>8} {'misses':>7} {'leased token-s':>15} {'x oracle':>9} "
        f"{'recomputed tok':>15} {'cost (s)':>9}"
    )
    for s in scores:  # x oracle: "-" when the oracle leases nothing (every gap 0 or never back)
        ratio = f"{s.leased_token_s / oracle.leased_token_s:>9.3f}" if oracle.leased_token_s else f"{'-':>9}"
        lines.append(
            f"{s.name:<24} {_share(s.hit_rate, 8)} {s.returns - s.hits:>7d} {s.leased_token_s:>15.4g} {ratio} "
            f"{s.recomputed_tokens:>15,d} {s.cost_s:>9.1f}"
        )
    lines.append("")
    if error.get("returned_gaps"):
        lines.append(
            f"predicted median gap vs actual: median |log2 error| {error['median_abs_log2_error']}, "
            f"within 2x {error['within_2x']:.1%}, mean log2 error {error['mean_log2_error']:+}"
        )
    predictive = next(s for s in scores if s.name == "predictive (after turn)")
    request = next(s for s in scores if s.name == "predictive (request)")
    top = sorted(predictive.by_tool.items(), key=lambda kv: -kv[1][0])[:10]
    if top:
        lines.append("")
        lines.append(f"{'tool(s)':<34} {'returns':>8} {'hit (request)':>14} {'hit (after turn)':>17}")
        for key, (returns, hits) in top:
            req_returns, req_hits = request.by_tool.get(key, [returns, 0])
            lines.append(
                f"{key:<34} {returns:>8d} {req_hits / max(req_returns, 1):>14.1%} {hits / max(returns, 1):>17.1%}"
            )
    return "\n".join(lines)


@click.command("gap-replay")
@click.argument("trace", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--synthetic",
    type=click.Choice(sorted(WORKLOADS)),
    help="Replay a generated trace of this workload instead of TRACE.",
)
@click.option("--sessions", default=200, show_default=True, help="Sessions in the synthetic trace.")
@click.option("--seed", default=0, show_default=True, help="Seed of the synthetic trace.")
@click.option(
    "--regime-change-at",
    type=float,
    default=None,
    help="Fraction of the synthetic sessions after which one tool gets --slowdown times slower.",
)
@click.option("--slowdown", default=10.0, show_default=True, help="Slowdown factor of the regime change.")
@click.option("--write-trace", type=click.Path(dir_okay=False, path_type=Path), help="Also save the synthetic trace (JSONL).")
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path), help="Sidecar TOML config whose [policy] settings to use.")
@click.option("--set", "sets", multiple=True, metavar="SECTION.FIELD=VALUE", help="Override one setting, e.g. policy.kv_cost_weight=2e-6.")
@click.option("--fixed-ttl", "fixed_ttls", type=float, multiple=True, help="Fixed TTLs to compare (default 2, 30, 300 s).")
@click.option("--segments", default=0, show_default=True, help="Also break hit rate and cost down by this many time segments.")
@click.option("--json-out", type=click.Path(dir_okay=False, path_type=Path), help="Also write the results as JSON.")
def gap_replay(trace, synthetic, sessions, seed, regime_change_at, slowdown, write_trace, config_file, sets, fixed_ttls, segments, json_out):
    """Replay tool gaps (gap JSONL, or any trace file: agent-trace-v1, TraceLab round trace or CSV export, LMCache agent trace, OpenAI chats) through the return-time predictor."""
    if (trace is None) == (synthetic is None):
        raise click.UsageError("give either a TRACE file or --synthetic WORKLOAD")
    try:
        settings = load_settings(config_file, _parse_overrides(sets))
    except SettingsError as exc:
        raise click.UsageError(str(exc)) from None
    if synthetic:
        records = synthesize_gap_trace(synthetic, sessions, seed, regime_change_at, slowdown)
        source = f"synthetic {synthetic} (sessions={sessions}, seed={seed}, regime_change_at={regime_change_at}, slowdown={slowdown:g})"
        if write_trace:
            write_gap_trace(records, write_trace)
    else:
        try:
            records = read_gap_trace(trace)
        except GapTraceError as exc:
            raise click.ClickException(str(exc)) from None
        source = str(trace)
    if not records:
        raise click.ClickException("the trace holds no gaps")
    fixed = tuple(fixed_ttls) or (2.0, 30.0, 300.0)
    with progress_bar(len(records), "gap-replay", unit="gap") as bar:
        scores, error, gaps = evaluate(records, settings, fixed, on_gap=bar.update)
    n_sessions = len({r.session_id for r in records})
    never = sum(r.gap_s is None for r in records)
    zero = sum(r.gap_s == 0 for r in records)
    p = settings.policy
    header = (
        f"trace: {source}\n"
        f"{len(records)} gaps from {n_sessions} sessions ({never} never came back, {zero} of 0 s); "
        f"policy: ttl [{p.min_ttl:g}, {p.max_ttl:g}] s, kv_cost_weight {p.kv_cost_weight:g}, "
        f"recompute {p.recompute_s_per_token:g} s/token (quadratic at {p.recompute_quadratic_tokens}), "
        f"half-life {p.half_life_obs:g} obs"
    )
    click.echo(format_report(scores, error, header))
    by_segment = segment_scores(gaps, settings, segments, fixed_ttls=(min(fixed, key=lambda t: abs(t - 30)),)) if segments > 0 else []
    if by_segment:
        click.echo(format_segments(by_segment))
    if json_out:
        oracle = next(s for s in scores if s.name.startswith("oracle")).leased_token_s
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(
            json.dumps(
                {
                    "source": source,
                    "gaps": len(records),
                    "sessions": n_sessions,
                    "never_returned": never,
                    "policy_settings": p.model_dump(),
                    "prediction_error": error,
                    "policies": [s.as_dict(oracle) for s in scores],
                    "segments": [
                        {"segment": label, "policies": [s.as_dict(oracle) for s in part]} for label, part in by_segment
                    ],
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":  # python -m sidecar_tools.gaps.gap_replay (until the sglang-sidecar group has it)
    gap_replay()
