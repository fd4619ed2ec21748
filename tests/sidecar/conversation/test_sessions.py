"""Session registry: which turn a request continues, and what a diverging history does."""

from array import array

from sidecar.conversation.store import SessionRegistry, TurnState, extend_fingerprint, fingerprints


def _turn(messages, reply, ids, end_id=151645):
    fp = extend_fingerprint(fingerprints(messages)[-1], reply)
    return TurnState(fp, len(messages) + 1, array("q", ids), end_id)


SYSTEM = {"role": "system", "content": "you are an agent"}
USER = {"role": "user", "content": "fix the bug"}
REPLY = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}],
}
TOOL = {"role": "tool", "content": "a.py", "tool_call_id": "call_1"}


def test_next_turn_is_recognised_implicitly():
    reg = SessionRegistry()
    first = reg.resolve([SYSTEM, USER], None)
    assert first.base is None and first.is_new_session
    reg.record_turn(first.session, _turn([SYSTEM, USER], REPLY, [1, 2, 3, 4]))

    # The client echoes the reply with re-serialized arguments and a different call id.
    echoed = {**REPLY, "tool_calls": [{"id": "x", "type": "function", "function": {"name": "bash", "arguments": '{ "cmd":"ls" }'}}]}
    nxt = reg.resolve([SYSTEM, USER, echoed, TOOL], None)
    assert nxt.session is first.session
    assert list(nxt.base.token_ids) == [1, 2, 3, 4]
    assert nxt.new_messages_from == 3
    assert not nxt.is_new_session


def test_edited_history_starts_a_new_branch():
    reg = SessionRegistry()
    first = reg.resolve([SYSTEM, USER], None)
    reg.record_turn(first.session, _turn([SYSTEM, USER], REPLY, [1, 2, 3]))
    edited_user = {"role": "user", "content": "fix the other bug"}
    res = reg.resolve([SYSTEM, edited_user, REPLY, TOOL], None)
    assert res.base is None
    assert res.session is not first.session


def test_changed_reply_is_not_continued():
    reg = SessionRegistry()
    first = reg.resolve([SYSTEM, USER], None)
    reg.record_turn(first.session, _turn([SYSTEM, USER], REPLY, [1, 2, 3]))
    other_reply = {"role": "assistant", "content": "I will not"}
    assert reg.resolve([SYSTEM, USER, other_reply, TOOL], None).base is None


def test_explicit_id_wins_and_truncated_history_branches_inside_it():
    reg = SessionRegistry()
    a = reg.resolve([SYSTEM, USER], "agent-7")
    assert a.session.id == "agent-7" and a.is_new_session
    reg.record_turn(a.session, _turn([SYSTEM, USER], REPLY, [1, 2]))
    second = [SYSTEM, USER, REPLY, TOOL]
    b = reg.resolve(second, "agent-7")
    assert b.base is not None
    reply2 = {"role": "assistant", "content": "done"}
    reg.record_turn(b.session, _turn(second, reply2, [1, 2, 3, 4]))
    # Going back to the first turn (a retry of turn 2) continues the older state, not the newest.
    retry = reg.resolve([SYSTEM, USER, REPLY, {"role": "tool", "content": "b.py", "tool_call_id": "call_1"}], "agent-7")
    assert retry.session.id == "agent-7"
    assert list(retry.base.token_ids) == [1, 2]
    # A history that does not extend anything known is a fresh branch of the same session.
    fresh = reg.resolve([{"role": "user", "content": "new task"}], "agent-7")
    assert fresh.base is None and fresh.session.id == "agent-7" and not fresh.is_new_session


def test_explicit_ids_do_not_see_each_others_turns():
    reg = SessionRegistry()
    a = reg.resolve([SYSTEM, USER], "a")
    reg.record_turn(a.session, _turn([SYSTEM, USER], REPLY, [1, 2]))
    b = reg.resolve([SYSTEM, USER, REPLY, TOOL], "b")
    assert b.base is None


def test_table_is_bounded_and_reports_what_it_forgot():
    forgotten = []
    reg = SessionRegistry(max_sessions=3, on_forget=lambda s: forgotten.append(s.id))
    for i in range(5):
        res = reg.resolve([{"role": "user", "content": f"task {i}"}], None)
        reg.record_turn(res.session, _turn([{"role": "user", "content": f"task {i}"}], REPLY, [i]))
    assert len(reg) == 3
    assert len(forgotten) == 2
    # The oldest sessions went first; their turns can no longer be matched.
    old = reg.resolve([{"role": "user", "content": "task 0"}, REPLY, TOOL], None)
    assert old.base is None


def test_fingerprint_tells_apart_what_the_model_saw_and_ignores_what_it_did_not():
    """The digest is unambiguous across field boundaries (a NUL or a number in the text cannot
    pose as a field separator), and blind to call ids and whitespace around assistant text."""
    base = fingerprints([SYSTEM])[-1]
    differ = [
        {"role": "tool", "content": "a", "tool_call_id": "b"},
        {"role": "tool", "content": "a\x00'b'", "tool_call_id": None},
        {"role": "tool", "content": "", "tool_call_id": "a"},
        {"role": "user", "content": "a", "name": "b"},
        {"role": "user", "content": "a"},
        {"role": "user", "content": "1\x00a"},
        {"role": "assistant", "content": "a"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "a", "arguments": "{}"}}]},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "a", "arguments": '{"x": 1}'}}]},
    ]
    digests = [extend_fingerprint(base, m) for m in differ]
    assert len(set(digests)) == len(differ)
    same = [
        {"role": "assistant", "content": "  a\n", "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": '{"y": 2, "x": 1}'}}]},
        {"role": "assistant", "content": "a", "tool_calls": [{"id": "2", "function": {"name": "f", "arguments": '{"x":1,"y":2}'}}]},
    ]
    assert extend_fingerprint(base, same[0]) == extend_fingerprint(base, same[1])
    assert extend_fingerprint(base, differ[4]) != extend_fingerprint(fingerprints([USER])[-1], differ[4])  # chained
