"""The tracing launch of the sidecar: under a small load test it serves every turn as the plain
sidecar does, and its summary has each turn's stages in the sidecar, its GC passes and loop lag."""

from __future__ import annotations

import asyncio
import glob

from sidecar_tools.benchmarks import turn_trace
from sidecar_tools.benchmarks.load_benchmark import LoadConfig, run_load

SMALL = dict(sessions=4, duration=2.0, drain=5.0, ramp=0.3, token_delay=0.005, think=0.05, turns=3,
             system_tokens=100, tool_tokens=20, pin=False)


async def test_the_traced_sidecar_serves_the_load_and_its_turns_are_summarized(qwen3_tokenizer_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("LOAD_TEST_SIDECAR_LAUNCH", f"python3 -m sidecar_tools.benchmarks.turn_trace launch {tmp_path}")
    cfg = LoadConfig(**SMALL)
    result = await asyncio.wait_for(run_load(cfg, str(qwen3_tokenizer_dir), modes=("sidecar",), log=lambda _: None), 120)
    s = result["phases"]["sidecar"]["summary"]
    assert s["errors"] == 0 and s["turns_ok"] >= cfg.sessions * 2
    (path,) = glob.glob(str(tmp_path / "*.json"))
    summary = turn_trace.summary(path)
    assert summary["turns"] == s["turns_ok"]
    assert set(summary["stages_ms"]) == {name for name, _, _ in turn_trace.STAGES}
    assert summary["loop_lag_ms"]["p50"] >= 0 and summary["offloaded"]["n"] == 0
