"""The layers import one way: the contracts in pyproject.toml ([tool.importlinter]) hold."""

from __future__ import annotations

from pathlib import Path

from importlinter.cli import lint_imports

REPO_ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_hold(monkeypatch):
    monkeypatch.chdir(REPO_ROOT)  # lint-imports reads pyproject.toml from the working directory
    assert lint_imports(config_filename=str(REPO_ROOT / "pyproject.toml")) == 0
