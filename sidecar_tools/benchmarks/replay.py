"""Closed-loop agent-trace replay against SGLang /generate, an OpenAI-compatible endpoint or an
Anthropic Messages endpoint (the sidecar's /v1/messages).

Every session runs as its own task: send the whole conversation, stream the reply, wait the tool
gap, append reply + next tool result, repeat. A session starts at its ``start_s`` after the run
starts (optionally waiting for one of K client-side slots). Saves ``<out>/<name>.json`` (config, summary, engine counter deltas) and
``<out>/<name>-turns.csv``.

    python -m sidecar_tools.benchmarks.replay --mode generate --preset reference --url http://127.0.0.1:30000 \\
        --lease-ttl 30 --close-sessions --name ttl30 --out benchmarks/results/runs
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import aiohttp
import click

from sidecar_tools.benchmarks import promtext
from sidecar_tools.benchmarks.clients import AnthropicClient, BaseClient, ClientOptions, GenerateClient, OpenAIClient
from sidecar_tools.benchmarks.records import TurnRecord, save_run, summarize
from sidecar_tools.benchmarks.textgen import TextSource
from sidecar_tools.benchmarks.traces import PRESETS, Session, Trace, build_config, generate, read_any
from sidecar_tools.progress import progress_bar

_METRIC_NOISE = ("python_", "process_")


async def run_session(client: Any, session: Session, records: list[TurnRecord],
                      slots: asyncio.Semaphore | None, stop_on_error: bool,
                      on_turn: Callable[[TurnRecord], None] | None = None) -> None:
    if session.start_s > client.now():
        await asyncio.sleep(session.start_s - client.now())
    queued = time.monotonic()
    async with slots if slots is not None else contextlib.nullcontext():
        client_wait = time.monotonic() - queued
        conv = client.start(session)
        try:
            for k, rnd in enumerate(session.rounds):
                last = k == len(session.rounds) - 1
                rec = TurnRecord(session=client.session_id(session), turn=k,
                                 client_wait_s=client_wait if k == 0 else 0.0,
                                 history_tokens=client.history_tokens(conv),
                                 tool_wait_s=0.0 if last else rnd.tool_wait_s)
                records.append(rec)
                await client.turn(conv, k, rnd, rec)
                if on_turn is not None:
                    on_turn(rec)
                if not rec.ok and stop_on_error:
                    break
                if not last and rnd.tool_wait_s > 0:
                    await asyncio.sleep(rnd.tool_wait_s)
        finally:
            await asyncio.shield(client.finish(session))


async def scrape_all(http: aiohttp.ClientSession, urls: dict[str, str]) -> dict[str, dict[str, float] | None]:
    out = {}
    for role, url in urls.items():
        samples = await promtext.scrape(http, url)
        out[role] = {k: v for k, v in samples.items() if not k.startswith(_METRIC_NOISE)} if samples else None
    return out


async def flush_cache(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.post(url.rstrip("/") + "/flush_cache", timeout=aiohttp.ClientTimeout(total=60)) as r:
            await r.read()
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError, OSError):
        return False


async def detect_model(http: aiohttp.ClientSession, url: str) -> str:
    try:
        async with http.get(url.rstrip("/") + "/v1/models", timeout=aiohttp.ClientTimeout(total=10)) as r:
            data = await r.json()
            return data["data"][0]["id"]
    except (aiohttp.ClientError, TimeoutError, OSError, KeyError, IndexError, ValueError):
        return "default"


async def replay(trace: Trace, *, url: str, mode: str, opts: ClientOptions, engine_url: str | None = None,
                 max_concurrent_sessions: int | None = None, time_limit_s: float = 240.0,
                 stop_on_error: bool = False, tokenizer: str | None = None, flush: bool = False,
                 on_turn: Callable[[TurnRecord], None] | None = None,
                 ) -> tuple[dict[str, Any], list[TurnRecord]]:
    """Run the trace; return (run dict without name/command, per-turn records). ``on_turn`` hears
    of every turn that ended (a progress bar)."""
    # reuse idle connections for less than SGLang's 5 s keep-alive: a turn sent after a 5 s tool
    # gap must not race the server closing its connection (a spurious 'Server disconnected')
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=3.0)
    async with aiohttp.ClientSession(connector=connector) as http:
        if flush:
            await flush_cache(http, engine_url or url)
        if mode != "generate" and opts.model == "default":
            opts.model = await detect_model(http, url)
        metric_urls = {"endpoint": url, **({"engine": engine_url} if engine_url else {})}
        before = await scrape_all(http, metric_urls)
        client: BaseClient
        if mode == "generate":
            client = GenerateClient(http, url, trace, opts)
        else:
            agent = AnthropicClient if mode == "anthropic" else OpenAIClient
            client = agent(http, url, trace, opts, text=TextSource(tokenizer))
        slots = asyncio.Semaphore(max_concurrent_sessions) if max_concurrent_sessions else None
        records: list[TurnRecord] = []
        t0 = time.monotonic()
        client.t0 = t0
        tasks = [asyncio.create_task(run_session(client, s, records, slots, stop_on_error, on_turn))
                 for s in trace.sessions]
        done, pending = await asyncio.wait(tasks, timeout=time_limit_s)
        makespan = time.monotonic() - t0
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        crashed = [repr(t.exception()) for t in done if t.exception() is not None]
        for rec in records:
            if rec.end_s is None:
                rec.error = rec.error or "cancelled: time limit"
        after = await scrape_all(http, metric_urls)
    metrics = {role: promtext.delta(before[role] or {}, after[role]) if after.get(role) else None
               for role in metric_urls}
    planned = sum(len(s.rounds) for s in trace.sessions)
    summary = summarize(records, makespan, planned)
    summary["timed_out"] = bool(pending)
    summary["sessions"] = len(trace.sessions)
    summary["sessions_unfinished"] = len(pending)
    if crashed:
        summary["session_crashes"] = crashed[:5]
    run = {
        "summary": summary,
        "config": {"mode": mode, "url": url, "engine_url": engine_url,
                   "lease_ttl_s": opts.lease_ttl_s, "close_sessions": opts.close_sessions,
                   "send_session_id": opts.send_session_id, "body_session_id": opts.body_session_id,
                   "max_concurrent_sessions": max_concurrent_sessions, "time_limit_s": time_limit_s,
                   "request_timeout_s": opts.request_timeout_s, "salt": opts.salt, "model": opts.model,
                   "tools": opts.tools, "tokenizer": tokenizer, "flush_cache": flush},
        "trace": {"name": trace.name, "stats": trace.stats(), "meta": trace.meta},
        "metrics": metrics,
    }
    return run, sorted(records, key=lambda r: (r.send_s, r.session, r.turn))


def load_trace(trace_path: str | None, preset: str, seed: int | None, sessions: int | None,
               turns: int | None, tool_wait: float | None) -> Trace:
    """The trace of the replay CLIs: a trace file, or a preset drawn on the spot; ``tool_wait`` fixes
    every gap. A file no reader can read ends the command with the reader's message."""
    if trace_path:
        try:
            trace = read_any(trace_path)
        except (ValueError, OSError) as exc:
            raise click.ClickException(str(exc)) from None
        if sessions or turns:
            trace = trace.head(sessions, turns)
    else:
        trace = generate(build_config(preset, seed, sessions, turns))
    return trace.with_tool_wait(tool_wait) if tool_wait is not None else trace


def command_line(ctx: click.Context) -> str:
    """The exact invocation, rebuilt from the options the user set (works under CliRunner too)."""
    parts = ["python", "-m", "sidecar_tools.benchmarks.replay"]
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name)
        if source in (None, click.core.ParameterSource.DEFAULT):
            continue
        value = ctx.params[param.name]
        opt = param.opts[0] if not (param.secondary_opts and value is False) else param.secondary_opts[0]
        if getattr(param, "is_flag", False):
            parts.append(opt)
        elif value is not None:
            parts += [opt, str(value)]
    return shlex.join(parts)


def print_summary(name: str, s: dict[str, Any]) -> None:
    share = s["recomputed_share"]
    click.echo(
        f"{name}: makespan {s['makespan_s']:.1f} s | recomputed history "
        f"{'-' if share is None else f'{100 * share:.1f} %'} | TTFT p50/p90/p99 "
        f"{s['ttft_p50_s']}/{s['ttft_p90_s']}/{s['ttft_p99_s']} s | turns ok {s['turns_ok']}/{s['turns_planned']}"
        f" | failed {s['turns_failed']}{' | TIMED OUT' if s['timed_out'] else ''}"
        + (f" | errors {json.dumps(s['errors'])}" if s["errors"] else "")
    )


@click.command(context_settings={"show_default": True})
@click.option("--url", default="http://127.0.0.1:30000", help="SGLang (generate/openai) or sidecar (openai/anthropic) base URL.")
@click.option("--mode", type=click.Choice(["generate", "openai", "anthropic"]), default="generate",
              help="generate: SGLang /generate with ids; openai: /v1/chat/completions; anthropic: /v1/messages.")
@click.option("--trace", "trace_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Trace file (ours, TraceLab round trace or CSV export, LMCache, OpenAI chats). Default: draw --preset.")
@click.option("--preset", type=click.Choice(sorted(PRESETS)), default="reference")
@click.option("--seed", type=int, default=None, help="Preset seed (default: the preset's).")
@click.option("--sessions", type=int, default=None, help="Only the first N sessions / N sessions.")
@click.option("--turns", type=int, default=None, help="Only the first N rounds / N rounds per session.")
@click.option("--tool-wait", type=float, default=None, help="Fixed tool gap in s (default: the trace's).")
@click.option("--lease-ttl", type=float, default=None, help="generate: custom_params.session_lease_ttl_s.")
@click.option("--close-sessions", is_flag=True, help="POST /close_session when a session ends.")
@click.option("--session-id/--no-session-id", default=True,
              help="generate: top-level session_id; openai/anthropic: X-Session-Id header.")
@click.option("--body-session-id", is_flag=True, help="openai: also send session_id in the body (SGLang's API).")
@click.option("--max-concurrent-sessions", type=int, default=None, help="Client-side cap on live sessions.")
@click.option("--time-limit", type=float, default=240.0, help="Wall-clock limit of the run (s).")
@click.option("--request-timeout", type=float, default=300.0, help="Limit of one request (s).")
@click.option("--on-error", type=click.Choice(["continue", "stop"]), default="continue",
              help="After a failed turn the session goes on or stops.")
@click.option("--engine-url", default=None, help="SGLang URL whose /metrics to diff too (behind a sidecar).")
@click.option("--model", default="default", help="openai/anthropic: model name (default: first of /v1/models).")
@click.option("--tokenizer", default=None, help="openai/anthropic: tokenizer dir to size texts exactly.")
@click.option("--tools/--no-tools", default=True, help="openai/anthropic: send tool definitions.")
@click.option("--salt", default="", help="Makes session ids and content unique to this run.")
@click.option("--flush-cache", is_flag=True, help="POST /flush_cache to the engine before the run.")
@click.option("--name", default=None, help="Run name (file stem). Default: <mode>-<trace>-<gap>.")
@click.option("--out", default="benchmarks/results/runs", type=click.Path(file_okay=False))
@click.option("--save-trace", is_flag=True, help="Also save the replayed trace as <out>/<name>-trace.jsonl.")
def main(url: str, mode: str, trace_path: str | None, preset: str, seed: int | None, sessions: int | None,
         turns: int | None, tool_wait: float | None, lease_ttl: float | None, close_sessions: bool,
         session_id: bool, body_session_id: bool, max_concurrent_sessions: int | None, time_limit: float,
         request_timeout: float, on_error: str, engine_url: str | None, model: str, tokenizer: str | None,
         tools: bool, salt: str, flush_cache: bool, name: str | None, out: str, save_trace: bool) -> None:
    """Replay agent sessions in closed loop and record makespan, recompute and TTFT."""
    if lease_ttl is not None and mode != "generate":
        raise click.UsageError("--lease-ttl needs --mode generate (behind the sidecar, leases are its job)")
    trace = load_trace(trace_path, preset, seed, sessions, turns, tool_wait)
    name = name or f"{mode}-{trace.name}-{'trace' if tool_wait is None else f'{tool_wait:g}s'}"
    opts = ClientOptions(lease_ttl_s=lease_ttl, send_session_id=session_id, body_session_id=body_session_id,
                         close_sessions=close_sessions, request_timeout_s=request_timeout, salt=salt,
                         model=model, tools=tools)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    with progress_bar(sum(len(s.rounds) for s in trace.sessions), name) as bar:
        run, records = asyncio.run(replay(
            trace, url=url, mode=mode, opts=opts, engine_url=engine_url,
            max_concurrent_sessions=max_concurrent_sessions, time_limit_s=time_limit,
            stop_on_error=on_error == "stop", tokenizer=tokenizer, flush=flush_cache, on_turn=lambda rec: bar.update()))
    run = {"name": name, "started_at": started, "command": command_line(click.get_current_context()), **run}
    path = save_run(out, name, run, records)
    if save_trace:
        from sidecar_tools.benchmarks.traces import save_jsonl
        save_jsonl(trace, Path(out) / f"{name}-trace.jsonl")
    print_summary(name, run["summary"])
    click.echo(f"saved {path}")


if __name__ == "__main__":
    main()
