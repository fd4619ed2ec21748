"""Session store: which turn a request continues, what a diverging history does, how a session goes."""

import json
from array import array

from sidecar.conversation.fingerprint import extend_fingerprint, fingerprints
from sidecar.conversation.store import SessionStore, TurnState
from sidecar.id_text import IdText
from sidecar.engine.capacity import EngineCapacity
from sidecar.metrics import SidecarMetrics
from sidecar.policy import TurnEnd, build_policy
from sidecar.settings import SidecarSettings


def new_store(max_sessions=10_000):
    """A store on the policy the default settings build (it binds itself to the store)."""
    policy = build_policy(SidecarSettings(), EngineCapacity(0))
    return SessionStore(policy, max_sessions, SidecarMetrics())


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
    reg = new_store()
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
    reg = new_store()
    first = reg.resolve([SYSTEM, USER], None)
    reg.record_turn(first.session, _turn([SYSTEM, USER], REPLY, [1, 2, 3]))
    edited_user = {"role": "user", "content": "fix the other bug"}
    res = reg.resolve([SYSTEM, edited_user, REPLY, TOOL], None)
    assert res.base is None
    assert res.session is not first.session


def test_changed_reply_is_not_continued():
    reg = new_store()
    first = reg.resolve([SYSTEM, USER], None)
    reg.record_turn(first.session, _turn([SYSTEM, USER], REPLY, [1, 2, 3]))
    other_reply = {"role": "assistant", "content": "I will not"}
    assert reg.resolve([SYSTEM, USER, other_reply, TOOL], None).base is None


def test_explicit_id_wins_and_truncated_history_branches_inside_it():
    reg = new_store()
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
    reg = new_store()
    a = reg.resolve([SYSTEM, USER], "a")
    reg.record_turn(a.session, _turn([SYSTEM, USER], REPLY, [1, 2]))
    b = reg.resolve([SYSTEM, USER, REPLY, TOOL], "b")
    assert b.base is None


def test_store_is_bounded_and_counts_what_it_forgot():
    reg = new_store(max_sessions=3)
    first = []
    for i in range(5):
        res = reg.resolve([{"role": "user", "content": f"task {i}"}], None)
        reg.record_turn(res.session, _turn([{"role": "user", "content": f"task {i}"}], REPLY, [i]))
        first.append(res.session.id)
    assert len(reg) == 3
    assert [s.id for s in reg.all()] == first[2:]
    assert reg._metrics.registry.get_sample_value("sidecar_sessions_closed_total", {"reason": "capacity"}) == 2
    # The oldest sessions went first; their turns can no longer be matched.
    old = reg.resolve([{"role": "user", "content": "task 0"}, REPLY, TOOL], None)
    assert old.base is None


class _Worker:
    def __init__(self):
        self.released = []

    def release(self, session_id):
        self.released.append(session_id)


def test_forgetting_a_session_is_one_path_store_index_policy_lease_metric():
    reg = new_store()
    policy = reg.policy
    res = reg.resolve([SYSTEM, USER], "agent-1")
    session = res.session
    session.worker = _Worker()
    policy._start_request(session.id, 100)
    policy.on_request(session.id, 100, policy.clock())
    reg.record_turn(session, _turn([SYSTEM, USER], REPLY, [1, 2, 3]))
    policy.on_turn_end(TurnEnd(session.id, 3, ["bash"], policy.clock()))  # its gap is open
    policy.release_admission(session.id)

    reg.forget(session, "client")
    assert reg.get(session.id) is None and len(reg) == 0
    assert reg.resolve([SYSTEM, USER, REPLY, TOOL], None).base is None  # out of the fingerprint index too
    assert session.worker.released == [session.id]  # its lease released on the worker it lived on
    assert reg._metrics.registry.get_sample_value("sidecar_sessions_closed_total", {"reason": "client"}) == 1
    # the policy learned the open gap as "not back", and takes it back if the session returns
    assert session.record.censored is not None
    back, is_new = reg.open("agent-1")
    assert is_new and back.record.censored is session.record.censored and back.record.turn_ended_at is not None
    reg.forget(session, "client")  # gone already: nothing happens twice
    assert reg._metrics.registry.get_sample_value("sidecar_sessions_closed_total", {"reason": "client"}) == 1


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


def test_the_store_is_bounded_in_bytes_least_recently_used_first():
    from sidecar.id_text import IdText

    policy = build_policy(SidecarSettings(), EngineCapacity(0))
    metrics = SidecarMetrics()
    store = SessionStore(policy, 10_000, metrics, max_bytes=60_000)
    sessions = []
    for k in range(5):  # each ~20 KB of ids
        res = store.resolve([SYSTEM, {"role": "user", "content": f"task {k}"}], None)
        store.record_turn(res.session, TurnState(res.fingerprint + bytes([k]), 3, IdText(range(100_000, 104_000)), 1))
        sessions.append(res.session)
        assert store.nbytes <= 60_000
    kept = {s.id for s in store.all()}
    assert kept == {s.id for s in sessions[-2:]}  # the oldest went first
    assert store.nbytes == sum(s.nbytes for s in store.all()) > 0
    assert metrics.sessions_closed.labels(reason="memory")._value.get() == 3
    store.forget(sessions[-1], "client")
    assert store.nbytes == sessions[-2].nbytes
    # one session alone past the bound keeps only its newest turn
    solo = SessionStore(policy, 10_000, None, max_bytes=30_000)
    res = solo.resolve([SYSTEM, USER], None)
    for k in range(3):
        solo.record_turn(res.session, TurnState(bytes([k]) * 16, 3, IdText(range(100_000, 104_000)), 1))
    assert len(res.session.turns) == 1 and solo.nbytes <= 30_000


async def test_session_bytes_are_on_metrics(make_sidecar):
    client = await make_sidecar()
    resp = await client.post("/v1/chat/completions", json={"messages": [USER], "max_tokens": 3})
    assert resp.status == 200
    text = await (await client.get("/metrics")).text()
    line = next(l for l in text.splitlines() if l.startswith("sidecar_session_bytes "))
    assert float(line.split()[1]) > 0


def _record_via_resolution(store, messages, reply, ids, session_id="agent"):
    res = store.resolve(messages, session_id)
    state = res.next_state(reply, IdText(ids), 151645)
    store.record_turn(res.session, state)
    return res, state


def test_a_named_session_is_continued_by_comparing_messages_not_hashing_them():
    """``known_turn`` finds the same turn the fingerprints would, for a client that re-serializes
    the reply's arguments, changes its call id and pads its text; any real change is no match."""
    store = new_store()
    _, state = _record_via_resolution(store, [SYSTEM, USER], REPLY, [1, 2, 3])
    echoed = {**REPLY, "content": "  ", "tool_calls": [{"id": "x", "type": "function",
                                                        "function": {"name": "bash", "arguments": '{ "cmd":"ls" }'}}]}
    request = [SYSTEM, USER, echoed, TOOL]
    assert store.known_turn(request, "agent") is state
    res = store.continue_turn(request, "agent", "", state, extend_fingerprint(state.fingerprint, TOOL))
    assert res.fingerprint == fingerprints(request)[-1]  # what hashing the whole history gives
    assert (res.base, res.new_messages_from, res.is_new_session) == (store.resolve(request, "agent").base, 3, False)
    for changed in ({**SYSTEM, "content": "you are another agent"}, {**USER, "name": "bob"},
                    {**REPLY, "tool_calls": [{"function": {"name": "bash", "arguments": '{"cmd": "ls -l"}'}}]},
                    {**REPLY, "tool_calls": []}):
        at = {"system": 0, "user": 1, "assistant": 2}[changed["role"]]
        edited = request[:at] + [changed] + request[at + 1 :]
        assert store.known_turn(edited, "agent") is None
        assert store.resolve(edited, "agent").base is None  # the fingerprints agree: a new branch
    assert store.known_turn(request, "someone-else") is None


def test_message_keys_are_counted_once_per_turn_in_the_session_bytes():
    store = new_store()
    first, state = _record_via_resolution(store, [SYSTEM, USER], REPLY, [1, 2, 3])
    # the texts, the reply's arguments as sent, and its calls' JSON with the arguments parsed
    text = len(SYSTEM["content"]) + len(USER["content"]) + len('{"cmd": "ls"}') + len('[["bash",{"cmd":"ls"}]]')
    assert state.text_bytes == text
    request = [SYSTEM, USER, REPLY, TOOL]
    res = store.continue_turn(request, "agent", "", state, extend_fingerprint(state.fingerprint, TOOL))
    nxt = res.next_state({"role": "assistant", "content": "done"}, IdText([1, 2, 3, 4, 5]), 151645)
    assert nxt.keys[:3] is not None and nxt.keys[:3] == state.keys  # shared with the turn it continued
    assert nxt.keys[0] is state.keys[0]
    assert nxt.text_bytes == len(TOOL["content"]) + len("done")  # only what this turn added


def test_an_implicit_request_finds_by_comparing_the_turn_hashing_would_find():
    """``known_turn`` without an id names exactly the stored turn (and so the session) that
    fingerprints of the whole history would, through identical histories in several sessions,
    retries of older turns, edits, re-serialized arguments, and sessions and turns forgotten."""
    import random

    rng = random.Random(5)
    store = new_store(max_sessions=12)
    replies = [{"role": "assistant", "content": "Let me look."},
               {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}]},
               {"role": "assistant", "content": "Done.", "tool_calls": [{"function": {"name": "bash", "arguments": '{"cmd": "ls", "n": 1}'}}]}]
    tools = [{"role": "tool", "tool_call_id": "c", "content": text} for text in ("a.py", "b.py", "FAILED")]
    histories = [[SYSTEM, USER]]
    found = 0
    for _ in range(400):
        request = list(rng.choice(histories))
        if rng.random() < 0.15 and len(request) > 2:  # an edit somewhere in the history
            at = rng.randrange(len(request))
            request[at] = {**request[at], "content": (request[at].get("content") or "") + " (edited)"}
        for i, m in enumerate(request):  # a client that re-serializes the arguments it got, or parsed them
            if m.get("tool_calls") and rng.random() < 0.5:
                args = m["tool_calls"][0]["function"]["arguments"]
                parsed = json.loads(args) if isinstance(args, str) else args
                request[i] = {**m, "tool_calls": [{"id": "x", "function": {"name": "bash", "arguments": rng.choice([parsed, json.dumps(parsed, indent=1)])}}]}
        known = store.known_turn(request, None)
        res = store.resolve(request, None)
        assert known is res.base
        found += known is not None
        reply = rng.choice(replies)
        store.record_turn(res.session, res.next_state(reply, IdText([1, 2, 3]), 151645))
        histories.append(request + [reply, rng.choice(tools)])
    assert found > 100  # most requests continued a turn
    assert len(store) == 12  # and sessions were forgotten on the way
    # a turn made without message keys: the index cannot vouch for it, hashing decides
    keyless = store.resolve([SYSTEM, {"role": "user", "content": "other"}], None)
    store.record_turn(keyless.session, _turn([SYSTEM, {"role": "user", "content": "other"}], REPLY, [1]))
    assert store.known_turn(histories[-1], None) is None
