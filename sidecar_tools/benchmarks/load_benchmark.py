"""Bounded load test: many concurrent streaming agent sessions through the sidecar, on loopback.

Three processes: the SGLang stand-in (``sidecar_tools.simulator.standin``: SGLang's HTTP contract,
launched with ``--disable-radix-cache`` so it stays cheap, one decode step for all running requests
per ``--token-delay``, every reply a canned one), the
sidecar (``python -m sidecar serve``), and this client (asyncio + aiohttp). Two phases with the
same agents, prompts, replies and think times, each on a fresh engine:

* ``direct``  - agents speak SGLang's native ``/generate`` (token ids) to the engine;
* ``sidecar`` - agents speak OpenAI ``/v1/chat/completions`` (messages, tools, stream) to the sidecar;
* ``bare``    - agents speak ``/generate`` to a bare Python relay (``bare_relay``: parse, forward,
  stream back) in front of the engine: the floor of a Python hop;
* ``smg``     - agents speak ``/generate`` to smg (``smg launch``, round robin, one worker) in front
  of the engine: a Rust router.

The proxy of the last three (sidecar, relay, smg) gets a CPU of its own (``--pin``); its CPU per
turn is its CPU seconds from the first timed turn to the end over the turns that finished.
``--idle-sessions N`` opens N more sessions first (one turn each, not timed) and leaves them open,
so the per-turn cost can be read against the number of open sessions.

Each agent loops: send the conversation, read the streamed reply (a short text plus a tool call),
think (log-normal, median ``--think``), append reply + tool result, repeat; after ``--turns`` turns
it starts a new session. New turns stop at ``--duration``; turns in flight get ``--drain`` seconds.

Latency the sidecar adds, two ways:
* *per request*: the engine stamps when each request arrived and when its first / last token left;
  "outside" = client-seen latency minus engine-side latency, i.e. transport + everything between
  client and engine. ``added`` = percentile of outside(sidecar) minus the same percentile of
  outside(direct). Independent of how busy the engine was.
* *end to end*: client-seen TTFT / turn latency percentiles, sidecar phase minus direct phase.
A request's clock starts when its body is serialized (the agent's own JSON work is not counted in
either mode). Client and engine share a CPU, so the client does the least work it can in both
modes: the direct client keeps its prompt ids as JSON text (as the sidecar does) and both parse
streamed chunks with pydantic-core; a busier direct client made the baseline slower.
Also: requests/s, errors, and the sidecar's CPU and RSS sampled every second (psutil).

    python -m sidecar_tools.benchmarks.load_benchmark --sessions 500 --duration 60 --out benchmarks/results/load

``--profile FILE`` py-spies the sidecar during its phase (speedscope JSON); ``--uvloop`` runs the
engine and the client on uvloop too (the sidecar itself picks uvloop when it is installed; pass
``--sidecar-arg=--event-loop=asyncio`` to compare); ``LOAD_TEST_SIDECAR_LAUNCH="python3 wrapper.py"`` replaces ``python -m
sidecar`` (e.g. a tracing wrapper). Loopback only; bounded in agents and time; every process is
stopped at the end, also on Ctrl-C. Results: ``benchmarks/results/load/README.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import platform
import random
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import click
from pydantic_core import from_json  # the agents parse every streamed chunk: the cheapest parser, in both modes

from sidecar.id_text import IdText
from sidecar_tools.simulator.server import TIMINGS_PATH

REPO_ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
LOAD_MODEL = "load"  # the model name the sidecar serves (--model-name) and the agents ask for
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command in the repository",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
    }
]
REPLY_TEXT = "Let me look at the failing test first."
REPLY_CALL = '<tool_call>\n{"name": "bash", "arguments": {"cmd": "pytest -x tests/test_api.py -q"}}\n</tool_call>'


@dataclass
class LoadConfig:
    sessions: int = 500  # concurrent agents
    duration: float = 60.0  # seconds of new turns per phase
    drain: float = 15.0  # seconds turns in flight may still finish
    ramp: float = 5.0  # agents start spread over this many seconds
    token_delay: float = 0.04  # seconds between streamed tokens (25 tok/s per stream)
    think: float = 0.5  # median think / tool time between turns (log-normal, sigma 0.5)
    turns: int = 10  # turns per session before the agent starts a new one
    system_tokens: int = 1000
    tool_tokens: int = 100  # tokens of each tool result
    reply_pad_tokens: int = 0  # extra words before the tool call in each reply
    pin: bool = True  # pin the sidecar to its own CPU (the engine + client share the others)
    profile: str | None = None  # py-spy the sidecar during its phase, write this file (speedscope json)
    uvloop: bool = False  # run the sidecar (and the engine) on uvloop's event loop
    sidecar_args: tuple[str, ...] = ()
    seed: int = 0
    idle_sessions: int = 0  # sessions opened (one turn each) before the timed part, then left open


# --------------------------------------------------------------------------- the engine (child process)


def serve_engine(port: int, cfg: LoadConfig, reply_ids: list[int]) -> None:
    """Serve the SGLang stand-in without a radix cache (the real one's bookkeeping would cost more
    CPU than the sidecar under test), every reply the canned one, one step per ``token_delay``. It
    keeps no records but each request's timings (arrival, first token, last token) for the
    per-request latency split. Runs until SIGTERM/SIGINT."""
    from sidecar_tools.simulator.replies import scripted_responder
    from sidecar_tools.simulator.standin import SGLangStandIn

    async def serve():
        engine = SGLangStandIn(responder=scripted_responder(reply_ids), token_delay=cfg.token_delay,
                               disable_radix_cache=True, max_total_num_tokens=10_000_000, context_length=1_000_000,
                               max_running_requests=cfg.sessions, record=False, record_timings=True)
        await engine.start(HOST, port)
        print(f"READY {engine.url}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await engine.stop()

    if cfg.uvloop:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    asyncio.run(serve())


# --------------------------------------------------------------------------- processes


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class Proc:
    """A child process whose output goes to a log file (a full pipe would block it under load)."""

    def __init__(self, name: str, args: list[str], cpus: list[int] | None):
        import psutil

        self.name = name
        self.log = tempfile.NamedTemporaryFile(prefix=f"load-{name}-", suffix=".log", delete=False)
        self.popen = subprocess.Popen(args, cwd=REPO_ROOT, stdout=self.log, stderr=subprocess.STDOUT)
        self.ps = psutil.Process(self.popen.pid)
        if cpus:
            with contextlib.suppress(Exception):
                self.ps.cpu_affinity(cpus)

    @classmethod
    def adopt(cls, name: str, popen: subprocess.Popen) -> "Proc":
        import psutil

        self = cls.__new__(cls)
        self.name, self.popen, self.ps = name, popen, psutil.Process(popen.pid)
        self.log = tempfile.NamedTemporaryFile(prefix=f"load-{name}-", suffix=".log", delete=False)
        return self

    def log_tail(self, n: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return Path(self.log.name).read_text(errors="replace")[-n:]
        return ""

    def stop(self) -> None:
        self.log.close()
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT if self.name == "py-spy" else signal.SIGTERM)  # py-spy saves on SIGINT
            try:
                self.popen.wait(30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)


def _listens(proc: Proc, port: int) -> bool:
    """The port is ours (not a stranger's that grabbed it between _free_port and our bind): the
    process or one of its children (``smg launch`` may serve from a child) listens on it."""
    with contextlib.suppress(Exception):
        for ps in (proc.ps, *proc.ps.children(recursive=True)):
            if any(c.status == "LISTEN" and c.laddr.port == port for c in ps.net_connections(kind="tcp")):
                return True
    return False


def _cpu_seconds(ps) -> float:
    """User + system CPU seconds of a process and its children (as /proc/PID/stat counts them)."""
    total = 0.0
    for p in (ps, *ps.children(recursive=True)):
        with contextlib.suppress(Exception):
            t = p.cpu_times()
            total += t.user + t.system
    return total


async def _wait_http(url: str, proc: Proc, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    port = int(url.rsplit(":", 1)[1].split("/", 1)[0])
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if proc.popen.poll() is not None:
                raise RuntimeError(f"{proc.name} exited: {proc.log_tail()}")
            if not _listens(proc, port):
                await asyncio.sleep(0.1)
                continue
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with http.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{proc.name} did not come up at {url}")


def start_engine(cfg: LoadConfig, reply_ids: list[int], cpus: list[int] | None) -> tuple[Proc, str]:
    port = _free_port()
    code = ("from sidecar_tools.benchmarks.load_benchmark import LoadConfig, serve_engine; "
            f"serve_engine({port}, LoadConfig(**{asdict(cfg)!r}), {reply_ids!r})")
    return Proc("engine", [sys.executable, "-c", code], cpus), f"http://{HOST}:{port}"


def start_sidecar(cfg: LoadConfig, engine_url: str, tokenizer_dir: str, cpus: list[int] | None) -> tuple[Proc, str]:
    port = _free_port()
    launch = [sys.executable, "-m", "sidecar"]
    if cfg.uvloop:
        launch = [sys.executable, "-c", "import asyncio, sys, uvloop; asyncio.set_event_loop_policy(uvloop.EventLoopPolicy()); "
                  "sys.argv[0] = 'sidecar'; from sidecar.cli import main; main()"]
    if os.environ.get("LOAD_TEST_SIDECAR_LAUNCH"):  # debugging aid: e.g. a tracing wrapper around sidecar.cli
        launch = shlex.split(os.environ["LOAD_TEST_SIDECAR_LAUNCH"])
    args = [*launch, "serve", "--sglang-url", engine_url, "--host", HOST, "--port", str(port),
            "--tokenizer", tokenizer_dir, "--model-name", LOAD_MODEL, "--log-level", "warning", *cfg.sidecar_args]
    return Proc("sidecar", args, cpus), f"http://{HOST}:{port}"


def start_bare(engine_url: str, cpus: list[int] | None) -> tuple[Proc, str]:
    port = _free_port()
    args = [sys.executable, "-m", "sidecar_tools.benchmarks.bare_relay", "--sglang-url", engine_url, "--host", HOST, "--port", str(port)]
    return Proc("bare", args, cpus), f"http://{HOST}:{port}"


def start_smg(engine_url: str, cpus: list[int] | None) -> tuple[Proc, str]:
    """smg 1.13 as a plain router: one worker, round robin, its circuit breaker off (a burst of
    errors must not hide the engine), retries as they come."""
    import shutil

    smg = shutil.which("smg")
    if smg is None:
        raise RuntimeError("the smg binary is not installed (pip install smg==1.13.0)")
    port = _free_port()
    args = [smg, "launch", "--worker-urls", engine_url, "--policy", "round_robin", "--host", HOST, "--port", str(port),
            "--prometheus-port", str(_free_port()), "--log-level", "warn", "--disable-circuit-breaker",
            "--health-check-interval-secs", "5"]
    return Proc("smg", args, cpus), f"http://{HOST}:{port}"


PROXIES = ("sidecar", "bare", "smg")  # modes with a process between the agents and the engine


# --------------------------------------------------------------------------- the agents


@dataclass
class Turn:
    session: str
    turn: int
    sent: float
    first: float | None = None
    end: float | None = None
    ok: bool = False
    status: int | None = None
    error: str | None = None
    prompt_tokens: int = 0
    chunks: int = 0


@dataclass
class Workload:
    """Everything the agents say, prepared once: texts for the sidecar, the same as ids for /generate."""

    system_text: str
    system_ids: list[int]
    tool_texts: list[str]
    tool_ids: list[list[int]]
    reply_ids: list[int]
    stop_ids: list[int]
    suffix_ids: list[int]  # template ids around a tool result (closing + user turn + generation prompt)


def build_workload(cfg: LoadConfig, tokenizer_dir: str) -> Workload:
    from transformers import AutoTokenizer

    from sidecar_tools.benchmarks.textgen import TextSource

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    source = TextSource(tokenizer_dir)
    system = "You are a coding agent. " + source.text("load-system", cfg.system_tokens)
    tools = [source.text(f"load-tool-{i}", cfg.tool_tokens) for i in range(64)]
    pad = source.text("load-pad", cfg.reply_pad_tokens)
    reply = tok.encode(REPLY_TEXT + pad + "\n" + REPLY_CALL, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
    first = tok.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": "Fix the failing test."}],
                                    tools=TOOLS, tokenize=False, add_generation_prompt=True)
    wrapped = tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True)
    return Workload(
        system_text=system,
        system_ids=tok.encode(first, add_special_tokens=False),
        tool_texts=tools,
        tool_ids=[tok.encode(t, add_special_tokens=False) for t in tools],
        reply_ids=reply,
        stop_ids=[tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")],
        suffix_ids=tok.encode(wrapped, add_special_tokens=False),
    )


class Agents:
    def __init__(self, cfg: LoadConfig, work: Workload, mode: str, url: str):
        self.cfg, self.work, self.mode, self.url = cfg, work, mode, url
        self.turns: list[Turn] = []
        self.deadline = 0.0

    async def run(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        timeout = aiohttp.ClientTimeout(total=self.cfg.duration + self.cfg.drain + 60, sock_connect=10)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            self.deadline = time.monotonic() + self.cfg.ramp + self.cfg.duration
            tasks = [asyncio.create_task(self.agent(http, i)) for i in range(self.cfg.sessions)]
            _, pending = await asyncio.wait(tasks, timeout=self.cfg.ramp + self.cfg.duration + self.cfg.drain)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def agent(self, http: aiohttp.ClientSession, index: int) -> None:
        rng = random.Random(self.cfg.seed * 100_003 + index)
        await asyncio.sleep(rng.uniform(0, self.cfg.ramp))
        generation = 0
        while time.monotonic() < self.deadline:
            sid = f"load-{index}-{generation}"
            generation += 1
            if self.mode == "sidecar":  # the others speak /generate
                history: Any = [{"role": "system", "content": self.work.system_text},
                                {"role": "user", "content": "Fix the failing test."}]
            else:
                # the ids as JSON text, extended per turn as the sidecar keeps them: re-encoding the
                # whole history every turn made this client the busiest process on the CPU it shares
                # with the engine (twice the sidecar-mode client's CPU), which slowed the baseline
                history = IdText(self.work.system_ids)
            for k in range(self.cfg.turns):
                if time.monotonic() >= self.deadline:
                    return
                turn = Turn(sid, k, time.time())  # sent: stamped again once the body is ready
                self.turns.append(turn)
                try:
                    reply = await (self.chat(http, sid, history, turn) if self.mode == "sidecar" else self.generate(http, sid, history, turn))
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                    turn.error = f"{type(exc).__name__}: {exc}"[:300]
                    reply = None
                if reply is None:
                    await asyncio.sleep(rng.lognormvariate(math.log(self.cfg.think), 0.5))
                    break  # a failed turn ends this session; the agent starts a new one
                tool = rng.randrange(len(self.work.tool_texts))
                if self.mode == "sidecar":
                    call_id = reply["tool_calls"][0]["id"] if reply.get("tool_calls") else "call_0"
                    history += [reply, {"role": "tool", "tool_call_id": call_id, "content": self.work.tool_texts[tool]}]
                else:
                    history += reply + self.work.suffix_ids + self.work.tool_ids[tool]
                await asyncio.sleep(rng.lognormvariate(math.log(self.cfg.think), 0.5))

    async def open_idle(self, n: int, concurrency: int = 32) -> int:
        """Open ``n`` sessions with one turn each (not counted) and leave them: the open sessions
        the timed agents' turns run beside. Returns how many opened."""
        if n <= 0:
            return 0
        ok = 0
        gate = asyncio.Semaphore(concurrency)
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as http:

            async def one(i: int) -> None:
                nonlocal ok
                sid, turn = f"idle-{i}", Turn(f"idle-{i}", 0, time.time())
                async with gate:
                    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                        if self.mode == "sidecar":
                            history = [{"role": "system", "content": self.work.system_text},
                                       {"role": "user", "content": "Fix the failing test."}]
                            reply = await self.chat(http, sid, history, turn)
                        else:
                            reply = await self.generate(http, sid, IdText(self.work.system_ids), turn)
                        ok += reply is not None

            await asyncio.gather(*(one(i) for i in range(n)))
        return ok

    async def chat(self, http, sid, messages, turn: Turn):
        body = json.dumps({"model": LOAD_MODEL, "messages": messages, "tools": TOOLS, "stream": True,
                           "stream_options": {"include_usage": True}, "max_tokens": len(self.work.reply_ids) + 8}).encode()
        turn.sent = time.time()
        async with http.post(self.url + "/v1/chat/completions", data=body,
                             headers={"X-Session-Id": sid, "Content-Type": "application/json"}) as resp:
            turn.status = resp.status
            if resp.status != 200:
                turn.error = (await resp.text())[:300]
                return None
            content, calls = [], {}
            async for line in resp.content:
                if not line.startswith(b"data: "):
                    continue
                if turn.first is None:
                    turn.first = time.time()
                data = line[6:].strip()
                if data == b"[DONE]":
                    break
                turn.chunks += 1
                event = from_json(data)
                if "error" in event:
                    turn.error = json.dumps(event["error"])[:300]
                    return None
                if event.get("usage"):
                    turn.prompt_tokens = event["usage"]["prompt_tokens"]
                for choice in event.get("choices") or []:
                    delta = choice["delta"]
                    if delta.get("content"):
                        content.append(delta["content"])
                    for tc in delta.get("tool_calls") or []:
                        call = calls.setdefault(tc["index"], {"id": tc.get("id"), "type": "function",
                                                              "function": {"name": "", "arguments": ""}})
                        fn = tc.get("function") or {}
                        call["function"]["name"] += fn.get("name") or ""
                        call["function"]["arguments"] += fn.get("arguments") or ""
            turn.end = time.time()
        turn.ok = True
        message = {"role": "assistant", "content": "".join(content) or None}
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        return message

    async def generate(self, http, sid, ids: IdText, turn: Turn):
        rest = json.dumps({"session_id": sid, "stream": True,
                           "sampling_params": {"max_new_tokens": len(self.work.reply_ids) + 8, "stop_token_ids": self.work.stop_ids}})
        body = b'{"input_ids":' + ids.json() + b"," + rest[1:].encode()
        turn.prompt_tokens = len(ids)
        turn.sent = time.time()
        async with http.post(self.url + "/generate", data=body, headers={"Content-Type": "application/json"}) as resp:
            turn.status = resp.status
            if resp.status != 200:
                turn.error = (await resp.text())[:300]
                return None
            output: list[int] = []
            async for line in resp.content:
                if not line.startswith(b"data: "):
                    continue
                data = line[6:].strip()
                if data == b"[DONE]":
                    break
                event = from_json(data)
                if "error" in event:
                    turn.error = json.dumps(event["error"])[:300]
                    return None
                turn.chunks += 1
                output = event.get("output_ids") or output
                if turn.first is None and output:
                    turn.first = time.time()
            turn.end = time.time()
        turn.ok = True
        return output


# --------------------------------------------------------------------------- measuring


class Sampler:
    """CPU % and RSS of the processes, every ``interval`` seconds."""

    def __init__(self, procs: dict[str, Any], interval: float = 1.0):
        self.procs, self.interval = procs, interval
        self.series: list[dict[str, Any]] = []
        self._task: asyncio.Task | None = None
        self._t0 = time.monotonic()

    async def _loop(self) -> None:
        for p in self.procs.values():
            p.cpu_percent(None)
        while True:
            await asyncio.sleep(self.interval)
            row: dict[str, Any] = {"t": round(time.monotonic() - self._t0, 2)}
            for name, p in self.procs.items():
                with contextlib.suppress(Exception):
                    row[f"{name}_cpu"] = round(p.cpu_percent(None), 1)
                    row[f"{name}_rss_mb"] = round(p.memory_info().rss / 2**20, 1)
            self.series.append(row)

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    return xs[min(len(xs) - 1, max(0, math.ceil(q / 100 * len(xs)) - 1))]


def dist_ms(values: list[float]) -> dict[str, Any]:
    ms = [v * 1000 for v in values]
    return {"n": len(ms), **{f"p{q}": _r(pct(ms, q)) for q in (50, 90, 99)}, "max": _r(max(ms) if ms else None)}


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def summarize_phase(cfg: LoadConfig, turns: list[Turn], stamps: dict[str, list], series: list[dict], window: tuple[float, float]) -> dict[str, Any]:
    """``window``: (start, end) wall-clock time of the steady part (after the ramp) for the rates."""
    ok = [t for t in turns if t.ok]
    wall = window[1] - window[0]
    in_window = [t for t in ok if window[0] <= t.sent < window[1]]
    errors = [t for t in turns if not t.ok and (t.error or t.status)]
    unfinished = [t for t in turns if not t.ok and not (t.error or t.status)]
    outside_first, outside_end, engine_first = [], [], []
    for t in ok:
        recs = stamps.get(t.session) or []
        if t.turn < len(recs) and None not in recs[t.turn] and t.first is not None:
            received, e_first, e_end = recs[t.turn]
            outside_first.append((t.first - t.sent) - (e_first - received))
            outside_end.append((t.end - t.sent) - (e_end - received))
            engine_first.append(e_first - received)
    out: dict[str, Any] = {
        "turns_started": len(turns),
        "turns_ok": len(ok),
        "errors": len(errors),
        "error_samples": sorted({t.error or str(t.status) for t in errors})[:5],
        "unfinished_at_stop": len(unfinished),
        "steady_window_s": round(wall, 2),
        "requests_per_s": round(len(in_window) / wall, 1) if wall else None,
        "stream_chunks_per_s": round(sum(t.chunks for t in in_window) / wall, 1) if wall else None,
        "ttft_ms": dist_ms([t.first - t.sent for t in ok if t.first]),
        "turn_latency_ms": dist_ms([t.end - t.sent for t in ok if t.end]),
        "engine_ttft_ms": dist_ms(engine_first),
        "outside_engine_ttft_ms": dist_ms(outside_first),
        "outside_engine_turn_ms": dist_ms(outside_end),
        "mean_prompt_tokens": round(sum(t.prompt_tokens for t in ok) / len(ok), 1) if ok else None,
        "sessions_started": len({t.session for t in turns}),
        "continued_turns": _continued(ok),
    }
    for name in ("sidecar", "bare", "smg", "engine", "client"):
        cpu = [row[f"{name}_cpu"] for row in series if f"{name}_cpu" in row]
        rss = [row[f"{name}_rss_mb"] for row in series if f"{name}_rss_mb" in row]
        if cpu:
            steady = cpu[len(cpu) // 4 :] or cpu
            out[f"{name}_cpu_pct"] = {"mean_steady": round(sum(steady) / len(steady), 1), "max": max(cpu)}
        if rss:
            half = rss[len(rss) // 2 :]
            slope = _slope(half) * 60 if len(half) > 2 else None
            out[f"{name}_rss_mb"] = {"start": rss[0], "at_25pct": rss[len(rss) // 4], "end": rss[-1], "max": max(rss),
                                     "second_half_slope_mb_per_min": _r(slope, 2)}
    return out


def _continued(ok: list[Turn]) -> int:
    """Turns whose prompt grew from the session's previous turn (the conversation went on, nothing lost)."""
    last: dict[str, Turn] = {}
    count = 0
    for t in sorted(ok, key=lambda t: (t.session, t.turn)):
        prev = last.get(t.session)
        if prev is not None and t.turn == prev.turn + 1 and t.prompt_tokens > prev.prompt_tokens:
            count += 1
        last[t.session] = t
    return count


def _slope(ys: list[float]) -> float:
    n = len(ys)
    mx, my = (n - 1) / 2, sum(ys) / n
    den = sum((i - mx) ** 2 for i in range(n))
    return sum((i - mx) * (y - my) for i, y in enumerate(ys)) / den if den else 0.0


def compare(direct: dict[str, Any], sidecar: dict[str, Any]) -> dict[str, Any]:
    def diff(key, q):
        a, b = sidecar[key].get(q), direct[key].get(q)
        return _r(a - b) if a is not None and b is not None else None

    added = {
        "per_request_ttft_ms": {q: diff("outside_engine_ttft_ms", q) for q in ("p50", "p90", "p99")},
        "per_request_turn_ms": {q: diff("outside_engine_turn_ms", q) for q in ("p50", "p90", "p99")},
        "end_to_end_ttft_ms": {q: diff("ttft_ms", q) for q in ("p50", "p90", "p99")},
        "end_to_end_turn_ms": {q: diff("turn_latency_ms", q) for q in ("p50", "p90", "p99")},
    }
    rss = sidecar.get("sidecar_rss_mb") or {}
    targets = {
        "added_p50_le_1ms": _le(added["per_request_ttft_ms"]["p50"], 1.0),
        "added_p99_le_10ms": _le(added["per_request_ttft_ms"]["p99"], 10.0),
        "no_errors": sidecar["errors"] == 0 and direct["errors"] == 0,
        "memory_flat": rss.get("second_half_slope_mb_per_min") is not None and abs(rss["second_half_slope_mb_per_min"]) <= 5.0,
    }
    return {"added_by_sidecar": added, "targets": targets}


def _le(x, bound):
    return x is not None and x <= bound


# --------------------------------------------------------------------------- phases


async def _stamps(url: str) -> dict[str, list]:
    async with aiohttp.ClientSession() as http:
        async with http.get(url + TIMINGS_PATH, timeout=aiohttp.ClientTimeout(total=60)) as resp:
            return await resp.json()


async def run_phase(cfg: LoadConfig, work: Workload, mode: str, tokenizer_dir: str, log) -> dict[str, Any]:
    import psutil

    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    pinned = cfg.pin and len(cpus) >= 2
    sidecar_cpus, other_cpus = (cpus[:1], cpus[1:]) if pinned else (None, None)
    if pinned:
        psutil.Process().cpu_affinity(other_cpus)
    procs: list[Proc] = []
    try:
        engine, engine_url = start_engine(cfg, work.reply_ids, other_cpus)
        procs.append(engine)
        await _wait_http(engine_url + "/health", engine)
        watched = {"engine": engine.ps, "client": psutil.Process()}
        url = engine_url
        if mode in ("bare", "smg"):
            proxy, url = (start_bare if mode == "bare" else start_smg)(engine_url, sidecar_cpus)
            procs.append(proxy)
            await _wait_http(url + "/health", proxy)
            watched[mode] = proxy.ps
        if mode == "sidecar":
            sidecar, url = start_sidecar(cfg, engine_url, tokenizer_dir, sidecar_cpus)
            procs.append(sidecar)
            await _wait_http(url + "/health", sidecar)
            watched["sidecar"] = sidecar.ps
            if cfg.profile:
                spy = subprocess.Popen(["py-spy", "record", "--pid", str(sidecar.popen.pid), "--format", "speedscope",
                                        "--output", cfg.profile, "--rate", "250", "--nonblocking", "--duration", str(int(cfg.ramp + cfg.duration))],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                procs.append(Proc.adopt("py-spy", spy))
        agents = Agents(cfg, work, mode, url)
        idle_opened = await agents.open_idle(cfg.idle_sessions)
        if cfg.idle_sessions:
            log(f"[{mode}] {idle_opened} of {cfg.idle_sessions} idle sessions opened")
        log(f"[{mode}] {cfg.sessions} agents for {cfg.duration:g} s against {url}")
        sampler = Sampler(watched)
        cpu_before = {k: _cpu_seconds(p) for k, p in watched.items()}
        sampler.start()
        steady_from = time.time() + cfg.ramp
        await agents.run()
        window = (steady_from, steady_from + cfg.duration)
        await sampler.stop()
        cpu_s = {k: round(_cpu_seconds(p) - cpu_before[k], 2) for k, p in watched.items()}
        stamps = await _stamps(engine_url)
        if mode == "sidecar":
            async with aiohttp.ClientSession() as http:
                async with http.get(url + "/v1/sessions") as resp:
                    sessions_left = len((await resp.json())["data"])
        summary = summarize_phase(cfg, agents.turns, stamps, sampler.series, window)
        if summary["errors"]:
            summary["log_tails"] = {p.name: p.log_tail() for p in procs}
        summary["cpu_seconds"] = cpu_s
        if summary["turns_ok"]:
            summary["cpu_ms_per_turn"] = {k: round(v * 1000 / summary["turns_ok"], 3) for k, v in cpu_s.items()}
        summary["idle_sessions_opened"] = idle_opened
        if mode in PROXIES:
            summary["proxy"] = mode
        if mode == "sidecar":
            summary["sidecar_sessions_remembered_at_end"] = sessions_left
        summary["pinned_cpus"] = {"sidecar": sidecar_cpus, "engine+client": other_cpus} if pinned else None
        log(f"[{mode}] {summary['turns_ok']} turns, {summary['errors']} errors, {summary['requests_per_s']} req/s, "
            f"TTFT p50 {summary['ttft_ms']['p50']} ms p99 {summary['ttft_ms']['p99']} ms")
        return {"summary": summary, "series": sampler.series}
    finally:
        for p in reversed(procs):
            p.stop()
        if pinned:
            psutil.Process().cpu_affinity(cpus)


async def run_load(cfg: LoadConfig, tokenizer_dir: str | None = None, modes: tuple[str, ...] = ("direct", "sidecar"), log=print) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="load-tok-") as tmp:
        if tokenizer_dir is None:
            from sidecar_tools.benchmarks.qwen3_tokenizer import build_qwen3_tokenizer

            tokenizer_dir = str(build_qwen3_tokenizer(Path(tmp)))
        work = build_workload(cfg, tokenizer_dir)
        result: dict[str, Any] = {"config": asdict(cfg), "phases": {}}
        for mode in modes:
            result["phases"][mode] = await run_phase(cfg, work, mode, tokenizer_dir, log)
    if {"direct", "sidecar"} <= set(result["phases"]):
        result.update(compare(result["phases"]["direct"]["summary"], result["phases"]["sidecar"]["summary"]))
    return result


def machine_info() -> dict[str, Any]:
    import psutil

    return {"cpus": os.cpu_count(), "cpu_model": _cpu_model(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(), "platform": platform.platform(), "aiohttp": aiohttp.__version__}


def _cpu_model() -> str | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return None


def markdown(result: dict[str, Any], command: str) -> str:
    d, s = (result["phases"].get(k, {}).get("summary", {}) for k in ("direct", "sidecar"))
    added, targets = result.get("added_by_sidecar", {}), result.get("targets", {})
    cfg, m = result["config"], result.get("machine", {})
    lines = [
        f"# Load test: {cfg['sessions']} concurrent streaming sessions, {cfg['duration']:g} s",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {m.get('cpus')} CPUs ({m.get('cpu_model')}), {m.get('memory_gb')} GB. The client, the SGLang stand-in and "
        "the sidecar share these CPUs" + (f"; the sidecar pinned to CPU {s.get('pinned_cpus', {}).get('sidecar')}, "
                                          f"engine + client to {s.get('pinned_cpus', {}).get('engine+client')}" if s.get("pinned_cpus") else "") + ".",
        f"Workload: {cfg['turns']} turns a session, system prompt {cfg['system_tokens']} tokens, tool results "
        f"{cfg['tool_tokens']} tokens, reply = short text + one tool call streamed at {1 / cfg['token_delay']:.0f} tokens/s, "
        f"think time median {cfg['think']} s.",
        "",
        "| | direct (/generate) | sidecar (/v1/chat/completions) |",
        "|---|---|---|",
    ]
    for label, key in (("turns ok / errors", None), ("requests/s", "requests_per_s"), ("stream chunks/s", "stream_chunks_per_s")):
        if key is None:
            lines.append(f"| {label} | {d.get('turns_ok')} / {d.get('errors')} | {s.get('turns_ok')} / {s.get('errors')} |")
        else:
            lines.append(f"| {label} | {d.get(key)} | {s.get(key)} |")
    for label, key in (("TTFT ms p50 / p99", "ttft_ms"), ("turn latency ms p50 / p99", "turn_latency_ms"),
                       ("engine-side TTFT ms p50 / p99", "engine_ttft_ms"), ("outside-engine TTFT ms p50 / p99", "outside_engine_ttft_ms"),
                       ("outside-engine turn ms p50 / p99", "outside_engine_turn_ms")):
        lines.append(f"| {label} | {d.get(key, {}).get('p50')} / {d.get(key, {}).get('p99')} | {s.get(key, {}).get('p50')} / {s.get(key, {}).get('p99')} |")
    for name in ("sidecar", "engine", "client"):
        if f"{name}_cpu_pct" in s:
            lines.append(f"| {name} CPU % (steady mean / max) | {d.get(f'{name}_cpu_pct', {}).get('mean_steady', '-')} / "
                         f"{d.get(f'{name}_cpu_pct', {}).get('max', '-')} | {s[f'{name}_cpu_pct']['mean_steady']} / {s[f'{name}_cpu_pct']['max']} |")
    if "sidecar_rss_mb" in s:
        r = s["sidecar_rss_mb"]
        lines.append(f"| sidecar RSS MB (start / 25 % / end; 2nd-half slope MB/min) | - | {r['start']} / {r['at_25pct']} / {r['end']}; {r['second_half_slope_mb_per_min']} |")
    if "cpu_ms_per_turn" in s:
        lines.append(f"| sidecar CPU ms per turn | - | {s['cpu_ms_per_turn'].get('sidecar')} |")
    if added:
        a = added["per_request_ttft_ms"]
        e = added["end_to_end_ttft_ms"]
        t = added["per_request_turn_ms"]
        lines += [
            "",
            "Latency the sidecar adds (ms; sidecar minus direct):",
            "",
            "| | p50 | p90 | p99 |",
            "|---|---|---|---|",
            f"| per request, to first token (outside-engine time) | {a['p50']} | {a['p90']} | {a['p99']} |",
            f"| per request, whole turn (outside-engine time) | {t['p50']} | {t['p90']} | {t['p99']} |",
            f"| end to end, TTFT percentiles | {e['p50']} | {e['p90']} | {e['p99']} |",
            "",
            "Targets: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in targets.items()),
        ]
    return "\n".join(lines) + "\n"


@click.command()
@click.option("--sessions", default=500, show_default=True, help="Concurrent agents.")
@click.option("--duration", default=60.0, show_default=True, help="Seconds of new turns per phase.")
@click.option("--drain", default=15.0, show_default=True, help="Seconds in-flight turns may finish after that.")
@click.option("--ramp", default=5.0, show_default=True, help="Agents start spread over this many seconds.")
@click.option("--token-delay", default=0.04, show_default=True, help="Seconds between streamed tokens.")
@click.option("--think", default=0.5, show_default=True, help="Median think/tool time between turns (s).")
@click.option("--turns", default=10, show_default=True, help="Turns per session.")
@click.option("--system-tokens", default=1000, show_default=True)
@click.option("--tool-tokens", default=100, show_default=True)
@click.option("--reply-pad-tokens", default=0, show_default=True, help="Extra words in each reply before its tool call.")
@click.option("--pin/--no-pin", default=True, show_default=True, help="Pin the sidecar to its own CPU.")
@click.option("--mode", type=click.Choice(["both", "direct", "sidecar", "bare", "smg"]), default="both", show_default=True,
              help="both = direct then sidecar; bare / smg: the agents' /generate through a bare relay / smg.")
@click.option("--idle-sessions", default=0, show_default=True, help="Sessions opened (one turn each) before the timed part, left open.")
@click.option("--sidecar-arg", "sidecar_args", multiple=True, help="Extra flag for `sidecar serve` (repeatable).")
@click.option("--tokenizer", "tokenizer_dir", default=None, help="Qwen3 tokenizer folder (default: built offline).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None, help="Write <name>.json and <name>.md here.")
@click.option("--name", default="load", show_default=True)
@click.option("--profile", default=None, help="py-spy the sidecar during its phase into this speedscope file.")
@click.option("--uvloop/--no-uvloop", "use_uvloop", default=False, show_default=True,
              help="Run the sidecar and the engine on uvloop (and the client too).")
def main(sessions, duration, drain, ramp, token_delay, think, turns, system_tokens, tool_tokens, reply_pad_tokens, pin, mode,
         idle_sessions, sidecar_args, tokenizer_dir, out_dir, name, profile, use_uvloop):
    """Bounded loopback load test of the sidecar in front of the SGLang stand-in."""
    cfg = LoadConfig(sessions=sessions, duration=duration, drain=drain, ramp=ramp, token_delay=token_delay, think=think,
                     turns=turns, system_tokens=system_tokens, tool_tokens=tool_tokens, reply_pad_tokens=reply_pad_tokens,
                     pin=pin, sidecar_args=tuple(sidecar_args), profile=profile, uvloop=use_uvloop, idle_sessions=idle_sessions)
    modes = ("direct", "sidecar") if mode == "both" else (mode,)
    log = lambda msg: click.echo(msg, err=True)  # noqa: E731
    limit = len(modes) * (ramp + duration + drain + 180)
    if use_uvloop:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    result = asyncio.run(asyncio.wait_for(run_load(cfg, tokenizer_dir, modes, log), limit))
    result["machine"] = machine_info()
    command = "python -m sidecar_tools.benchmarks.load_benchmark " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    result["command"] = command
    text = markdown(result, command)
    click.echo(text)
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
        (out / f"{name}.md").write_text(text)
        log(f"wrote {out / name}.json and .md")


if __name__ == "__main__":
    main()
