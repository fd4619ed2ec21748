"""What a newcomer meets first on the command line: a port already taken is named by the flag that
moves it, and ``serve --help`` names the three front doors."""

from __future__ import annotations

import socket

from click.testing import CliRunner

from sidecar.cli import main


def _taken_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock, sock.getsockname()[1]


def test_demo_names_engine_port_when_its_port_is_taken(qwen3_tokenizer_dir):
    sock, port = _taken_port()
    with sock:
        result = CliRunner().invoke(main, ["demo", "--tokenizer", str(qwen3_tokenizer_dir), "--engine-port", str(port)])
    assert result.exit_code != 0 and "--engine-port" in result.output and "in use" in result.output


def test_serve_names_port_when_its_port_is_taken():
    sock, port = _taken_port()
    with sock:
        result = CliRunner().invoke(main, ["serve", "--port", str(port), "--", "true"])
    assert result.exit_code != 0 and "--port" in result.output and "in use" in result.output


def test_serve_help_names_the_three_doors():
    text = CliRunner().invoke(main, ["serve", "--help"]).output
    assert all(door in text for door in ("/v1/chat/completions", "/v1/messages", "/v1/responses"))


def test_with_json_logs_the_engines_lines_are_logged_not_printed(caplog, unused_tcp_port):
    import logging
    import sys
    import time

    from sidecar.supervisor import EngineProcess

    engine = EngineProcess([sys.executable, "-c", "print('engine says hi', flush=True)"],
                           f"http://127.0.0.1:{unused_tcp_port}", relay_lines=True)
    with caplog.at_level(logging.INFO, logger="sidecar.engine"):
        engine.start()
        engine.proc.wait(10)
        deadline = time.monotonic() + 5
        while not any("engine says hi" in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert [r.getMessage() for r in caplog.records if r.name == "sidecar.engine"] == ["engine says hi"]
    engine.stop()
