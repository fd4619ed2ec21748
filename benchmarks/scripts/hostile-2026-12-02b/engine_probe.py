"""Diagnosis behind the admission row of benchmarks/results/hostile/2026-12-02b: hostile_load with a
second small streaming client that reads the engine stand-in's /generate directly (no sidecar), so
a gap both clients see at the same moment is the stand-in's own cadence, not the sidecar's.

    PYTHONPATH=$PWD python benchmarks/scripts/hostile-2026-12-02b/engine_probe.py --attack admission \\
        --warmup 4 --baseline 4 --settle 2 --out /tmp/probe

Writes /tmp/probe/gaps.json: [[when, gap s], ...] of the sidecar stream ("sidecar") and of the
direct engine stream ("engine").
"""

import asyncio
import json
import sys
from pathlib import Path

import aiohttp

import sidecar_tools.benchmarks.load_benchmark as lb
from sidecar_tools.benchmarks import hostile_load

ENGINE: list[str] = []
_init = lb.Proc.__init__


def _noting_engine(self, name, args, cpus):
    _init(self, name, args, cpus)
    if name == "engine":
        ENGINE.append(f"http://127.0.0.1:{args[args.index('--port') + 1]}")


async def probe_engine(stop: asyncio.Event, out: list) -> None:
    body = {"input_ids": list(range(100, 120)), "stream": True,
            "sampling_params": {"max_new_tokens": 400, "ignore_eos": True, "temperature": 0}}
    async with aiohttp.ClientSession() as http:
        while not stop.is_set():
            async with http.post(ENGINE[0] + "/generate", json=body) as resp:
                await hostile_load.record_chunk_gaps(resp, out)


_probe = hostile_load.probe_stream


async def both_probes(url, stop, out, failures, *args, **kwargs):
    direct: list = []
    task = asyncio.create_task(probe_engine(stop, direct))
    try:
        await _probe(url, stop, out, failures, *args, **kwargs)
    finally:
        await task
        folder = Path(sys.argv[sys.argv.index("--out") + 1])
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "gaps.json").write_text(json.dumps({"sidecar": out, "engine": direct}))


lb.Proc.__init__ = _noting_engine
hostile_load.probe_stream = both_probes

if __name__ == "__main__":
    hostile_load.main()
