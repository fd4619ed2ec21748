"""Hostile-load benchmark: do huge and compressed prompts stall the agents the sidecar serves?

Four processes on loopback: the simulated engine (``sglang-sidecar simulate --serve``, SGLang's
real radix cache on CPU, 173,200 KV tokens), the sidecar with ``configs/coding-agent.toml``, the
attackers (their own process, so that sending ~70 MB never stalls the agents' client) and this
client. The client runs ``--agents`` streaming agents in multi-turn loops (the load test's
agents: system prompt, tool calls, tool results, think time) and probes ``/health`` every 50 ms.
After ``--baseline`` seconds it attacks, all at once:

* one client sends a ``--big-mb`` MB prompt,
* one sends the same prompt gzip-compressed (``Content-Encoding: gzip``),
* ``--small-clients`` clients send a ``--small-mb`` MB prompt each (different texts);

then the agents go on for ``--after`` seconds. ``--attack`` picks other attacks (issue 27):

* ``tool-args``: ``--small-clients`` chat bodies whose history carries a ``--small-mb`` MB tool-call argument,
* ``many-messages``: ``--small-clients`` bodies of 7,000 short messages each,
* ``system``: ``--small-clients`` ``--small-mb`` MB system prompts on /v1/messages and as many on count_tokens,
* ``connections``: ``--small-clients`` idle connections (no headers) held for ``--attack-window`` seconds.
 It reports the agents' TTFT in the baseline and
during the attack (from its first request until its last answer + 1 s), the ``/health`` latency,
what the attackers got back, and the sidecar's RSS before, at its peak and at the end.

    python -m sidecar_tools.benchmarks.hostile_load --out benchmarks/results/hostile [--name run-1]

Targets (issue "hostile inputs", point 1): the agents' added TTFT p99 and /health p99 under 50 ms,
and RSS back within 10 % afterwards. Every process is stopped at the end, also on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import click

from sidecar_tools.benchmarks.load_benchmark import (
    HOST,
    LOAD_MODEL,
    REPO_ROOT,
    Agents,
    LoadConfig,
    Proc,
    Sampler,
    _free_port,
    _wait_http,
    build_workload,
    dist_ms,
    machine_info,
    pct,
)

PRESET = "configs/coding-agent.toml"
WORDS = ("the", "agent", "reads", "file", "error", "test", "passes", "function", "returns", "value", "module",
         "import", "class", "def", "self", "data", "list", "dict", "cache", "token", "prompt", "session")


def prompt_text(n_bytes: int, seed: int) -> str:
    """Prose-like text of about ``n_bytes`` (random words and line breaks; compresses as text does)."""
    rng = random.Random(seed)
    words, size = [], 0
    while size < n_bytes:
        word = rng.choice(WORDS) + ("\n" if rng.random() < 0.08 else " ")
        words.append(word)
        size += len(word)
    return "".join(words)


def tool_args_body(text: str) -> bytes:
    history = [{"role": "user", "content": "write it"},
               {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
                   "name": "write_file", "arguments": json.dumps({"path": "a.txt", "text": text})}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "ok"}, {"role": "user", "content": "now?"}]
    return json.dumps({"model": LOAD_MODEL, "messages": history, "max_tokens": 16}).encode()


def many_messages_body(seed: int, n: int = 7000) -> bytes:
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{seed}-{i}"} for i in range(n - 1)]
    return json.dumps({"model": LOAD_MODEL, "messages": messages + [{"role": "user", "content": "end"}], "max_tokens": 16}).encode()


def system_body(text: str) -> bytes:
    return json.dumps({"model": LOAD_MODEL, "system": text, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}).encode()


async def hold_connections(url: str, n: int, seconds: float, out: list[dict]) -> None:
    """``n`` connections that never send a header, each held up to ``seconds`` or until closed."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, n + 256)), hard))  # the attacker's own files

    async def one(i: int) -> None:
        start = time.time()
        row: dict[str, Any] = {"name": f"idle connection #{i}", "bytes_sent": 0, "started": start}
        try:
            reader, writer = await asyncio.open_connection(host, int(port))
            data = await asyncio.wait_for(reader.read(200), seconds)
            row["status"] = int(data[9:12]) if data.startswith(b"HTTP/1.1 ") else "closed"
            writer.close()
        except asyncio.TimeoutError:
            row["status"] = "held"
        except OSError as exc:
            row["error"] = type(exc).__name__
        row["seconds"] = round(time.time() - start, 3)
        out.append(row)

    await asyncio.gather(*(one(i) for i in range(n)))


def chat_body(text: str) -> bytes:
    return json.dumps({"model": LOAD_MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 16}).encode()


async def attack(url: str, body: bytes, gzipped: bool, name: str, out: list[dict], path: str = "/v1/chat/completions") -> None:
    headers = {"Content-Type": "application/json"}
    if gzipped:
        headers["Content-Encoding"] = "gzip"
    start = time.time()
    row: dict[str, Any] = {"name": name, "bytes_sent": len(body), "started": start}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
            async with http.post(url + path, data=body, headers=headers) as resp:
                row["status"] = resp.status
                with contextlib.suppress(Exception):
                    row["code"] = (await resp.json()).get("error", {}).get("code")
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"[:200]
    row["seconds"] = round(time.time() - start, 3)
    out.append(row)


def _attacker_main(url: str, cfg_json: str, out_path: str) -> None:
    """The attackers' own process (so that writing ~70 MB of bodies never stalls the agents'
    client): prepare the bodies, print READY, wait for a line on stdin, attack, write the answers."""
    cfg = json.loads(cfg_json)
    kind, n = cfg.get("attack", "bodies"), cfg["small_clients"]
    if kind != "bodies":
        if kind == "tool-args":
            bodies = [("/v1/chat/completions", tool_args_body(prompt_text(int(cfg["small_mb"] * 1e6), 100 + i))) for i in range(n)]
        elif kind == "many-messages":
            bodies = [("/v1/chat/completions", many_messages_body(i)) for i in range(n)]
        elif kind == "system":
            texts = [prompt_text(int(cfg["small_mb"] * 1e6), 100 + i) for i in range(n)]
            bodies = [(p, system_body(t)) for t in texts for p in ("/v1/messages", "/v1/messages/count_tokens")]
        else:
            bodies = []
        print(f"READY {kind} {len(bodies)} bodies", flush=True)
        sys.stdin.readline()
        results: list[dict] = []

        async def go_kind() -> None:
            if kind == "connections":
                await hold_connections(url, n, cfg["attack_window"], results)
            else:
                await asyncio.gather(*(attack(url, b, False, f"{kind} #{i} {p}", results, p) for i, (p, b) in enumerate(bodies)))

        asyncio.run(go_kind())
        Path(out_path).write_text(json.dumps({"requests": results, "big_gzip_bytes": 0}))
        return
    block = prompt_text(4096, 1)  # repeated: it compresses as the did (50 MB -> ~0.1-0.3 MB)
    big = chat_body(block * (cfg["big_mb"] * 1_000_000 // len(block)))
    big_gz = gzip.compress(big, 9)
    smalls = [chat_body(prompt_text(int(cfg["small_mb"] * 1_000_000), 100 + i)) for i in range(cfg["small_clients"])]
    print(f"READY big {len(big)} gzip {len(big_gz)} small {len(smalls[0])}", flush=True)
    sys.stdin.readline()
    results: list[dict] = []

    async def go() -> None:
        await asyncio.gather(
            attack(url, big, False, f"{cfg['big_mb']} MB prompt", results),
            attack(url, big_gz, True, f"{cfg['big_mb']} MB prompt, gzip", results),
            *(attack(url, body, False, f"{cfg['small_mb']} MB prompt #{i}", results) for i, body in enumerate(smalls)),
        )

    asyncio.run(go())
    Path(out_path).write_text(json.dumps({"requests": results, "big_gzip_bytes": len(big_gz)}))


async def probe_health(url: str, stop: asyncio.Event, out: list[tuple[float, float, int]]) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        while not stop.is_set():
            start = time.time()
            try:
                async with http.get(url + "/health") as resp:
                    await resp.read()
                    status = resp.status
            except (aiohttp.ClientError, asyncio.TimeoutError):
                status = 0
            out.append((start, time.time() - start, status))
            await asyncio.sleep(0.05)


def _phase(turns, start: float, end: float) -> dict[str, Any]:
    inside = [t for t in turns if start <= t.sent < end]
    ok = [t for t in inside if t.ok and t.first is not None]
    return {"turns": len(inside), "errors": len(inside) - len(ok), "ttft_ms": dist_ms([t.first - t.sent for t in ok])}


def _health(probes, start: float, end: float) -> dict[str, Any]:
    inside = [(lat, status) for t, lat, status in probes if start <= t < end]
    return {"probes": len(inside), "not_200": sum(status != 200 for _, status in inside),
            "latency_ms": dist_ms([lat for lat, _ in inside])}


def _rss(series, key: str, start: float, end: float) -> list[float]:
    return [row[key] for row in series if start <= row["wall"] < end and key in row]


async def run(cfg: dict[str, Any], tokenizer_dir: str, log) -> dict[str, Any]:
    load = LoadConfig(sessions=cfg["agents"], duration=cfg["baseline"] + cfg["attack_window"] + cfg["after"], ramp=3.0,
                      drain=10.0, think=0.5, turns=10, system_tokens=1000, tool_tokens=100)
    work = build_workload(load, tokenizer_dir)
    procs: list[Proc] = []
    attacker: subprocess.Popen | None = None
    try:
        engine_port, sidecar_port = _free_port(), _free_port()
        engine = Proc("engine", [sys.executable, "-m", "sidecar", "simulate", "--serve", "--host", HOST, "--port",
                                 str(engine_port), "--policy", "session_ttl", "--kv-tokens", "173200"], None)
        procs.append(engine)
        engine_url = f"http://{HOST}:{engine_port}"
        await _wait_http(engine_url + "/health", engine, timeout=180)
        sidecar = Proc("sidecar", [sys.executable, "-m", "sidecar", "serve", "--config", PRESET, "--sglang-url", engine_url,
                                   "--host", HOST, "--port", str(sidecar_port), "--tokenizer", tokenizer_dir,
                                   "--model-name", LOAD_MODEL, "--log-level", "warning"], None)
        procs.append(sidecar)
        url = f"http://{HOST}:{sidecar_port}"
        await _wait_http(url + "/health", sidecar, timeout=180)

        log("preparing the attack bodies (in the attackers' process)")
        answers = Path(tempfile.mkdtemp(prefix="hostile-")) / "answers.json"
        code = (f"from sidecar_tools.benchmarks.hostile_load import _attacker_main; "
                f"_attacker_main({url!r}, {json.dumps(cfg)!r}, {str(answers)!r})")
        attacker = subprocess.Popen([sys.executable, "-c", code], cwd=REPO_ROOT, stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True)
        ready = await asyncio.get_running_loop().run_in_executor(None, attacker.stdout.readline)
        if not ready.startswith("READY"):
            raise RuntimeError(f"the attackers did not start: {ready!r}")
        log(ready.strip())

        sampler = Sampler({"sidecar": sidecar.ps}, interval=0.5)
        sampler.start()
        stop = asyncio.Event()
        probes: list[tuple[float, float, int]] = []
        prober = asyncio.create_task(probe_health(url, stop, probes))
        agents = Agents(load, work, "sidecar", url)
        t0 = time.time()
        agents_task = asyncio.create_task(agents.run())
        await asyncio.sleep(load.ramp + cfg["baseline"])
        log("attacking")
        attack_start = time.time()
        attacker.stdin.write("go\n")
        attacker.stdin.flush()
        await asyncio.get_running_loop().run_in_executor(None, attacker.wait)
        answered = json.loads(answers.read_text())
        results, big_gzip_bytes = answered["requests"], answered["big_gzip_bytes"]
        attack_end = max(r["started"] + r["seconds"] for r in results)
        log(f"attack answered in {attack_end - attack_start:.1f} s")
        await agents_task
        end = time.time()
        stop.set()
        await prober
        await sampler.stop()
    finally:
        for p in reversed(procs):
            p.stop()
        if attacker is not None and attacker.poll() is None:
            attacker.kill()
            attacker.wait(5)

    for row in sampler.series:
        row["wall"] = t0 + row["t"]
    baseline_window = (t0 + load.ramp, attack_start)
    attack_window = (attack_start, attack_end + 1.0)
    after_window = (attack_end + 1.0, end)
    phases = {name: _phase(agents.turns, *w) for name, w in
              (("baseline", baseline_window), ("attack", attack_window), ("after", after_window))}
    health = {name: _health(probes, *w) for name, w in
              (("baseline", baseline_window), ("attack", attack_window), ("after", after_window))}
    rss_before = _rss(sampler.series, "sidecar_rss_mb", attack_start - 5, attack_start)
    rss_peak = max(_rss(sampler.series, "sidecar_rss_mb", attack_start, end) or [0])
    rss_end = _rss(sampler.series, "sidecar_rss_mb", end - 5, end)
    before = sum(rss_before) / max(1, len(rss_before))
    final = sum(rss_end) / max(1, len(rss_end))
    b, a = phases["baseline"]["ttft_ms"], phases["attack"]["ttft_ms"]
    added_p99 = None if a["p99"] is None or b["p99"] is None else round(a["p99"] - b["p99"], 3)
    server_errors = sum(isinstance(r.get("status"), int) and r["status"] >= 500 and r.get("code") != "too_many_connections"
                        for r in results)
    statuses: dict[str, int] = {}
    for row in results:
        key = f"{row.get('status', 'error')} {row.get('code') or ''}".strip()
        statuses[key] = statuses.get(key, 0) + 1
    attack_seconds = [row["seconds"] for row in results]
    return {
        "config": cfg,
        "machine": machine_info(),
        "phases": phases,
        "health": health,
        "added_ttft_p99_ms": added_p99,
        "rss_mb": {"before": round(before, 1), "peak": rss_peak, "end": round(final, 1),
                   "end_vs_before": round(final / before - 1, 4) if before else None},
        "attack": {"answers": statuses, "seconds_p50": pct(attack_seconds, 50), "seconds_max": max(attack_seconds),
                   "big_gzip_bytes": big_gzip_bytes, "requests": sorted(results, key=lambda r: r["started"])},
        "targets": {
            "added_ttft_p99_under_50ms": added_p99 is not None and added_p99 < 50,
            "health_p99_under_50ms": (health["attack"]["latency_ms"]["p99"] or 0) < 50,
            "rss_back_within_10pct": before > 0 and final <= before * 1.10,
            "agents_no_errors": all(p["errors"] == 0 for p in phases.values()),
            "largest_health_gap_under_100ms": (health["attack"]["latency_ms"]["max"] or 0) < 100,
            "attackers_no_5xx": server_errors == 0,
        },
        "slowest": {  # (seconds from the attack's start, ms): where the tail is
            "health": sorted(((round(t - attack_start, 2), round(lat * 1000, 1)) for t, lat, _ in probes), key=lambda x: -x[1])[:10],
            "ttft": sorted(((round(t.sent - attack_start, 2), round((t.first - t.sent) * 1000, 1)) for t in agents.turns
                            if t.ok and t.first is not None), key=lambda x: -x[1])[:10],
        },
        "rss_series": sampler.series,
    }


@click.command()
@click.option("--agents", type=int, default=20, show_default=True)
@click.option("--baseline", type=float, default=20.0, show_default=True, help="Seconds of agents alone before the attack.")
@click.option("--after", type=float, default=20.0, show_default=True, help="Seconds the agents go on after the attack.")
@click.option("--attack-window", type=float, default=20.0, show_default=True, help="Seconds the agents' loop allows the attack.")
@click.option("--big-mb", type=int, default=50, show_default=True)
@click.option("--small-mb", type=float, default=1.0, show_default=True)
@click.option("--small-clients", type=int, default=50, show_default=True)
@click.option("--attack", type=click.Choice(["bodies", "tool-args", "many-messages", "system", "connections"]),
              default="bodies", show_default=True, help="Which attack (see the module's docstring).")
@click.option("--tokenizer", "tokenizer_dir", default=None, help="Qwen3 tokenizer folder (default: built offline).")
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Write NAME.json here.")
@click.option("--name", default="hostile-load", show_default=True, help="File stem of the result.")
def main(agents, baseline, after, attack_window, big_mb, small_mb, small_clients, attack, tokenizer_dir, out, name):
    cfg = {"attack": attack, "agents": agents, "baseline": baseline, "after": after, "attack_window": attack_window, "big_mb": big_mb,
           "small_mb": small_mb, "small_clients": small_clients, "preset": PRESET}
    with tempfile.TemporaryDirectory(prefix="hostile-tok-") as tmp:
        if tokenizer_dir is None:
            from sidecar_tools.benchmarks.qwen3_tokenizer import build_qwen3_tokenizer

            tokenizer_dir = str(build_qwen3_tokenizer(Path(tmp)))
        result = asyncio.run(run(cfg, tokenizer_dir, lambda msg: click.echo(msg, err=True)))
    summary = {k: result[k] for k in ("phases", "health", "added_ttft_p99_ms", "rss_mb", "targets")}
    summary["attack"] = {k: v for k, v in result["attack"].items() if k != "requests"}
    click.echo(json.dumps(summary, indent=2))
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        path = Path(out) / f"{name}.json"
        path.write_text(json.dumps(result, indent=1) + "\n")
        click.echo(f"wrote {path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path}", err=True)


if __name__ == "__main__":
    main()
