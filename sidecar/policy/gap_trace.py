"""Gap traces: the gaps a sidecar observed (or a generator made up), one record per finished turn.

JSONL, one object a line: {"session_id", "tool_names": [..], "context_tokens", "gap_s", "t"?}
* gap_s: seconds from the end of the reply to the session's next request; null = never came back;
* t: when the reply ended (seconds, any origin). Without t, a timeline is made up: sessions start
  1 s apart in order of first appearance, and each turn takes 1 s plus the gap before it.
Also read: TraceLab's round-level replay CSV/JSONL (session_id or id, round_idx, prefix_len,
input_len, output_len, tool_wait_after_ms): context = prefix + input + output, gap = the wait after
the round, the last round of a session never comes back, tool name "(unknown)"; and the
benchmarks' agent-trace-v1 JSONL (header line, then one session a line with rounds of
append_tokens / output_tokens / tool_wait_s / optional reply): same rules, tool names from the
recorded reply's tool_calls when there is one, and a timeline from start_s.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

TURN_SECONDS_WITHOUT_T = 1.0
TRACELAB_TOOL = "(unknown)"
AGENT_TRACE_FORMAT = "agent-trace-v1"


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
    """Records of a gap JSONL or TraceLab CSV/JSONL file, with a timeline, sorted by t."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise GapTraceError(f"cannot read trace {path}: {exc}") from None
    if path.suffix.lower() == ".csv":
        rows = list(csv.DictReader(text.splitlines()))
        return with_timeline(tracelab_rounds_to_gaps(rows, path))
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise GapTraceError(f"{path}:{lineno}: not JSON: {exc}") from None
        if not isinstance(row, dict):
            raise GapTraceError(f"{path}:{lineno}: expected an object")
        rows.append((lineno, row))
    if rows and rows[0][1].get("format") == AGENT_TRACE_FORMAT:
        return with_timeline(agent_trace_to_gaps([r for _, r in rows[1:]], path))
    if rows and "tool_wait_after_ms" in rows[0][1]:
        return with_timeline(tracelab_rounds_to_gaps([r for _, r in rows], path))
    return with_timeline([_gap_record(row, path, lineno) for lineno, row in rows])


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


def tracelab_rounds_to_gaps(rows: list[dict], path: Path | str = "<rows>") -> list[GapRecord]:
    """One gap per TraceLab round: the wait after it; a session's last round never comes back."""
    sessions: dict[str, list[dict]] = {}
    for i, row in enumerate(rows):
        sid = row.get("session_id", row.get("id"))
        if sid is None:
            raise GapTraceError(f"{path}: row {i + 1} has no session_id/id")
        sessions.setdefault(str(sid), []).append(row)
    records = []
    for sid, rounds in sessions.items():
        rounds.sort(key=lambda r: int(float(r.get("round_idx", 0))))
        for i, r in enumerate(rounds):
            try:
                context = sum(int(float(r.get(k) or 0)) for k in ("prefix_len", "input_len", "output_len"))
                wait_ms = float(r.get("tool_wait_after_ms") or 0)
            except ValueError as exc:
                raise GapTraceError(f"{path}: session {sid} round {i}: {exc}") from None
            last = i == len(rounds) - 1
            records.append(GapRecord(sid, [TRACELAB_TOOL], context, None if last else wait_ms / 1000.0))
    return records


def agent_trace_to_gaps(sessions: list[dict], path: Path | str = "<rows>") -> list[GapRecord]:
    """One gap per round of an agent-trace-v1 session; the last round never comes back."""
    records = []
    for session in sessions:
        try:
            sid = str(session["session_id"])
            t = float(session.get("start_s", 0.0))
            context = 0
            rounds = session["rounds"]
            for i, r in enumerate(rounds):
                context += int(r.get("append_tokens", 0)) + int(r["output_tokens"])
                t += TURN_SECONDS_WITHOUT_T
                last = i == len(rounds) - 1
                gap = None if last else float(r.get("tool_wait_s", 0.0))
                records.append(GapRecord(sid, _reply_tools(r.get("reply")), context, gap, t))
                t += gap or 0.0
        except (KeyError, TypeError, ValueError) as exc:
            raise GapTraceError(f"{path}: bad agent-trace session: {exc!r}") from None
    return records


def _reply_tools(reply) -> list[str]:
    if not isinstance(reply, dict):
        return [TRACELAB_TOOL]
    calls = reply.get("tool_calls") or []
    return [str((c.get("function") or {}).get("name", "")) for c in calls if isinstance(c, dict)]


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
