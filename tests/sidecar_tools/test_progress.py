"""Progress bars of the long tools: on a terminal they draw, in a log or a pipe they stay silent."""

from __future__ import annotations

import io

from sidecar_tools.progress import progress_bar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_draws_on_a_terminal():
    out = _Terminal()
    with progress_bar(4, "replay", file=out) as bar:
        bar.update()
        bar.refresh()
        assert "replay" in out.getvalue() and "1/4" in out.getvalue()


def test_a_bar_is_silent_when_not_a_terminal():
    out = io.StringIO()
    with progress_bar(4, "replay", file=out) as bar:
        bar.update(4)
    assert out.getvalue() == ""
