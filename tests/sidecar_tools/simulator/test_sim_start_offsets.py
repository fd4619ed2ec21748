"""The simulated replay honours session start offsets, as the GPU replay does."""

from __future__ import annotations

import pytest

pytest.importorskip("sglang")

from sidecar_tools.benchmarks.clients import ClientOptions
from sidecar_tools.benchmarks.traces import Round, Session, Trace


def _replay(cost, trace, **kwargs):
    from sidecar_tools.simulator.engine import SimEngine
    from sidecar_tools.simulator.virtual_replay import VirtualReplay

    engine = SimEngine(kv_tokens=50_000, policy="lru", cost=cost)
    return VirtualReplay(trace, engine, ClientOptions(close_sessions=True), **kwargs).run()


def _trace():
    rounds = [Round(append_tokens=300, output_tokens=20, tool_wait_s=2.0), Round(append_tokens=50, output_tokens=20)]
    return Trace(name="t", sessions=[Session(session_id="late", start_s=50.0, rounds=rounds),
                                     Session(session_id="early", rounds=rounds),
                                     Session(session_id="later", start_s=50.5, rounds=rounds)])


def test_sessions_send_their_first_request_at_start_s(cost):
    run, records = _replay(cost, _trace())
    first = {r.session: r for r in records if r.turn == 0}
    assert first["early"].send_s == 0.0 and first["late"].send_s == 50.0 and first["later"].send_s == 50.5
    assert all(r.client_wait_s == 0.0 for r in first.values())
    assert run["summary"]["makespan_s"] > 52 and run["summary"]["turns_ok"] == 6


def test_a_session_that_arrives_at_a_full_client_waits_from_its_start(cost):
    _, records = _replay(cost, _trace(), max_concurrent_sessions=1)
    first = {r.session: r for r in records if r.turn == 0}
    assert first["late"].send_s == 50.0 and first["late"].client_wait_s == 0.0  # "early" is long done
    last_of_late = max(r.end_s for r in records if r.session == "late")
    assert first["later"].send_s == pytest.approx(last_of_late)
    assert first["later"].client_wait_s == pytest.approx(last_of_late - 50.5)


def test_cli_replicates_sessions_with_start_offsets(tmp_path):
    import json

    from click.testing import CliRunner

    from sidecar.cli import main
    from sidecar_tools.benchmarks.traces import save_jsonl

    save_jsonl(_trace(), tmp_path / "t.jsonl")
    result = CliRunner().invoke(main, [
        "simulate", "--trace", str(tmp_path / "t.jsonl"), "--start-spacing", "10", "--replicate", "2",
        "--replicate-offset", "3", "--kv-tokens", "50000", "--name", "rep", "--out", str(tmp_path)],
        catch_exceptions=False)
    assert result.exit_code == 0, result.output
    run = json.loads((tmp_path / "rep.json").read_text())
    assert run["summary"]["turns_ok"] == 12 and run["summary"]["sessions"] == 6
    assert run["config"]["replicate"] == 2 and run["config"]["replicate_offset_s"] == 3.0
    assert run["trace"]["meta"]["replicated"] == {"copies": 2, "offset_s": 3.0}
    assert "--replicate 2 --replicate-offset 3.0" in run["command"]
    rows = (tmp_path / "rep-turns.csv").read_text().splitlines()[1:]
    first = {r.split(",")[0]: float(r.split(",")[2]) for r in rows if r.split(",")[1] == "0"}
    # recorded starts 50 / 0 / 50.5 become 0 / 10 / 20; the copy starts 3 s after each
    assert first == {"late": 0.0, "early": 10.0, "later": 20.0, "late~r1": 3.0, "early~r1": 13.0, "later~r1": 23.0}
