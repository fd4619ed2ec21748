"""The published agent CLIs the tests run, pinned, and how they are installed and configured.

``python3 tests/agents_cli/agent_clis.py`` installs them (``.ci/run`` does, before the tests);
the test installs them itself when they are missing. They go to ``$SIDECAR_AGENT_CLIS`` (default
``~/.cache/sglang-sidecar/agent-clis``), one folder per pinned pair, so a CI cache of that folder
(or of npm's own cache) skips the download. Each CLI is configured as README's "Point your agent at
it" says, plus what keeps a test run local: a throwaway HOME, and an HTTP(S) proxy at 127.0.0.1:9
(nothing listens) for every host but 127.0.0.1, so an attempt to reach anything else fails instead
of leaving the machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CLAUDE_CODE_VERSION = "2.1.332"  # @anthropic-ai/claude-code, npm's latest on 2026-12-01
CODEX_VERSION = "0.171.0"  # @openai/codex, npm's latest on 2026-12-01
PACKAGES = (f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}", f"@openai/codex@{CODEX_VERSION}")
NOWHERE_PROXY = "http://127.0.0.1:9"  # closed: a request to any other host fails at once


def install_dir() -> Path:
    root = Path(os.environ.get("SIDECAR_AGENT_CLIS", Path.home() / ".cache" / "sglang-sidecar" / "agent-clis"))
    return root / f"claude-code-{CLAUDE_CODE_VERSION}-codex-{CODEX_VERSION}"


def binaries(folder: Path | None = None) -> dict[str, Path]:
    bin_dir = (folder or install_dir()) / "node_modules" / ".bin"
    return {"claude": bin_dir / "claude", "codex": bin_dir / "codex"}


def install(timeout_s: float = 300.0) -> dict[str, Path]:
    """The pinned CLIs, installed with npm unless already there; RuntimeError when npm is missing or fails."""
    found = binaries()
    if all(p.exists() for p in found.values()):
        return found
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is not installed (Node.js >= 20 brings it): the agent CLIs come from npm")
    folder = install_dir()
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [npm, "install", "--no-audit", "--no-fund", "--prefix", str(folder), *PACKAGES]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0 or not all(p.exists() for p in found.values()):
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return found


def local_only_env(home: Path) -> dict[str, str]:
    """The environment both CLIs run in: a fresh HOME, every host but 127.0.0.1 behind a closed proxy."""
    env = {k: v for k, v in os.environ.items() if not k.upper().endswith("_PROXY") and not k.startswith(("ANTHROPIC_", "OPENAI_", "CODEX_"))}
    env.update(HOME=str(home), HTTPS_PROXY=NOWHERE_PROXY, HTTP_PROXY=NOWHERE_PROXY, ALL_PROXY=NOWHERE_PROXY,
               https_proxy=NOWHERE_PROXY, http_proxy=NOWHERE_PROXY, NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    return env


def claude_code_env(home: Path, sidecar_url: str, model: str, key: str = "unused") -> dict[str, str]:
    """README's settings for Claude Code (base URL without /v1, every model alias the served id), and
    its switches for no traffic but the API's (no telemetry, error reports, update checks)."""
    env = local_only_env(home)
    env.update(
        ANTHROPIC_BASE_URL=sidecar_url, ANTHROPIC_AUTH_TOKEN=key, ANTHROPIC_MODEL=model,
        ANTHROPIC_DEFAULT_HAIKU_MODEL=model, ANTHROPIC_DEFAULT_SONNET_MODEL=model, ANTHROPIC_DEFAULT_OPUS_MODEL=model,
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_AUTOUPDATER="1",
    )
    return env


CODEX_CONFIG = """\
model = "{model}"
model_provider = "sidecar"

[model_providers.sidecar]
name = "sglang-sidecar"
base_url = "{sidecar_url}/v1"
env_key = "SIDECAR_API_KEY"
wire_api = "responses"
"""


def codex_env(home: Path, sidecar_url: str, model: str, key: str = "unused") -> dict[str, str]:
    """README's ``config.toml`` for Codex (in ``CODEX_HOME``), the key in ``SIDECAR_API_KEY``."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(CODEX_CONFIG.format(model=model, sidecar_url=sidecar_url))
    env = local_only_env(home)
    env.update(CODEX_HOME=str(codex_home), SIDECAR_API_KEY=key)
    return env


if __name__ == "__main__":  # .ci/run: install before the tests
    for name, path in install().items():
        print(f"{name}: {path}")
    sys.exit(0)
