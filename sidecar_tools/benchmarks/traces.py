"""Agent-session traces: one model shared by the replay client, the simulator and the tests.

A trace is a list of sessions; a session is a list of rounds (one model call each). Round ``k``
appends ``append_tokens`` new input tokens (round 0: the shared system prompt plus the task; later
rounds: the tool result), the model replies with ``output_tokens`` tokens, then the agent's tool
runs for ``tool_wait_s`` before round ``k+1``. The whole conversation is resent every round, so the
prompt of round ``k`` is everything appended and replied before it plus its own append.

Sources: a seeded synthetic generator (presets ``default`` = prior-art coding-agent statistics,
``reference`` = the GPU README's reference workload), TraceLab round CSV/JSONL, OpenAI-message
JSONL. Saved as JSONL: one header line, then one session per line.

CLI: ``python -m sidecar_tools.benchmarks.traces generate|convert|stats`` (see ``--help``).
"""

from __future__ import annotations

import csv
import json
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterable

import click
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

FORMAT = "agent-trace-v1"


# --------------------------------------------------------------------------------------------
# Model


class Round(BaseModel):
    """One model call of a session."""

    model_config = ConfigDict(extra="forbid")

    append_tokens: int = Field(ge=0, description="New input tokens appended before this call.")
    output_tokens: int = Field(ge=1, description="Tokens the model generates (ignore_eos).")
    tool_wait_s: float = Field(0.0, ge=0, description="Gap after the reply, before the next call.")
    prefix_len: int | None = Field(None, description="Recorded reused prefix (TraceLab), if known.")
    messages: list[dict[str, Any]] | None = Field(
        None, description="Recorded messages appended before this call (OpenAI format), if known."
    )
    reply: dict[str, Any] | None = Field(None, description="Recorded assistant message, if known.")


class Session(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_id: str
    start_s: float = Field(0.0, ge=0, description="Offset of the session's first call (open loop).")
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
# Readers for recorded traces


TRACELAB_COLUMNS = ("session_id", "round_idx", "prefix_len", "input_len", "output_len", "tool_wait_after_ms")


def _tracelab_rows(path: Path) -> Iterable[dict[str, Any]]:
    if path.suffix in (".jsonl", ".ndjson"):
        with path.open() as f:
            for ln in f:
                if ln.strip():
                    yield json.loads(ln)
    else:
        with path.open(newline="") as f:
            yield from csv.DictReader(f)


def read_tracelab(path: str | Path, name: str | None = None) -> Trace:
    """TraceLab's replay rows: input_len = fresh tokens this round, prefix_len = reused context.

    Sessions keep first-appearance order; rounds are sorted by round_idx. A round-0 prefix the
    recording never contained (the chat began before the recording) is folded into the first
    append, so the replay sends it as new input.
    """
    path = Path(path)
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in _tracelab_rows(path):
        sid = str(row.get("session_id") or row.get("id") or "")
        if not sid:
            raise ValueError(f"{path}: a row has no session_id")
        missing = [c for c in TRACELAB_COLUMNS[1:] if row.get(c) in (None, "")]
        if missing:
            raise ValueError(f"{path}: session {sid} row lacks {missing}")
        grouped.setdefault(sid, []).append(row)
    sessions = []
    for sid, rows in grouped.items():
        rows.sort(key=lambda r: int(r["round_idx"]))
        rounds = []
        for k, row in enumerate(rows):
            prefix, fresh = int(float(row["prefix_len"])), int(float(row["input_len"]))
            rounds.append(Round(
                append_tokens=fresh + (prefix if k == 0 else 0),
                output_tokens=max(1, int(float(row["output_len"]))),
                tool_wait_s=max(0.0, float(row["tool_wait_after_ms"]) / 1000.0),
                prefix_len=prefix,
            ))
        sessions.append(Session(session_id=sid, rounds=rounds))
    return Trace(name=name or path.stem, sessions=sessions, meta={"source": str(path), "reader": "tracelab"})


def approx_token_count(text: str) -> int:
    """About 4 characters per token: used when no tokenizer is given."""
    return max(1, (len(text) + 3) // 4) if text else 0


def _message_text(msg: dict[str, Any]) -> str:
    content = msg.get("content") or ""
    if isinstance(content, list):  # OpenAI content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    calls = msg.get("tool_calls") or []
    args = "".join(json.dumps(c.get("function", c)) for c in calls)
    return str(content) + args


def _timestamp(msg: dict[str, Any]) -> float | None:
    for key in ("timestamp", "ts", "created", "time"):
        v = msg.get(key)
        if v is None:
            continue
        if isinstance(v, (int, float)):
            return float(v) / (1000.0 if v > 1e11 else 1.0)  # ms or s since epoch
        try:
            return datetime.fromisoformat(str(v).replace("Z", "+00:00")).timestamp()
        except ValueError:
            continue
    return None


_MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")


def read_openai_jsonl(path: str | Path, count_tokens: Callable[[str], int] = approx_token_count,
                      default_tool_wait_s: float = 0.5, name: str | None = None) -> Trace:
    """One conversation per line: ``{"messages": [...], "session_id"?: ...}`` or a bare list.

    Every assistant message closes a round; the messages since the previous one are that round's
    append. With per-message timestamps (``timestamp``/``ts``/``created``: epoch s/ms or ISO), the
    gap after a round is the time from the assistant message to the last message of the next
    append; otherwise ``default_tool_wait_s``. The system prompt shared by all conversations (if
    identical) becomes ``shared_prefix_tokens``.
    """
    path = Path(path)
    sessions, system_prompts = [], []
    with path.open() as f:
        for lineno, ln in enumerate(f):
            if not ln.strip():
                continue
            obj = json.loads(ln)
            messages = obj if isinstance(obj, list) else obj.get("messages") or obj.get("trajectory")
            if not isinstance(messages, list):
                raise ValueError(f"{path}:{lineno + 1}: no messages list")
            sid = str(obj.get("session_id") or obj.get("id") or obj.get("trajectory_id") or f"conv-{lineno:05d}") \
                if isinstance(obj, dict) else f"conv-{lineno:05d}"
            system_prompts.append(next((m.get("content") for m in messages if m.get("role") == "system"), None))
            sessions.append(_conversation_session(sid, messages, count_tokens, default_tool_wait_s))
    sessions = [s for s in sessions if s.rounds]
    shared = 0
    if system_prompts and system_prompts[0] and all(p == system_prompts[0] for p in system_prompts):
        shared = count_tokens(str(system_prompts[0]))
    return Trace(name=name or path.stem, shared_prefix_tokens=shared, sessions=sessions,
                 meta={"source": str(path), "reader": "openai-jsonl"})


def _conversation_session(sid: str, messages: list[dict[str, Any]], count_tokens: Callable[[str], int],
                          default_gap: float) -> Session:
    rounds: list[Round] = []
    pending: list[dict[str, Any]] = []
    last_reply_ts: float | None = None
    for msg in messages:
        if msg.get("role") != "assistant":
            pending.append(msg)
            continue
        if rounds and last_reply_ts is not None:
            ts = [t for t in (_timestamp(m) for m in pending) if t is not None]
            if ts:
                rounds[-1].tool_wait_s = max(0.0, max(ts) - last_reply_ts)
        rounds.append(Round(
            append_tokens=sum(count_tokens(_message_text(m)) for m in pending),
            output_tokens=max(1, count_tokens(_message_text(msg))),
            tool_wait_s=default_gap,
            messages=[{k: m[k] for k in _MESSAGE_KEYS if k in m} for m in pending],
            reply={k: msg[k] for k in _MESSAGE_KEYS if k in msg},
        ))
        last_reply_ts = _timestamp(msg)
        pending = []
    if rounds:
        rounds[-1].tool_wait_s = 0.0
    return Session(session_id=sid, rounds=rounds)


def read_any(path: str | Path, **kwargs: Any) -> Trace:
    """Pick the reader by content: our JSONL, TraceLab rows (CSV/JSONL), or OpenAI conversations."""
    path = Path(path)
    if path.suffix == ".csv":
        return read_tracelab(path)
    with path.open() as f:
        first = json.loads(next(ln for ln in f if ln.strip()))
    if isinstance(first, dict) and first.get("format") == FORMAT:
        return load_jsonl(path)
    if isinstance(first, dict) and "round_idx" in first:
        return read_tracelab(path)
    return read_openai_jsonl(path, **kwargs)


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
@click.option("--default-tool-wait", type=float, default=0.5, show_default=True,
              help="Gap for OpenAI conversations without timestamps.")
def convert_cmd(source: str, out: str, default_tool_wait: float) -> None:
    """Read TraceLab CSV/JSONL or OpenAI-message JSONL and save our JSONL."""
    trace = read_tracelab(source) if source.endswith(".csv") else read_any(source, default_tool_wait_s=default_tool_wait)
    save_jsonl(trace, out)
    click.echo(json.dumps(trace.stats(), indent=1))


@cli.command("stats")
@click.argument("source", type=click.Path(exists=True, dir_okay=False))
def stats_cmd(source: str) -> None:
    click.echo(json.dumps(read_any(source).stats(), indent=1))


if __name__ == "__main__":
    cli()
