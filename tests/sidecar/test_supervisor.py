"""The engine as the sidecar's child (`serve -- ENGINE...`, `demo`): started in a process group of
its own, waited for, and stopped with the sidecar however the sidecar stops; no orphan keeps its
port. Real processes throughout (spawned with ``sys.executable -m sidecar`` from the repo root)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner

from sidecar.cli import main
from sidecar.supervisor import EngineFailed, EngineProcess, answers_health

REPO = Path(__file__).resolve().parents[2]
FAKE = Path(__file__).with_name("fake_engine_process.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _running(pid: int) -> bool:
    """Alive and not a zombie (a container's init may be slow to reap)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _running(pid)


def _fake(port: int, *flags: str) -> list[str]:
    return [sys.executable, str(FAKE), str(port), *flags]


def _wait_health(url: str, proc: subprocess.Popen, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while not answers_health(url):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, f"{url} did not come up"
        time.sleep(0.2)


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "sidecar", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


# --------------------------------------------------------------------------- the engine process


def test_the_engine_and_what_it_started_stop_together(tmp_path):
    port, pids = _free_port(), tmp_path / "pids.json"
    engine = EngineProcess(_fake(port, "--delay", "0.5", "--pids", str(pids)), f"http://127.0.0.1:{port}")
    engine.start()
    try:
        assert engine.wait_ready(30) >= 0.5
        started = json.loads(pids.read_text())
        assert started["engine"] == engine.pid and _running(started["child"])
    finally:
        engine.stop(grace_s=5)
    assert _gone(started["engine"]) and _gone(started["child"])
    assert not answers_health(f"http://127.0.0.1:{port}")


def test_an_engine_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    port, pids = _free_port(), tmp_path / "pids.json"
    engine = EngineProcess(_fake(port, "--ignore-term", "--pids", str(pids)), f"http://127.0.0.1:{port}")
    engine.start()
    engine.wait_ready(30)
    started = time.monotonic()
    assert engine.stop(grace_s=0.5) == -signal.SIGKILL
    assert time.monotonic() - started < 5
    assert _gone(json.loads(pids.read_text())["child"])


def test_an_engine_that_exits_before_it_answers_is_a_clear_failure():
    port = _free_port()
    engine = EngineProcess(_fake(port, "--delay", "30", "--exit-after", "0.2"), f"http://127.0.0.1:{port}")
    engine.start()
    with pytest.raises(EngineFailed, match="exited with code 3 before it answered"):
        engine.wait_ready(30)
    engine.stop()


def test_an_engine_port_already_answering_is_refused_before_starting(tmp_path):
    port = _free_port()
    left_running = EngineProcess(_fake(port), f"http://127.0.0.1:{port}")
    left_running.start()
    try:
        left_running.wait_ready(30)
        marker = tmp_path / "started"
        second = EngineProcess([sys.executable, "-c", f"open({str(marker)!r}, 'w')"], f"http://127.0.0.1:{port}")
        with pytest.raises(EngineFailed, match="already answers"):
            second.start()
        assert second.pid is None and not marker.exists()
    finally:
        left_running.stop()


def test_a_busy_sidecar_port_fails_before_the_engine_starts(tmp_path):
    marker = tmp_path / "started"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["serve", "--port", str(port), "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"])
    assert result.exit_code != 0 and "in use" in result.output
    assert not marker.exists()


# --------------------------------------------------------------------------- serve -- ENGINE, end to end


@pytest.mark.parametrize("stop_with", [signal.SIGINT, signal.SIGTERM])
def test_serve_starts_the_engine_waits_for_it_and_stops_both(tmp_path, qwen3_tokenizer_dir, stop_with):
    engine_port, port, pids = _free_port(), _free_port(), tmp_path / "pids.json"
    proc = _spawn("serve", "--port", str(port), "--sglang-url", f"http://127.0.0.1:{engine_port}",
                  "--tokenizer", str(qwen3_tokenizer_dir), "--", *_fake(engine_port, "--delay", "1", "--pids", str(pids)))
    try:
        _wait_health(f"http://127.0.0.1:{port}", proc, 120)
        started = json.loads(pids.read_text())
        proc.send_signal(stop_with)  # Ctrl+C reaches only the sidecar: the engine has its own process group
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert f"point an OpenAI client at http://127.0.0.1:{port}/v1" in err
    assert f"pid {started['engine']}" in err
    assert "waiting for SGLang" not in err  # the sidecar started once the engine answered
    assert _gone(started["engine"]) and _gone(started["child"])
    assert not answers_health(f"http://127.0.0.1:{engine_port}")


def test_the_sidecar_stops_when_its_engine_dies(tmp_path, qwen3_tokenizer_dir):
    engine_port, port, pids = _free_port(), _free_port(), tmp_path / "pids.json"
    proc = _spawn("serve", "--port", str(port), "--sglang-url", f"http://127.0.0.1:{engine_port}", "--log-format", "json",
                  "--tokenizer", str(qwen3_tokenizer_dir), "--", *_fake(engine_port, "--pids", str(pids)))
    try:
        _wait_health(f"http://127.0.0.1:{port}", proc, 120)
        os.kill(json.loads(pids.read_text())["engine"], signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode != 0 and "the engine exited (code -9); the sidecar stopped with it" in err
    records = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert any(r["level"] == "ERROR" and r["logger"] == "sidecar.supervisor" and "exited with code -9" in r["message"]
               for r in records)
    assert any(r["message"].startswith("starting on ") for r in records)  # the start-up summary, as JSON too
    assert _gone(json.loads(pids.read_text())["child"])  # the rest of its group went too


# --------------------------------------------------------------------------- demo


def test_demo_needs_a_tokenizer_and_says_how_to_get_one():
    result = CliRunner().invoke(main, ["demo"])
    assert result.exit_code != 0 and "qwen3_tokenizer" in result.output


def test_demo_is_the_main_job_in_one_command(qwen3_tokenizer_dir):
    """README command 1: the simulated engine and the sidecar, one OpenAI call through both, Ctrl+C."""
    engine_port, port = _free_port(), _free_port()
    proc = _spawn("demo", "--tokenizer", str(qwen3_tokenizer_dir), "--config", str(REPO / "configs/coding-agent.toml"),
                  "--port", str(port), "--engine-port", str(engine_port), "--kv-tokens", "20000")
    try:
        _wait_health(f"http://127.0.0.1:{port}", proc, 240)
        models = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10))
        body = {"model": models["data"][0]["id"], "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        reply = json.load(urllib.request.urlopen(request, timeout=60))
        assert reply["usage"]["completion_tokens"] == 4
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert f"point an OpenAI client at http://127.0.0.1:{port}/v1" in err
    assert "the engine stopped" in err
    assert not answers_health(f"http://127.0.0.1:{engine_port}")
