"""The command line: documented flags, config files, and one-line failures instead of tracebacks."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from sidecar.cli import main
from sidecar.settings import flag_name, iter_fields, load_settings

SETTINGS_DOC = Path(__file__).resolve().parents[2] / "docs" / "settings.md"  # README's settings table


def test_every_setting_is_a_documented_flag():
    help_text = CliRunner().invoke(main, ["serve", "--help"], terminal_width=200).output
    readme = SETTINGS_DOC.read_text()
    for section, name, _ in iter_fields():
        flag = f"--{flag_name(section, name)}"
        assert flag in help_text, flag
        assert f"`{flag}`" in readme, f"docs/settings.md does not document {flag}"
    assert "--config" in help_text


def test_settings_template_round_trips_as_a_config_file(tmp_path):
    out = CliRunner().invoke(main, ["settings"])
    assert out.exit_code == 0
    path = tmp_path / "sidecar.toml"
    path.write_text(out.output.replace("port = 8000", "port = 9001"))
    settings = load_settings(path)
    assert settings.server.port == 9001
    # Flags override the file.
    assert load_settings(path, {"server": {"port": 9002}}).server.port == 9002


def test_bad_config_is_one_clear_message(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[server]\nport = 'eighty'\n")
    result = CliRunner().invoke(main, ["serve", "--config", str(bad)])
    assert result.exit_code != 0
    assert "server.port" in result.output and "Traceback" not in result.output

    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[server]\nprot = 1\n")
    result = CliRunner().invoke(main, ["serve", "--config", str(unknown)])
    assert result.exit_code != 0 and "prot" in result.output

    broken = tmp_path / "broken.toml"
    broken.write_text("[server\n")
    result = CliRunner().invoke(main, ["serve", "--config", str(broken)])
    assert result.exit_code != 0 and "not valid TOML" in result.output

    result = CliRunner().invoke(main, ["serve", "--config", str(tmp_path / "missing.toml")])
    assert result.exit_code != 0 and "not found" in result.output


def test_unloadable_tokenizer_is_one_clear_message(tmp_path):
    result = CliRunner().invoke(main, ["serve", "--tokenizer", str(tmp_path / "nowhere")])
    assert result.exit_code != 0
    assert "cannot load a tokenizer" in result.output and "Traceback" not in result.output
    assert "no such folder" in result.output and "Repo id" not in result.output  # not a malformed hub id
    (tmp_path / "empty").mkdir()
    result = CliRunner().invoke(main, ["serve", "--tokenizer", str(tmp_path / "empty")])
    assert result.exit_code != 0 and "cannot load a tokenizer" in result.output and "Traceback" not in result.output


def test_flag_values_are_validated(tmp_path):
    result = CliRunner().invoke(main, ["serve", "--port", "70000"])
    assert result.exit_code != 0 and "port" in result.output


def test_event_loop_choice(monkeypatch):
    import asyncio
    import sys

    import click
    import pytest

    from sidecar.cli import new_event_loop

    loop = new_event_loop("asyncio")
    assert type(loop).__module__.startswith("asyncio")
    loop.close()
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if it were not installed
    loop = new_event_loop("auto")
    assert isinstance(loop, asyncio.AbstractEventLoop) and type(loop).__module__.startswith("asyncio")
    loop.close()
    with pytest.raises(click.ClickException, match="uvloop"):
        new_event_loop("uvloop")
