"""Gap traces: the gaps a sidecar observed (or a generator made up), one record per finished turn.

JSONL, one object a line: {"session_id", "tool_names": [..], "context_tokens", "gap_s", "t"?}
* gap_s: seconds from the end of the reply to the session's next request; null = never came back;
* t: when the reply ended (seconds, any origin). Without t, a timeline is made up: sessions start
  1 s apart in order of first appearance, and each turn takes 1 s plus the gap before it.
Every replay trace of the benchmarks is read too, through their one trace model
(``sidecar_tools.benchmarks.traces.read_any``: agent-trace-v1, TraceLab's round trace and CSV
export, LMCache's agent traces, OpenAI conversations): one record per round, context = the round's
prompt + reply, gap = the wall-clock wait after it, the last round never comes back, tool names
from the recording ("(unknown)" where it has none), the timeline from the sessions' start_s and
each round's recorded duration (1 s where none is recorded).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

TURN_SECONDS_WITHOUT_T = 1.0
UNKNOWN_TOOLS = "(unknown)"


@dataclass
class GapRecord:
    session_id: str
    tool_names: list[str] = field(default_factory=list)
    context_tokens: int = 0
    gap_s: float | None = None  # None = the session never came back
    t: float | None = None  # when the reply ended

    def to_json(self) -> str:
        data = asdict(self)
        if data["t"] is None:
            del data["t"]
        else:
            data["t"] = round(data["t"], 4)
        if data["gap_s"] is not None:
            data["gap_s"] = round(data["gap_s"], 4)
        return json.dumps(data, separators=(",", ":"))


class GapTraceError(ValueError):
    """A trace file that cannot be read; the message names the file and line."""


def read_gap_trace(path: str | Path) -> list[GapRecord]:
    """Records of a gap JSONL file or of any benchmark trace, with a timeline, sorted by t."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise GapTraceError(f"cannot read trace {path}: {exc}") from None
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not _is_gap_jsonl(path, lines):  # the first record tells the format; the rest is parsed once, by its reader
        return with_timeline(trace_to_gaps(_read_replay_trace(path)))
    return with_timeline([_gap_record(_json_object(line, path, n), path, n) for n, line in lines])


def _is_gap_jsonl(path: Path, lines: list[tuple[int, str]]) -> bool:
    if path.suffix.lower() == ".csv" or not lines:
        return False
    try:
        first = json.loads(lines[0][1])
    except json.JSONDecodeError:
        return False  # not JSON lines: a commented or pretty-printed trace, for the trace readers
    return isinstance(first, dict) and "gap_s" in first


def _json_object(line: str, path: Path, lineno: int) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise GapTraceError(f"{path}:{lineno}: not JSON: {exc}") from None
    if not isinstance(row, dict):
        raise GapTraceError(f"{path}:{lineno}: expected an object")
    return row


def _read_replay_trace(path: Path):
    from sidecar_tools.benchmarks.traces import read_any  # the benchmarks' trace model (imported only here)

    try:
        return read_any(path)
    except (ValueError, KeyError, TypeError, StopIteration) as exc:
        raise GapTraceError(f"{path}: not a gap trace nor a replay trace: {exc}") from None


def write_gap_trace(records: Iterable[GapRecord], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as out:
        out.writelines(record.to_json() + "\n" for record in records)


def _gap_record(row: dict, path: Path, lineno: int) -> GapRecord:
    try:
        gap = row.get("gap_s")
        t = row.get("t")
        tools = row.get("tool_names") or []
        if not isinstance(tools, list):
            raise ValueError("tool_names must be a list")
        record = GapRecord(
            session_id=str(row["session_id"]),
            tool_names=[str(n) for n in tools],
            context_tokens=int(row.get("context_tokens", 0)),
            gap_s=None if gap is None else float(gap),
            t=None if t is None else float(t),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise GapTraceError(f"{path}:{lineno}: bad gap record: {exc!r}") from None
    if record.gap_s is not None and record.gap_s < 0:
        raise GapTraceError(f"{path}:{lineno}: negative gap_s")
    return record


def trace_to_gaps(trace) -> list[GapRecord]:
    """One gap per round of a ``sidecar_tools.benchmarks.traces.Trace``; a session's last round never comes back."""
    records = []
    for session in trace.sessions:
        t, context = session.start_s, 0
        for i, r in enumerate(session.rounds):
            context += r.append_tokens + r.output_tokens
            t += r.service_s if r.service_s is not None else TURN_SECONDS_WITHOUT_T
            gap = None if i == len(session.rounds) - 1 else r.tool_wait_s
            tools = r.called_tools()
            records.append(GapRecord(session.session_id, [UNKNOWN_TOOLS] if tools is None else tools, context, gap, t))
            t += gap or 0.0
    return records


def with_timeline(records: list[GapRecord]) -> list[GapRecord]:
    """Records sorted by t; t made up (see module doc) where the trace has none."""
    if all(r.t is not None for r in records):
        return sorted(records, key=lambda r: r.t)
    clock: dict[str, float] = {}
    timed = []
    for record in records:
        if record.session_id not in clock:
            clock[record.session_id] = float(len(clock))
        t = clock[record.session_id] + TURN_SECONDS_WITHOUT_T
        timed.append(replace(record, t=t))
        clock[record.session_id] = t + (record.gap_s or 0.0)
    return sorted(timed, key=lambda r: r.t)
