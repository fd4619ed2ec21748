"""TraceLab (github.com/uw-syfi/TraceLab): its normalized round trace and its CSV export.

Round trace (``round_trace.jsonl``, or the commented ``round_trace.expanded.json``): one object per
LLM invocation. Fields used (TraceLab README, "Normalized Rows"): ``session_id``, ``round_index``,
``input_tokens_total`` (= ``prefix_tokens`` + ``newly_append_tokens``: the whole prompt),
``output_tokens``, ``prefix_tokens`` (the provider's cache hit), ``tools[].tool_name`` and
``timing_events[]`` (``event_type``, ISO ``timestamp``). The request is taken as sent at the
latest input event (``user_message`` / ``tool_result``: the last tool result or the user's
message), the reply as ended at the latest other event (reasoning, text, tool call, Codex
``usage_report``), so the gap is wall clock, parallel tools counted once, human waits included.

CSV export (``artifacts/trace_facts/csv_export``; also TraceLab's replayer's input, CSV or the
same rows as JSONL): ``id`` or ``session_id``, ``round_idx``, ``prefix_len``, ``input_len``,
``output_len``, ``tool_wait_after_ms``, optional ``arrival_time`` (ms, the session's start).
As TraceLab's replayer does, the prompt is ``prefix_len + input_len``: ``input_len`` is the
prompt minus what the provider cached, which already holds the previous reply. The export has
no timestamps: ``tool_wait_after_ms`` is the sum of the round's tool latencies (parallel tools
counted twice, 0 after a reply without tools however long the user took); read the round trace
for wall-clock gaps.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from sidecar_tools.benchmarks.trace_formats.calls import RecordedCall, RecordedSession, build_trace
from sidecar_tools.benchmarks.trace_formats.common import (
    TraceFormatError, epoch_seconds, json_records, number, require,
)
from sidecar_tools.benchmarks.traces import Trace

ROUNDS = "TraceLab round trace"
CSV_EXPORT = "TraceLab CSV export"
INPUT_EVENTS = frozenset({"user_message", "tool_result"})
CSV_COLUMNS = ("round_idx", "prefix_len", "input_len", "output_len", "tool_wait_after_ms")


def read_tracelab_rounds(path: Path, start_spacing_s: float | None = None) -> Trace:
    grouped: dict[str, list[tuple[int, int, str, dict[str, Any]]]] = {}
    for order, (line, row) in enumerate(json_records(path)):
        where = f"{path}:{line}"
        require(row, ("session_id", "round_index", "output_tokens"), where, ROUNDS)
        index = int(number(row, "round_index", where, ROUNDS))
        grouped.setdefault(str(row["session_id"]), []).append((index, order, where, row))
    sessions = []
    for sid, rows in grouped.items():
        rows.sort(key=lambda r: (r[0], r[1]))
        sessions.append(RecordedSession(sid, [_round_call(row, where) for _, _, where, row in rows]))
    meta = {"source": str(path), "reader": "tracelab-rounds", "gaps": "wall clock: last reply event to the next request"}
    return build_trace(path.stem, sessions, meta, start_spacing_s=start_spacing_s)


def _round_call(row: dict[str, Any], where: str) -> RecordedCall:
    if row.get("input_tokens_total") is not None:
        prompt = number(row, "input_tokens_total", where, ROUNDS)
    else:
        require(row, ("prefix_tokens", "newly_append_tokens"), where, f"{ROUNDS} (no 'input_tokens_total')")
        prompt = number(row, "prefix_tokens", where, ROUNDS) + number(row, "newly_append_tokens", where, ROUNDS)
    request, reply_end = _round_times(row, where)
    tools = sorted((t for t in row.get("tools") or [] if isinstance(t, dict)), key=lambda t: t.get("tool_index") or 0)
    prefix = row.get("prefix_tokens")
    return RecordedCall(
        output_tokens=int(number(row, "output_tokens", where, ROUNDS)),
        prompt_tokens=int(prompt),
        request_t=request,
        reply_end_t=reply_end,
        tool_names=[str(t.get("tool_name") or "") for t in tools],
        prefix_len=int(prefix) if isinstance(prefix, (int, float)) else None,
    )


def _round_times(row: dict[str, Any], where: str) -> tuple[float, float]:
    events = [e for e in row.get("timing_events") or [] if isinstance(e, dict) and e.get("timestamp")]
    if not events:
        raise TraceFormatError(f"{where}: {ROUNDS}: the record lacks 'timing_events' with a 'timestamp'")
    inputs = [epoch_seconds(e["timestamp"], where, ROUNDS) for e in events if e.get("event_type") in INPUT_EVENTS]
    outputs = [epoch_seconds(e["timestamp"], where, ROUNDS) for e in events if e.get("event_type") not in INPUT_EVENTS]
    request = max(inputs) if inputs else min(outputs)
    return request, max(outputs) if outputs else request


def read_tracelab_csv(path: Path, start_spacing_s: float | None = None) -> Trace:
    grouped: dict[str, list[tuple[int, int, dict[str, Any]]]] = {}
    for order, (where, row) in enumerate(_csv_rows(path)):
        sid = row.get("session_id", row.get("id"))
        if sid in (None, ""):
            raise TraceFormatError(f"{where}: {CSV_EXPORT}: the record lacks 'id' (or 'session_id')")
        require(row, CSV_COLUMNS, where, CSV_EXPORT)
        values = {c: number(row, c, where, CSV_EXPORT) for c in CSV_COLUMNS}
        if row.get("arrival_time") not in (None, ""):
            values["arrival_time"] = number(row, "arrival_time", where, CSV_EXPORT)
        grouped.setdefault(str(sid), []).append((int(values["round_idx"]), order, values))
    sessions = []
    for sid, rows in grouped.items():
        rows.sort(key=lambda r: (r[0], r[1]))
        calls = [RecordedCall(
            output_tokens=int(v["output_len"]),
            prompt_tokens=int(v["prefix_len"] + v["input_len"]),
            gap_after_s=max(0.0, v["tool_wait_after_ms"] / 1000.0),
            prefix_len=int(v["prefix_len"]),
        ) for _, _, v in rows]
        sessions.append(RecordedSession(sid, calls, start_t=rows[0][2].get("arrival_time", 0.0) / 1000.0))
    meta = {"source": str(path), "reader": "tracelab-csv",
            "gaps": "tool_wait_after_ms: summed tool latencies (parallel tools twice, 0 after replies without tools)"}
    return build_trace(path.stem, sessions, meta, origin_t=0.0, start_spacing_s=start_spacing_s)


def _csv_rows(path: Path):
    """(where, row) of a CSV file, or of the same rows as JSONL."""
    if path.suffix.lower() == ".csv":
        try:
            with path.open(newline="", encoding="utf-8") as f:
                reader = csv.DictReader(f)
                for row in reader:
                    yield f"{path}:{reader.line_num}", row
        except (OSError, UnicodeDecodeError, csv.Error) as exc:
            raise TraceFormatError(f"cannot read {path} as CSV: {exc}") from None
        return
    for line, row in json_records(path):
        yield f"{path}:{line}", row
