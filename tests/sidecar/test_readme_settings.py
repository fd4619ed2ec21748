"""The settings table README links (docs/settings.md) is what ``sglang-sidecar settings --format markdown``
prints, row for row: a setting added to the model (``--worker-urls``, ``--smg-url``, ...) and not to the
table fails here."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from sidecar.cli import main

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TABLE = ROOT / "docs" / "settings.md"
BEGIN, END = "<!-- settings:begin -->\n", "\n<!-- settings:end -->"


def test_readme_settings_table_is_the_generated_one():
    assert "docs/settings.md" in README.read_text()
    text = TABLE.read_text()
    table = text[text.index(BEGIN) + len(BEGIN): text.index(END)].strip()
    printed = CliRunner().invoke(main, ["settings", "--format", "markdown"])
    assert printed.exit_code == 0, printed.output
    assert table == printed.output.strip(), "docs/settings.md differs: regenerate it from `sglang-sidecar settings --format markdown`"
    assert "`--worker-urls`" in table and "`--smg-url`" in table


def test_a_headroom_over_one_is_refused():
    from sidecar.settings import SettingsError, load_settings

    try:
        load_settings(overrides={"admission": {"headroom": 1.5}})
    except SettingsError as exc:
        assert "headroom" in str(exc)
    else:
        raise AssertionError("headroom 1.5 was accepted")
