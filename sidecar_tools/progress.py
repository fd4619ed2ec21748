"""Progress bars of the long-running tools (``simulate``, ``benchmarks.replay``, ``gap-replay``):
drawn on stderr when it is a terminal, silent otherwise (CI logs, pipes, ``| tee``), so a log
file holds the same summary lines as before."""

from __future__ import annotations

import sys
from typing import IO

from tqdm import tqdm


def progress_bar(total: int, desc: str, unit: str = "turn", file: IO[str] | None = None) -> tqdm:
    """A bar counting ``total`` items; ``disable=None`` is tqdm's "only on a terminal"."""
    return tqdm(total=total, desc=desc, unit=unit, file=file or sys.stderr, disable=None, leave=False,
                dynamic_ncols=True, mininterval=0.5)
