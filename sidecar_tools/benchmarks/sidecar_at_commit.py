"""Start the sidecar of another commit, for the load test's ``LOAD_TEST_SIDECAR_LAUNCH``: the same
load test and engine stand-in then measure an older sidecar against this one.

    git worktree add /tmp/sidecar-old c20c19b
    LOAD_TEST_SIDECAR_LAUNCH="python3 -m sidecar_tools.benchmarks.sidecar_at_commit /tmp/sidecar-old" \\
        python -m sidecar_tools.benchmarks.load_benchmark --mode sidecar --sessions 250 --duration 30 ...

The worktree's ``sidecar`` package goes first on ``sys.path``; flags the older CLI did not have
(``--model-name``, which the load test passes) are dropped; a commit that has them keeps them.
"""

from __future__ import annotations

import subprocess
import sys

FLAGS_WITH_VALUE_IT_MAY_LACK = ("--model-name",)


def use_checkout(worktree: str) -> None:
    """Import ``sidecar`` from ``worktree`` from now on: its package first on ``sys.path``, and this
    repo's modules forgotten if anything imported them."""
    sys.path.insert(0, worktree)
    for name in [m for m in sys.modules if m == "sidecar" or m.startswith("sidecar.")]:
        del sys.modules[name]


def commit_of(path: str) -> str | None:
    """The commit the checkout at ``path`` is at (None: not a git checkout, or no git)."""
    try:
        done = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def main() -> None:
    worktree, *argv = sys.argv[1:]
    use_checkout(worktree)
    from sidecar.cli import main as sidecar_main

    serve = getattr(sidecar_main, "commands", {}).get("serve")
    known = {opt for param in serve.params for opt in param.opts} if serve is not None else set()
    for flag in FLAGS_WITH_VALUE_IT_MAY_LACK:
        if flag in argv and flag not in known:  # a commit that has the flag keeps it (the agents' model name)
            i = argv.index(flag)
            del argv[i : i + 2]
    sys.argv = ["sidecar", *argv]
    sidecar_main()


if __name__ == "__main__":
    main()
