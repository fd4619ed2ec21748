"""Where a sidecar turn's time outside the engine goes, under the load test: a tracing launch of the
sidecar for ``LOAD_TEST_SIDECAR_LAUNCH``, and a summary of what it recorded.

    LOAD_TEST_SIDECAR_LAUNCH="python3 -m sidecar_tools.benchmarks.turn_trace launch /tmp/trace" \\
        python -m sidecar_tools.benchmarks.load_benchmark --mode sidecar --sessions 256 --turns 20 --tool-tokens 1000 ...
    python -m sidecar_tools.benchmarks.turn_trace summary /tmp/trace/*.json

``launch DIR [--checkout PATH]`` runs ``sidecar serve`` (of PATH, another checkout, when given) and
writes ``DIR/<pid>.json`` every 2 s and at exit: every garbage-collector pass after the serving
thresholds were set (generation, wall and thread CPU ms, the thread it ran on), every event-loop
lag probe (``sidecar_event_loop_lag_seconds``' samples), every step sent to the offload pool (its
function, weight and wall ms from queueing to result), and per chat turn its stamps: the route
entered, the turn entered and prepared (``Turn.__aenter__``), the engine request started and its
first batch read, the first write to the agent. Benchmark-only: it wraps those functions from
outside and costs a little CPU of its own; take timings from runs without it.
"""

from __future__ import annotations

import atexit
import contextvars
import gc
import json
import os
import statistics
import sys
import threading
import time
from collections import Counter, defaultdict
from typing import Any

from sidecar_tools.benchmarks.sidecar_at_commit import use_checkout

STAGES = (("body read + parse", "route", "entered"), ("turn prepared", "entered", "prepared"),
          ("to the engine", "prepared", "engine"), ("first write", "first_batch", "written"),
          ("sidecar total", None, None))


def _sidecar_total(t: dict[str, float]) -> float:
    """Time the turn spent in the sidecar before its first token: before the engine request, and
    from the engine's first batch to the agent."""
    return (t["engine"] - t["route"]) + (t["written"] - t["first_batch"])


def _install(out_dir: str) -> None:
    pauses: list[tuple] = []
    lags: list[tuple] = []
    offloaded: list[tuple] = []
    turns: list[dict[str, float]] = []
    started = [0.0, 0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0], started[1] = time.perf_counter(), time.thread_time()
        elif gc.get_threshold()[0] != 700:  # once the serving thresholds are set (not start-up's passes)
            pauses.append((time.time(), info["generation"], (time.perf_counter() - started[0]) * 1000,
                           (time.thread_time() - started[1]) * 1000, threading.current_thread().name))

    gc.callbacks.append(on_gc)
    stamps: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar("turn_trace", default=None)

    def stamp(name: str) -> None:
        st = stamps.get()
        if st is not None and name not in st:
            st[name] = time.perf_counter()

    import sidecar.engine.client as engine_client
    import sidecar.frontdoor.stream as stream
    import sidecar.metrics as metrics
    import sidecar.server.routes as routes
    import sidecar.turn.core as core
    import sidecar.turn.offload as offload

    route = routes.chat_completions

    async def chat_completions(request):
        st = {"route": time.perf_counter()}
        stamps.set(st)
        try:
            return await route(request)
        finally:
            turns.append(st)

    routes.chat_completions = chat_completions
    enter = core.Turn.__aenter__

    async def aenter(self):
        stamp("entered")
        result = await enter(self)
        stamp("prepared")
        return result

    core.Turn.__aenter__ = aenter
    batches = engine_client.EngineClient.generate_batches

    async def generate_batches(self, *args, **kwargs):
        stamp("engine")
        async for batch in batches(self, *args, **kwargs):
            stamp("first_batch")
            yield batch

    engine_client.EngineClient.generate_batches = generate_batches
    write = stream.write_within

    async def write_within(*args, **kwargs):
        result = await write(*args, **kwargs)
        stamp("written")
        return result

    stream.write_within = write_within
    run = offload.Offload.run

    async def run_offloaded(self, fn, *args, key: str = "", weight: int = offload.OFFLOAD_CHARS):
        t0 = time.perf_counter()
        try:
            return await run(self, fn, *args, key=key, weight=weight)
        finally:
            offloaded.append((time.time(), getattr(fn, "__name__", repr(fn)), weight, (time.perf_counter() - t0) * 1000))

    offload.Offload.run = run_offloaded
    init = metrics.SidecarMetrics.__init__

    def metrics_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        observe = self.loop_lag.observe

        def observe_lag(value: float) -> None:
            lags.append((time.time(), value * 1000))
            observe(value)

        self.loop_lag.observe = observe_lag

    metrics.SidecarMetrics.__init__ = metrics_init
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{os.getpid()}.json")

    def dump() -> None:
        import sidecar

        with open(path + ".tmp", "w") as f:
            json.dump({"sidecar": sidecar.__file__, "gc_threshold": gc.get_threshold(), "gc_passes": pauses,
                       "loop_lag_ms": lags, "offloaded": offloaded, "turns": turns}, f)
        os.replace(path + ".tmp", path)

    def every_2s() -> None:
        while True:
            time.sleep(2)
            try:
                dump()
            except Exception:  # noqa: BLE001 - a diagnostic; the last dump at exit still comes
                pass

    threading.Thread(target=every_2s, daemon=True).start()
    atexit.register(dump)


def launch(argv: list[str]) -> None:
    out_dir, *rest = argv
    checkout = None
    if rest[:1] == ["--checkout"]:
        checkout, rest = rest[1], rest[2:]
    use_checkout(checkout or os.getcwd())
    _install(out_dir)
    sys.argv = ["sidecar", *rest]
    from sidecar.cli import main as sidecar_main

    sidecar_main()


def summary(path: str) -> dict[str, Any]:
    """Percentiles of the stages, GC passes by generation, loop lag and the offloaded steps, over
    the timed part (from the first loop-lag probe, after start-up)."""
    from sidecar_tools.benchmarks.load_benchmark import pct  # here: ``launch`` imports nothing of the sidecar's first

    d = json.load(open(path))
    since = d["loop_lag_ms"][0][0] if d["loop_lag_ms"] else 0.0
    out: dict[str, Any] = {"sidecar": d["sidecar"], "gc_threshold": d["gc_threshold"]}
    keys = ("route", "entered", "prepared", "engine", "first_batch", "written")
    turns = [t for t in d["turns"] if all(k in t for k in keys)]
    stages = {}
    for name, a, b in STAGES:
        xs = [_sidecar_total(t) * 1000 if a is None else (t[b] - t[a]) * 1000 for t in turns]
        if xs:
            stages[name] = {"p50": round(pct(xs, 50), 2), "p90": round(pct(xs, 90), 2), "p99": round(pct(xs, 99), 2),
                            "max": round(max(xs), 2)}
    out["turns"] = len(turns)
    out["stages_ms"] = stages
    passes = defaultdict(list)
    for t, generation, wall, cpu, thread in d["gc_passes"]:
        if t >= since:
            passes[f"gen{generation} on {'loop' if thread == 'MainThread' else 'pool'}"].append((wall, cpu))
    out["gc_passes"] = {k: {"n": len(v), "wall_ms_median": round(statistics.median(w for w, _ in v), 1),
                            "wall_ms_max": round(max(w for w, _ in v), 1), "cpu_ms_max": round(max(c for _, c in v), 1)}
                        for k, v in sorted(passes.items())}
    lag = [ms for _, ms in d["loop_lag_ms"]]
    if lag:
        out["loop_lag_ms"] = {"p50": pct(lag, 50), "p90": pct(lag, 90), "p99": pct(lag, 99), "max": max(lag)}
    off = d["offloaded"]
    out["offloaded"] = {"n": len(off), "by_step": dict(Counter(name for _, name, _, _ in off))}
    if off:
        walls = [ms for _, _, _, ms in off]
        out["offloaded"]["wall_ms"] = {"p50": round(pct(walls, 50), 1), "p90": round(pct(walls, 90), 1), "max": round(max(walls), 1)}
    return out


def main(argv: list[str]) -> None:
    if argv[:1] == ["launch"]:
        launch(argv[1:])
    elif argv[:1] == ["summary"]:
        print(json.dumps({path: summary(path) for path in argv[1:]}, indent=1))
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
