"""What every trace reader shares: its error, reading JSON records, and naming a missing field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any


class TraceFormatError(ValueError):
    """A trace that cannot be read; the message names the file, the line, the format guessed and
    the field that is missing or wrong."""


def json_records(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, value) of every JSON value in the file, one per line or pretty-printed.

    Lines that start with ``#`` and separator lines that start with ``=====`` are skipped: TraceLab
    ships its ``*.expanded.json`` files as a commented stream of indented objects.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"cannot read trace {path}: {exc}") from None
    lines = text.splitlines(keepends=True)
    text = "".join("\n" if ln.lstrip().startswith(("#", "=====")) else ln for ln in lines)
    decoder = json.JSONDecoder()
    pos, line, counted = 0, 1, 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return
        line += text.count("\n", counted, pos)
        counted = pos
        try:
            value, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise TraceFormatError(f"{path}:{line}: not JSON: {exc.msg}") from None
        yield line, value
        pos = end


def require(row: Any, fields: tuple[str, ...], where: str, fmt: str) -> None:
    """Raise unless ``row`` is an object holding every field (None counts as missing)."""
    if not isinstance(row, dict):
        raise TraceFormatError(f"{where}: {fmt}: expected an object, got {type(row).__name__}")
    missing = [f for f in fields if row.get(f) in (None, "")]
    if missing:
        raise TraceFormatError(f"{where}: {fmt}: the record lacks {', '.join(repr(f) for f in missing)}")


def number(row: dict[str, Any], field: str, where: str, fmt: str) -> float:
    """``row[field]`` as a float, or an error naming the field."""
    try:
        return float(row[field])
    except (KeyError, TypeError, ValueError):
        raise TraceFormatError(f"{where}: {fmt}: {field!r} is not a number: {row.get(field)!r}") from None


def epoch_seconds(value: Any, where: str, fmt: str) -> float:
    """A timestamp as seconds since the epoch: epoch seconds or milliseconds, or ISO 8601."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value) / (1000.0 if value > 1e11 else 1.0)
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise TraceFormatError(f"{where}: {fmt}: timestamp {value!r} is not epoch seconds/ms or ISO 8601") from None
