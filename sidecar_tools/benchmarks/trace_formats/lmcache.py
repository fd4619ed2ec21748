"""LMCache's agent traces (github.com/LMCache/lmcache-agent-trace, format of LMCache RFC #1826).

One request per line, in any order: ``{"timestamp": <microseconds>, "input": "<prompt text>",
"output": "<reply text>", "session_id": ...}``. A session is every line with its id, in
timestamp order. Only texts are recorded, so they are counted with a tokenizer.

* ``timestamp`` is when the request was sent: in the mini-swe-agent files the time to the next
  request grows with this reply's length (Pearson r 0.57), not with the next one's (0.16).
* append: mini-swe-agent's ``input`` is the task and the observations so far, without the
  replies; each request's input extends the previous one, and the extension is the append (a
  reply text found in it is taken out: the replay resends the replies itself). An input that
  does not extend the previous one is a new context (see ``calls``).
* gap: the recording has no reply times. By default the whole time to the next request counts as
  the gap (an upper bound: it also holds generating the reply); ``reply_tokens_per_s`` takes
  out ``output_tokens / reply_tokens_per_s`` of it as the reply's duration.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from sidecar_tools.benchmarks.trace_formats.calls import RecordedCall, RecordedSession, build_trace
from sidecar_tools.benchmarks.trace_formats.common import TraceFormatError, json_records, number, require
from sidecar_tools.benchmarks.traces import Trace

FORMAT = "LMCache agent trace"
FIELDS = ("timestamp", "input", "session_id")


def read_lmcache(path: Path, count_tokens: Callable[[str], int], start_spacing_s: float | None = None,
                 reply_tokens_per_s: float | None = None) -> Trace:
    grouped: dict[str, list[tuple[float, int, dict[str, Any]]]] = {}
    for order, (line, row) in enumerate(json_records(path)):
        where = f"{path}:{line}"
        require(row, FIELDS, where, FORMAT)
        if not isinstance(row["input"], str) or not isinstance(row.get("output", ""), str):
            raise TraceFormatError(f"{where}: {FORMAT}: 'input' and 'output' must be strings")
        t = number(row, "timestamp", where, FORMAT) / 1e6
        grouped.setdefault(str(row["session_id"]), []).append((t, order, row))
    reordered = 0
    sessions = []
    for sid, rows in grouped.items():
        ordered = sorted(rows, key=lambda r: (r[0], r[1]))
        reordered += sum(a[1] != b[1] for a, b in zip(rows, ordered))
        sessions.append(RecordedSession(sid, _calls(ordered, count_tokens, reply_tokens_per_s)))
    gaps = ("time to the next request minus output_tokens / reply_tokens_per_s" if reply_tokens_per_s
            else "time to the next request (includes generating the reply)")
    meta = {"source": str(path), "reader": "lmcache", "gaps": gaps,
            "notes": {"rows_out_of_timestamp_order": reordered}}
    return build_trace(path.stem, sessions, meta, start_spacing_s=start_spacing_s)


def _calls(rows: list[tuple[float, int, dict[str, Any]]], count_tokens: Callable[[str], int],
           reply_tokens_per_s: float | None) -> list[RecordedCall]:
    calls: list[RecordedCall] = []
    prev: dict[str, Any] | None = None
    for t, _, row in rows:
        text, output = row["input"], row.get("output") or ""
        new_context = prev is not None and not text.startswith(prev["input"])
        if prev is not None and not new_context:
            text = text[len(prev["input"]):]
            reply = prev.get("output") or ""
            if reply and reply in text:
                text = text.replace(reply, "", 1)
        n_out = max(1, count_tokens(output))
        reply_s = n_out / reply_tokens_per_s if reply_tokens_per_s else 0.0
        calls.append(RecordedCall(output_tokens=n_out, append_tokens=count_tokens(text), new_context=new_context,
                                  request_t=t, reply_end_t=t + reply_s))
        prev = row
    return calls
