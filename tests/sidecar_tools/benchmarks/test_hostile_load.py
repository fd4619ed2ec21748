"""The hostile-load benchmark attacks what it says: each field attack's body is a valid request of
its door whose text lands in that field of the turn the sidecar prepares, and its report counts a
5xx as one (the connection cap's refusals apart)."""

from __future__ import annotations

import json

import pytest

from sidecar.anthropic import messages as anthropic_door
from sidecar.anthropic.schema import parse_count_tokens_request, parse_messages_request
from sidecar.openai import chat_completions as chat_door
from sidecar.openai.schema import parse_chat_request
from sidecar.responses import responses as responses_door
from sidecar.responses.schema import parse_responses_request
from sidecar.settings import ServerSettings
from sidecar_tools.benchmarks import hostile_load
from sidecar_tools.benchmarks.hostile_load import FIELD_DOORS, MANY_MESSAGES, field_body

PARSE = {
    "chat": (parse_chat_request, chat_door.turn_request),
    "messages": (parse_messages_request, anthropic_door.turn_request),
    "count_tokens": (parse_count_tokens_request, anthropic_door.turn_request),
    "responses": (parse_responses_request, responses_door.turn_request),
}


def _texts(turn, field: str) -> str:
    """The text a turn carries in ``field``, as the sidecar's canonical messages hold it."""
    if field == "content":
        return turn.messages[-1]["content"]
    if field == "system":
        assert turn.messages[0]["role"] == "system"
        return turn.messages[0]["content"]
    if field == "tool-args":
        (call,) = [c for m in turn.messages for c in m.get("tool_calls") or ()]
        return call["function"]["arguments"]["text"]
    if field == "many-messages":
        assert len(turn.messages) >= MANY_MESSAGES - 1  # Messages joins the last two user turns
        return "".join(m["content"] for m in turn.messages[:-1])
    if field == "tools":
        return "".join(t["function"]["description"] for t in turn.tools)
    raise AssertionError(field)


@pytest.mark.parametrize("field,door", [(f, d) for f, doors in FIELD_DOORS.items() for d in doors])
def test_each_attack_body_carries_its_text_in_its_field(field, door):
    text = "".join(f"w{i} " for i in range(MANY_MESSAGES))  # long enough to be cut into every message
    parse, convert = PARSE[door]
    turn = convert(parse(json.loads(field_body(field, door, text)), ServerSettings()), None, "")
    assert _texts(turn, field).startswith(text[: len(text) // 2])


def test_a_5xx_is_counted_and_a_refused_connection_is_not():
    rows = [{"status": 400}, {"status": 503, "code": "tokenizer_busy"}, {"status": 503, "code": "too_many_connections"},
            {"status": "held"}, {"error": "ClientOSError"}]
    statuses, server_errors, refused = hostile_load._answers(rows)
    assert (server_errors, refused) == (1, 1)
    assert statuses["503 tokenizer_busy"] == 1 and statuses["held"] == 1


def test_loop_lag_window_counts_late_wakeups_between_two_reads():
    inf = float("inf")
    before = {0.005: 10, 0.01: 10, 0.025: 10, 0.05: 10, 0.1: 10, 0.25: 10, inf: 10}
    after = {0.005: 40, 0.01: 45, 0.025: 47, 0.05: 48, 0.1: 48, 0.25: 50, inf: 50}
    window = hostile_load.loop_lag_window(before, after)
    assert window == {"wakeups": 40, "over_100ms": 2, "max_ms_at_most": 250}
    calm = hostile_load.loop_lag_window(after, {le: n + 10 for le, n in after.items()})  # 10 more, all on time
    assert calm == {"wakeups": 10, "over_100ms": 0, "max_ms_at_most": 5}
    assert hostile_load.loop_lag_window({}, {})["wakeups"] == 0  # the sidecar did not answer /metrics
