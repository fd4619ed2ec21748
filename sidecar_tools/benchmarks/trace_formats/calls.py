"""From recorded model calls to the trace model: appends, context resets, wall-clock gaps, starts.

Every reader turns its rows into ``RecordedCall``s, in call order per recorded session, and
``build_trace`` does the rest the same way for all formats:

* append: what the call's prompt adds to the previous prompt plus its reply (the replay resends
  the whole history). A recorded prompt shorter than that (a reasoning block the agent did not
  resend, a trimmed message) adds nothing; the replayed prompt is then longer than the recorded
  one, and ``meta.notes`` says by how much at most.
* context reset: a prompt that keeps less than half of the history (a compaction), or one the
  reader marks as not continuing the previous one, shares no history to reuse: it starts a new
  session ``<id>.ctx2`` (``.ctx3``...) at its recorded time, and the session before it never returns.
* gap after a call: wall clock from the end of its reply to the next request when both are
  recorded, else the gap the format gives; negative (the next request overlapped the reply)
  counts as 0.
* start: the session's recorded start minus the trace's earliest (or every ``start_spacing_s`` in
  recorded order); a reset session starts where its call was recorded, relative to its session's.
  Sessions are listed in order of their start (then of first appearance).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sidecar_tools.benchmarks.traces import Round, Session, Trace

RESET_SHARE = 0.5  # a prompt keeping less than this share of the history is a new context
ASSUMED_CALL_S = 1.0  # a call's duration where the recording has no times (start of a reset session)


@dataclass
class RecordedCall:
    """One model call as recorded. Give ``prompt_tokens`` (the whole prompt) or ``append_tokens``."""

    output_tokens: int
    prompt_tokens: int | None = None
    append_tokens: int | None = None
    new_context: bool = False  # the reader knows this prompt does not continue the previous one
    request_t: float | None = None  # when the request was sent (seconds, any origin)
    reply_end_t: float | None = None  # when its reply ended
    gap_after_s: float | None = None  # the format's own gap, used when times are missing
    tool_names: list[str] | None = None
    prefix_len: int | None = None
    messages: list[dict[str, Any]] | None = None
    reply: dict[str, Any] | None = None


@dataclass
class RecordedSession:
    session_id: str
    calls: list[RecordedCall]
    start_t: float | None = None  # recorded start; default: the first call's request_t


@dataclass
class _Notes:
    resets: int = 0
    shorter_prompts: int = 0
    max_overstated_share: float = 0.0
    overlapping_requests: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "context_resets": self.resets,
            "rounds_whose_recorded_prompt_is_shorter_than_the_history": self.shorter_prompts,
            "max_replayed_prompt_over_recorded": round(self.max_overstated_share, 4),
            "requests_sent_before_the_previous_reply_ended": self.overlapping_requests,
        }


@dataclass
class _Segment:
    session_id: str
    start_s: float
    rounds: list[Round] = field(default_factory=list)
    history: int = 0  # prompt + reply of the last round


def build_trace(name: str, sessions: list[RecordedSession], meta: dict[str, Any], *,
                origin_t: float | None = None, start_spacing_s: float | None = None,
                shared_prefix_tokens: int = 0) -> Trace:
    """The trace of ``sessions`` (see module doc); ``origin_t`` default: the earliest start."""
    sessions = [s for s in sessions if s.calls]
    starts = [_start_t(s) for s in sessions]
    known = [t for t in starts if t is not None]
    origin = origin_t if origin_t is not None else (min(known) if known else 0.0)
    offsets = [0.0 if t is None else t - origin for t in starts]
    if start_spacing_s is not None:
        order = sorted(range(len(sessions)), key=lambda i: offsets[i])
        for rank, i in enumerate(order):
            offsets[i] = rank * start_spacing_s
    notes = _Notes()
    out: list[Session] = []
    for i in sorted(range(len(sessions)), key=lambda i: offsets[i]):
        out += _session_segments(sessions[i], starts[i], offsets[i], notes)
    meta = {**meta, "notes": {**meta.get("notes", {}), **notes.as_dict()}}
    return Trace(name=name, shared_prefix_tokens=shared_prefix_tokens, sessions=out, meta=meta)


def _start_t(session: RecordedSession) -> float | None:
    return session.start_t if session.start_t is not None else session.calls[0].request_t


def _session_segments(session: RecordedSession, start_t: float | None, offset: float,
                      notes: _Notes) -> list[Session]:
    segments: list[_Segment] = []
    clock = offset  # replay-relative time of the current call, where the recording has none
    for k, call in enumerate(session.calls):
        if call.request_t is not None and start_t is not None:
            clock = offset + call.request_t - start_t
        seg = segments[-1] if segments else None
        if seg is not None:
            seg.rounds[-1].tool_wait_s = _gap(session.calls[k - 1], call, notes)
        append = _append(call, seg.history if seg else 0)
        if seg is None or call.new_context or append is None:
            if seg is not None:
                seg.rounds[-1].tool_wait_s = 0.0  # the old context never returns
                notes.resets += 1
            seg = _Segment(session.session_id + (f".ctx{len(segments) + 1}" if segments else ""), max(0.0, clock))
            segments.append(seg)
            append = call.append_tokens if call.append_tokens is not None else call.prompt_tokens or 0
        elif append < 0:
            notes.shorter_prompts += 1
            notes.max_overstated_share = max(notes.max_overstated_share, -append / max(1, call.prompt_tokens or 1))
            append = 0
        service, output = _service(call), max(1, call.output_tokens)
        seg.rounds.append(Round(append_tokens=append, output_tokens=output, prefix_len=call.prefix_len,
                                tool_names=call.tool_names, service_s=service, messages=call.messages,
                                reply=call.reply))
        seg.history += append + output
        clock += (service if service is not None else ASSUMED_CALL_S) + (call.gap_after_s or 0.0)
    return [Session(session_id=s.session_id, start_s=s.start_s, rounds=s.rounds) for s in segments]


def _append(call: RecordedCall, history: int) -> int | None:
    """Tokens the call adds to ``history``; None when its prompt keeps too little of it (a reset)."""
    if call.append_tokens is not None:
        return call.append_tokens
    prompt = call.prompt_tokens or 0
    if history and prompt < RESET_SHARE * history:
        return None
    return prompt - history


def _gap(prev: RecordedCall, nxt: RecordedCall, notes: _Notes) -> float:
    if prev.reply_end_t is not None and nxt.request_t is not None:
        gap = nxt.request_t - prev.reply_end_t
        if gap < 0:
            notes.overlapping_requests += 1
        return max(0.0, gap)
    return max(0.0, prev.gap_after_s or 0.0)


def _service(call: RecordedCall) -> float | None:
    if call.request_t is None or call.reply_end_t is None:
        return None
    return max(0.0, call.reply_end_t - call.request_t)
