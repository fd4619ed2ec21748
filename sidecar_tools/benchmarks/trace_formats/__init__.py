"""Readers of recorded agent traces, in the shapes their publishers ship, into the trace model.

``read_trace(path)`` tells the format by the file's first record and reads it:

=======================  =======================================================  ==========================
format                   told by                                                  reader
=======================  =======================================================  ==========================
agent-trace-v1 (ours)    header ``{"format": "agent-trace-v1"}``                  ``traces.load_jsonl``
TraceLab round trace     ``round_index`` / ``input_tokens_total`` /               ``tracelab.read_tracelab_rounds``
                         ``timing_events`` (JSONL or commented expanded JSON)
TraceLab CSV export      a ``.csv`` file, or JSON rows with ``round_idx``         ``tracelab.read_tracelab_csv``
LMCache agent trace      ``timestamp`` + ``input``                                ``lmcache.read_lmcache``
OpenAI chat              a ``messages`` list (or a bare list of messages)         ``openai_chat.read_openai_chat``
=======================  =======================================================  ==========================

A file it cannot read raises ``TraceFormatError`` naming the format it guessed and the field
that is missing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sidecar_tools.benchmarks.trace_formats.common import TraceFormatError, json_records
from sidecar_tools.benchmarks.trace_formats.lmcache import read_lmcache
from sidecar_tools.benchmarks.trace_formats.openai_chat import read_openai_chat
from sidecar_tools.benchmarks.trace_formats.tokens import TokenCounter, approx_token_count, token_counter
from sidecar_tools.benchmarks.trace_formats.tracelab import read_tracelab_csv, read_tracelab_rounds
from sidecar_tools.benchmarks.traces import FORMAT, Trace, load_jsonl

__all__ = ["TraceFormatError", "approx_token_count", "detect_format", "read_trace", "token_counter"]

KNOWN = ("agent-trace-v1 ({'format': 'agent-trace-v1'}), TraceLab round trace (round_index, "
         "input_tokens_total, timing_events), TraceLab CSV export (.csv or round_idx), LMCache agent trace "
         "(timestamp, input), OpenAI chat (messages)")


def detect_format(path: str | Path) -> str:
    """``agent-trace-v1``, ``tracelab-rounds``, ``tracelab-csv``, ``lmcache`` or ``openai-chat``."""
    path = Path(path)
    if path.suffix.lower() == ".csv":
        return "tracelab-csv"
    first = next(json_records(path), None)
    if first is None:
        raise TraceFormatError(f"{path}: empty trace file")
    line, record = first
    if isinstance(record, list):
        return "openai-chat"
    if isinstance(record, dict):
        if record.get("format") == FORMAT:
            return "agent-trace-v1"
        if {"round_index", "input_tokens_total", "timing_events"} & record.keys():
            return "tracelab-rounds"
        if "round_idx" in record:
            return "tracelab-csv"
        if {"timestamp", "input"} <= record.keys():
            return "lmcache"
        if {"messages", "trajectory"} & record.keys():
            return "openai-chat"
        keys = ", ".join(sorted(record)[:12])
        raise TraceFormatError(f"{path}:{line}: cannot tell the trace format from the first record "
                               f"(keys: {keys}); known: {KNOWN}")
    raise TraceFormatError(f"{path}:{line}: cannot tell the trace format: the first record is a "
                           f"{type(record).__name__}; known: {KNOWN}")


def read_trace(path: str | Path, *, count_tokens: Callable[[str], int] | None = None, tokenizer: str = "auto",
               start_spacing_s: float | None = None, default_tool_wait_s: float = 0.5,
               reply_tokens_per_s: float | None = None) -> Trace:
    """Read any known format (see module doc).

    ``count_tokens`` (or ``tokenizer``, see ``tokens``) counts text where a format has no token
    counts; ``start_spacing_s`` replaces the recorded session starts by starts that far apart (0:
    all at once); ``default_tool_wait_s`` is the gap of conversations without timestamps;
    ``reply_tokens_per_s`` takes LMCache replies' generation out of their gaps.
    """
    path = Path(path)
    fmt = detect_format(path)
    if fmt == "agent-trace-v1":
        if start_spacing_s is not None:
            raise TraceFormatError(f"{path}: an agent-trace-v1 file keeps its starts; space a recorded trace instead")
        return load_jsonl(path)
    if fmt == "tracelab-rounds":
        return read_tracelab_rounds(path, start_spacing_s)
    if fmt == "tracelab-csv":
        return read_tracelab_csv(path, start_spacing_s)
    counter = TokenCounter("count_tokens", count_tokens) if count_tokens else token_counter(tokenizer)
    if fmt == "lmcache":
        trace = read_lmcache(path, counter.count, start_spacing_s, reply_tokens_per_s)
    else:
        trace = read_openai_chat(path, counter.count, default_tool_wait_s, start_spacing_s)
    trace.meta["token_counter"] = counter.name
    return trace
