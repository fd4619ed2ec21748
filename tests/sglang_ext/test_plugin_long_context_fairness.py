"""Long contexts, overloaded pool: no request starves behind leased ones, admission keeps max_wait.

Nine copies of TraceLab's recorded Claude Code session (32K-49K-token contexts, 10 s apart: 2.5x
a 173,200-token KV pool) through the simulator: SGLang's real scheduler classes and radix cache
with the session_ttl plugin (lease bound 0.8, leased requests first), and the sidecar's policy
(coding-agent preset: predictive leases, admission gate) in virtual time.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("sglang")

TRACE = Path(__file__).resolve().parents[2] / "benchmarks/results/real-traces/tracelab-examples.jsonl"
CONFIG = Path(__file__).resolve().parents[2] / "configs/coding-agent.toml"
MAX_WAIT_S = 120.0
POLL_S = 7.0  # a long periodic pass, out of step with the arrivals: the deadline does not depend on it


def claude_copies(copies: int = 9, spacing_s: float = 10.0):
    from sidecar_tools.benchmarks.traces import Trace, load_jsonl

    claude = next(s for s in load_jsonl(TRACE).sessions if s.final_context_tokens() > 40_000)
    sessions = [claude.model_copy(update={"session_id": f"claude-{i}", "start_s": spacing_s * i}) for i in range(copies)]
    return Trace(name="claude-copies", sessions=sessions)


def run(monkeypatch, plugin_config: dict):
    """(the longest a request waited while a later one was admitted ahead of it, admission waits)."""
    from sidecar.settings import load_settings
    from sidecar_tools.benchmarks.clients import ClientOptions
    from sidecar_tools.simulator.engine import SimEngine
    from sidecar_tools.simulator.virtual_replay import SidecarLoop, VirtualReplay

    engine = SimEngine(kv_tokens=173_200, policy="session_ttl",
                       policy_config={"max_leased_fraction": 0.8, **plugin_config}, context_length=131_072)
    settings = load_settings(CONFIG, {"admission": {"max_wait": MAX_WAIT_S, "poll_interval": POLL_S}})
    replay = None
    sidecar = SidecarLoop(settings, engine.kv_tokens, clock=lambda: replay.clock_now)
    waits: list[tuple[str, float | None]] = []
    record = sidecar.policy.metrics.admission
    monkeypatch.setattr(sidecar.policy.metrics, "admission", lambda d, w: (waits.append((d, w)), record(d, w)))

    first_seen: dict[str, float] = {}
    overtaken = [0.0]
    prefill_pass = SimEngine._get_new_batch_prefill_raw

    def watched_pass(self):  # rids are "sim-<n>" in submission order: arrival order
        for req in self.waiting_queue:
            first_seen.setdefault(req.rid, self.now)
        before = list(self.waiting_queue)
        out = prefill_pass(self)
        still = list(self.waiting_queue)
        left = {r.rid for r in still}
        arrival = lambda r: int(r.rid.rsplit("-", 1)[1])  # noqa: E731
        for admitted in (r for r in before if r.rid not in left):
            for waiting in still:
                if arrival(waiting) < arrival(admitted):
                    overtaken[0] = max(overtaken[0], self.now - first_seen[waiting.rid])
        return out

    monkeypatch.setattr(SimEngine, "_get_new_batch_prefill_raw", watched_pass)
    replay = VirtualReplay(claude_copies(), engine, ClientOptions(close_sessions=True), sidecar=sidecar)
    _, records = replay.run()
    assert all(r.ok for r in records) and len(records) == 9 * 10
    return overtaken[0], waits


def test_an_unleased_request_is_kept_behind_leased_ones_only_max_priority_wait_s(monkeypatch):
    overtaken, _ = run(monkeypatch, {"max_priority_wait_s": 3.0})
    assert overtaken <= 3.0 + 0.5  # + the lease clock's tick and one scheduler pass
    unbounded, _ = run(monkeypatch, {"max_priority_wait_s": 1e9})  # leased first, no aging
    assert unbounded > 30.0  # what the aging prevents: a recompute overtaken for tens of seconds


def test_admission_never_waits_past_max_wait(monkeypatch):
    _, waits = run(monkeypatch, {})
    assert any(decision == "timeout" for decision, _ in waits)  # the gate was full: max_wait decided
    assert max(w for _, w in waits if w is not None) <= MAX_WAIT_S + 1e-6
