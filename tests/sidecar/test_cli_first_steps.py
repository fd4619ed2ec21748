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
