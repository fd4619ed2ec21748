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


# --------------------------------------------------------------------------- which target an attack is held to


def _total_bytes(kind: str, mb: float) -> tuple[int, int]:
    cfg = {"field_mb": mb, "field_clients": 10, "big_mb": max(1, round(mb)), "small_mb": mb, "small_clients": 10}
    shots = hostile_load.build_shots(kind, cfg, 8000)
    return len(shots), sum(len(body) for _, _, body, _ in shots)


def test_the_body_attacks_are_those_that_send_ten_bodies_whose_size_is_the_runs():
    assert set(hostile_load.BODY_ATTACKS) | set(hostile_load.OTHER_ATTACKS) == set(hostile_load.ATTACKS)
    assert not set(hostile_load.BODY_ATTACKS) & set(hostile_load.OTHER_ATTACKS)
    for kind in hostile_load.ATTACKS:
        if kind == "connections":  # no bodies at all
            assert kind in hostile_load.OTHER_ATTACKS
            continue
        n, small = _total_bytes(kind, 0.05)
        _, large = _total_bytes(kind, 1.0)
        scales = n >= 10 and large - small >= 9 * (1.0 - 0.05) * 1e6  # ten or more bodies grew by the MB asked for
        assert scales or large == small, kind  # the others' bodies do not depend on it at all
        assert (kind in hostile_load.BODY_ATTACKS) == scales, (kind, n, small, large)


def _row(stream_gap: float, added_gap: float, **extra) -> dict:
    return {"attack": {"failed": 0}, "stream_failures": 0, "server_errors": 0,
            "loop_lag": {"attack": {"over_100ms": 0}},
            "stream_gap_max_ms": {"baseline": 50.0, "attack": stream_gap},
            "added_gap_max_ms": {"baseline": 20.0, "attack": added_gap}, **extra}


RSS = {"fresh": 1000.0, "after": 1050.0}


def test_a_body_attack_is_held_to_the_gap_itself_and_the_others_to_the_gap_the_sidecar_added():
    body, other = hostile_load.BODY_ATTACKS[0], hostile_load.OTHER_ATTACKS[0]
    t = hostile_load.targets({body: _row(90, 5), other: _row(300, 40)}, RSS)  # the engine's stall under the other
    assert t["stream_gap_max_100ms"] and t["sidecar_added_gap_max_100ms"]
    t = hostile_load.targets({body: _row(150, 5), other: _row(60, 40)}, RSS)  # a body's stall counts whoever made it
    assert not t["stream_gap_max_100ms"] and t["sidecar_added_gap_max_100ms"]
    t = hostile_load.targets({body: _row(60, 5), other: _row(300, 150)}, RSS)  # the sidecar added to the other's
    assert t["stream_gap_max_100ms"] and not t["sidecar_added_gap_max_100ms"]
    t = hostile_load.targets({body: _row(60, 5)}, RSS)
    assert t["sidecar_added_gap_max_100ms"] is None and t["stream_gap_max_100ms"]  # none of the others ran
    assert t["rss_after_within_10pct"] and t["loop_lag_max_100ms"] and t["attackers_5xx_0"]


# --------------------------------------------------------------------------- the sidecar-added gap


def _stream(start: float, gaps_ms) -> list[tuple[float, float]]:
    """record_chunk_gaps' pairs for a stream whose first chunk came at ``start`` and then one chunk after each gap."""
    out, t = [], start
    for g in gaps_ms:
        t += g / 1000
        out.append((t, g / 1000))
    return out


def test_a_stall_both_streams_sit_through_adds_only_the_sidecars_forwarding_delay():
    direct = _stream(10.0, [30] * 20 + [250] + [30] * 20)
    sidecar = _stream(10.004, [30] * 20 + [252] + [30] * 20)  # 4 ms behind, the stalled chunk 2 ms later still
    added = hostile_load.added_gaps(sidecar, direct)
    assert len(added) == len(sidecar)
    worst = max(a for _, a in added)
    assert worst < 0.010  # what remains is the forwarding delay, not the 250 ms stall
    assert max(g for _, g in sidecar) > 0.25


def test_a_stall_the_direct_stream_streamed_through_is_added_whole_less_one_direct_gap():
    direct = _stream(10.0, [30] * 40)
    sidecar = _stream(10.0, [30] * 10 + [300] + [30] * 10)
    by_end = dict(hostile_load.added_gaps(sidecar, direct))
    stalled_end = sidecar[10][0]
    assert by_end[stalled_end] == pytest.approx(0.300 - 0.030, abs=1e-6)  # only one direct gap is subtracted
    assert max(a for t, a in by_end.items() if t != stalled_end) <= 0.030 + 1e-9


def test_the_added_gap_subtracts_the_longest_overlap_not_the_first_or_the_sum():
    direct = [(1.10, 0.10), (1.30, 0.20), (1.35, 0.05)]  # [1.0, 1.1], [1.1, 1.3], [1.3, 1.35]
    ((_, added),) = hostile_load.added_gaps([(1.40, 0.40)], direct)  # [1.0, 1.4]
    assert added == pytest.approx(0.40 - 0.20)
    ((_, partly),) = hostile_load.added_gaps([(1.25, 0.10)], direct)  # [1.15, 1.25] lies inside [1.1, 1.3]
    assert partly == pytest.approx(0.0, abs=1e-9)
    ((_, far),) = hostile_load.added_gaps([(5.0, 0.2)], direct)  # the direct stream was between replies
    assert far == pytest.approx(0.2)
    assert hostile_load.added_gaps([(5.0, 0.2)], []) == []  # nothing to compare with


def test_the_added_gap_finds_a_long_direct_gap_that_began_well_before_the_sidecar_gap():
    direct = _stream(0.0, [20] * 50 + [2000] + [20] * 50)  # a 2 s engine stall
    stall_end = direct[50][0]
    sidecar = [(stall_end - 0.5, 0.3)]  # a 300 ms gap deep inside it
    ((_, added),) = hostile_load.added_gaps(sidecar, direct)
    assert added == pytest.approx(0.0, abs=1e-9)
