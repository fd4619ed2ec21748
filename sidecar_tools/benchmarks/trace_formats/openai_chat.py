"""OpenAI chat conversations: one per line, ``{"messages": [...], "session_id"?: ...}`` or a bare list.

Every assistant message closes a round; the messages since the previous one are its append. With
per-message timestamps (``timestamp`` / ``ts`` / ``created`` / ``time``: epoch s or ms, or ISO),
a round's request is the latest of its appended messages, its reply ends at the assistant
message, and the gap is wall clock from that reply to the next request; a conversation starts at
its first request. Without timestamps every gap is ``default_tool_wait_s``. A system prompt
shared by every conversation becomes ``shared_prefix_tokens``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sidecar_tools.benchmarks.trace_formats.calls import RecordedCall, RecordedSession, build_trace
from sidecar_tools.benchmarks.trace_formats.common import TraceFormatError, epoch_seconds, json_records
from sidecar_tools.benchmarks.traces import Trace

FORMAT = "OpenAI chat conversation"
MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")
TIMESTAMP_KEYS = ("timestamp", "ts", "created", "time")


def read_openai_chat(path: Path, count_tokens: Callable[[str], int], default_tool_wait_s: float = 0.5,
                     start_spacing_s: float | None = None) -> Trace:
    sessions, system_prompts = [], []
    for n, (line, obj) in enumerate(json_records(path)):
        where = f"{path}:{line}"
        messages = obj if isinstance(obj, list) else (obj.get("messages") or obj.get("trajectory")
                                                       if isinstance(obj, dict) else None)
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise TraceFormatError(f"{where}: {FORMAT}: the record lacks a 'messages' list of objects")
        sid = f"conv-{n:05d}"
        if isinstance(obj, dict):
            sid = str(obj.get("session_id") or obj.get("id") or obj.get("trajectory_id") or sid)
        system_prompts.append(next((m.get("content") for m in messages if m.get("role") == "system"), None))
        sessions.append(RecordedSession(sid, _calls(messages, count_tokens, default_tool_wait_s, where)))
    shared = 0
    if system_prompts and system_prompts[0] and all(p == system_prompts[0] for p in system_prompts):
        shared = count_tokens(str(system_prompts[0]))
    meta = {"source": str(path), "reader": "openai-chat",
            "gaps": f"wall clock from per-message timestamps, else {default_tool_wait_s:g} s"}
    return build_trace(path.stem, sessions, meta, start_spacing_s=start_spacing_s, shared_prefix_tokens=shared)


def _calls(messages: list[dict[str, Any]], count_tokens: Callable[[str], int], default_gap: float,
           where: str) -> list[RecordedCall]:
    calls: list[RecordedCall] = []
    pending: list[dict[str, Any]] = []
    for msg in messages:
        if msg.get("role") != "assistant":
            pending.append(msg)
            continue
        stamps = [t for t in (_timestamp(m, where) for m in pending) if t is not None]
        calls.append(RecordedCall(
            output_tokens=count_tokens(message_text(msg)),
            append_tokens=sum(count_tokens(message_text(m)) for m in pending),
            request_t=max(stamps) if stamps else None,
            reply_end_t=_timestamp(msg, where),
            gap_after_s=default_gap,
            tool_names=[str((c.get("function") or {}).get("name", "")) for c in msg.get("tool_calls") or []
                        if isinstance(c, dict)],
            messages=[{k: m[k] for k in MESSAGE_KEYS if k in m} for m in pending],
            reply={k: msg[k] for k in MESSAGE_KEYS if k in msg},
        ))
        pending = []
    return calls


def message_text(msg: dict[str, Any]) -> str:
    """The text a message puts in the prompt: its content and its tool calls' JSON."""
    content = msg.get("content") or ""
    if isinstance(content, list):  # OpenAI content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    calls = msg.get("tool_calls") or []
    return str(content) + "".join(json.dumps(c.get("function", c)) for c in calls if isinstance(c, dict))


def _timestamp(msg: dict[str, Any], where: str) -> float | None:
    key = next((k for k in TIMESTAMP_KEYS if msg.get(k) is not None), None)
    return None if key is None else epoch_seconds(msg[key], where, f"{FORMAT} message {key!r}")
