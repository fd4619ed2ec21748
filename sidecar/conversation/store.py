"""The one session store: who is this request, and which exact token ids does the engine already
hold for its history?

A session is a small tree of *turn states*. Each state is keyed by a fingerprint of the messages
through the reply the sidecar produced, and stores the exact ids the engine saw (prompt + output).
A request continues the state whose fingerprint equals its longest message prefix ending in an
assistant message; anything else starts a new branch that is rendered whole. An explicit session id
(header ``X-Session-Id``, body ``session_id`` or ``user``) wins; otherwise the fingerprint index
finds the session implicitly.

Each session also holds the policy's record of it (gap statistics, lease, activity: see
``sidecar.policy.lifecycle``) and the worker it lives on. The store is bounded (least recently used
first) and has one way out, :meth:`SessionStore.forget`: the session leaves the store and its
index, the policy learns what its open gap means, its lease is released on its worker, and the
metric is counted.

With auth on, every session belongs to a *scope* (one per API key). A client's id is stored and
sent to SGLang as ``"<scope>:<id>"`` (see :func:`scoped_id`), and implicit recognition only looks
at turns of the same scope, so one key can never continue, list or close another key's session.
"""

from __future__ import annotations

import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sidecar.conversation.fingerprint import (
    MessageKey, extend_fingerprint, fingerprints, message_key, message_tail, same_message, tail_of_key,
)
from sidecar.engine.worker import Worker
from sidecar.errors import APIError, invalid_request
from sidecar.id_text import IdText
from sidecar.metrics import SidecarMetrics
from sidecar.policy.lifecycle import SessionRecord

MAX_TURN_STATES_PER_SESSION = 16  # enough for retries and edits of recent turns
TURN_STATE_OVERHEAD_BYTES = 200  # a TurnState's objects besides its ids (fingerprint, dataclass, dict slot)
SESSION_ID_RE = re.compile(r"^[A-Za-z0-9._:@\-]{1,128}$")


def check_session_id(session_id: str) -> str:
    """A client's session id, if it is 1-128 characters of ``A-Z a-z 0-9 . _ : @ -`` (else 400)."""
    if not SESSION_ID_RE.match(session_id):
        raise invalid_request("session id must be 1-128 characters of A-Z a-z 0-9 . _ : @ -", param="session_id")
    return session_id


def scoped_id(scope: str, client_id: str) -> str:
    """The store's (and SGLang's) id of a client's session id within a scope ("" = no auth)."""
    return f"{scope}:{client_id}" if scope else client_id


@dataclass
class TurnState:
    """The engine-side truth after one turn: exactly the ids it holds for this history."""

    fingerprint: bytes
    n_messages: int  # messages covered, the reply included
    token_ids: IdText  # prompt ids + generated ids
    end_id: int | None  # stop token that ended the reply (None: cut by length or stop string)
    parent: bytes | None = None  # fingerprint of the state this turn continued (None: rendered whole)
    # The messages it covers as MessageKeys (the next request's are compared with them, not hashed),
    # shared with the state it continued; ``text_bytes``: the text of those it added (counted here once).
    keys: tuple[MessageKey, ...] | None = None
    text_bytes: int = 0

    @property
    def nbytes(self) -> int:
        ids = self.token_ids
        keys = 8 * len(self.keys) + self.text_bytes if self.keys is not None else 0
        return (ids.nbytes if isinstance(ids, IdText) else 8 * len(ids)) + TURN_STATE_OVERHEAD_BYTES + keys


@dataclass(eq=False)
class Session:
    id: str  # scoped: what the store, the policy and SGLang see
    explicit: bool
    record: SessionRecord  # the policy's: activity, context tokens, open gap, requested lease
    scope: str = ""
    created_at: float = field(default_factory=time.monotonic)
    turns: "OrderedDict[bytes, TurnState]" = field(default_factory=OrderedDict)
    inflight: int = 0  # requests the sidecar is handling (waiting for admission or running)
    turn_count: int = 0
    worker: Worker | None = None  # the worker its requests went to (None: none went yet)
    rehomed: int = 0  # times its worker was lost and it continued on another (a full recompute each)
    nbytes: int = 0  # what its turn states take

    @property
    def public_id(self) -> str:
        """The id as its client knows it (the scope prefix removed)."""
        return self.id[len(self.scope) + 1 :] if self.scope else self.id

    def state(self, now: float) -> str:
        if self.inflight:
            return "generating"
        lease_until = self.record.lease_expires_at
        if lease_until is not None and lease_until > now:
            return "leased"
        return "idle"

    def branches(self) -> int:
        """Histories this session can continue: its stored turn states that no later turn continued
        (a straight chain of turns is one branch; an edited or retried turn starts another)."""
        continued = {state.parent for state in self.turns.values()}
        return sum(fp not in continued for fp in self.turns)

    def describe(self, now: float) -> dict[str, Any]:
        """The /v1/sessions entry. The lease shown is the one the sidecar *requested* (the TTL sent
        with the last turn); SGLang's plugin holds the real one and may release it early under
        KV pressure or after an engine restart."""
        lease_until = self.record.lease_expires_at
        return {
            "id": self.public_id,
            "explicit": self.explicit,
            "state": self.state(now),
            "tokens": self.record.context_tokens,
            "turns": self.turn_count,
            "branches": self.branches(),
            "idle_s": round(now - self.record.last_active, 3),
            "lease_remaining_s": round(max(0.0, lease_until - now), 3) if lease_until else None,
            "lease_source": "requested",
            "worker": self.worker.url if self.worker is not None else None,
            "rehomed": self.rehomed,
            **({"scope": self.scope} if self.scope else {}),  # with auth: which key's (a hash, never the key)
        }


@dataclass
class Resolution:
    """Outcome of matching a request to a session: continue ``base``, or render the whole history."""

    session: Session
    base: TurnState | None
    new_messages_from: int  # index of the first message not covered by base
    is_new_session: bool
    fingerprint: bytes  # of the request's messages (the reply extends it; saves hashing them twice)
    keys: tuple[MessageKey, ...] = ()  # of the request's messages: base's own, then the new ones'
    new_text_bytes: int = 0  # text of the messages not covered by base

    def fill_keys(self, messages: list[dict[str, Any]]) -> None:
        """The keys of the request's new messages, made where the caller runs this (off the event
        loop for a large request) when it resolved with ``keys=False``."""
        self.keys, self.new_text_bytes = _keys(self.base, messages)

    def next_state(self, reply: dict[str, Any], token_ids, end_id: int | None) -> TurnState:
        """The turn state of this request's finished reply (``reply_message``): its fingerprint and
        keys extend the request's, so only the reply is hashed."""
        key = message_key(reply)
        return TurnState(
            extend_fingerprint(self.fingerprint, reply), len(self.keys) + 1, token_ids, end_id,
            self.base.fingerprint if self.base is not None else None,
            self.keys + (key,), self.new_text_bytes + _text_bytes(key),
        )


def _text_bytes(key: MessageKey) -> int:
    return len(key.text) + sum(len(a) for _, a in key.calls if isinstance(a, str)) + len(key.calls_json or b"")


def _continues(keys: tuple[MessageKey, ...], messages: list[dict[str, Any]]) -> bool:
    """``messages`` begin with the messages ``keys`` were made from (compared newest first)."""
    return len(keys) <= len(messages) and all(same_message(keys[i], messages[i]) for i in range(len(keys) - 1, -1, -1))


def _keys(base: TurnState | None, messages: list[dict[str, Any]]) -> tuple[tuple[MessageKey, ...], int]:
    """The keys of ``messages``: base's for the messages it covers, new ones for the rest; and
    the text those new ones hold."""
    start = base.n_messages if base is not None and base.keys is not None else 0
    new = tuple(message_key(m) for m in messages[start:])
    return (base.keys if start else ()) + new, sum(map(_text_bytes, new))


class SessionStore:
    """One owner for sessions, their turn states and the policy's record of each.

    ``policy`` makes each new session's record and is told when a session is forgotten; the store
    binds itself to it as the records it reads (``policy.bind``). ``metrics`` counts forgotten
    sessions by reason (idle, capacity, memory, client, failed).
    """

    def __init__(
        self, policy, max_sessions: int = 10_000, metrics: SidecarMetrics | None = None, max_bytes: int | None = None
    ):
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes  # of all turn states (None: no bound)
        self.nbytes = 0
        self.policy = policy
        self._metrics = metrics
        self._sessions: "OrderedDict[str, Session]" = OrderedDict()
        self._index: dict[tuple[str, bytes], str] = {}  # (scope, turn fingerprint) -> session id
        # (scope, hash of its last two messages) -> the keyed turn states that end so: {(session id,
        # fingerprint): None}; an implicit request finds its turn there by comparing, not hashing
        self._tails: dict[tuple[str, int], dict[tuple[str, bytes], None]] = {}
        self._keyless = 0  # turn states without message keys (made by hand): the index cannot see them
        policy.bind(self)

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    def all(self, scope: str | None = None) -> list[Session]:
        """Every session, or only those of ``scope``."""
        return [s for s in self._sessions.values() if scope is None or s.scope == scope]

    # the policy reads its records through these two
    def record(self, session_id: str) -> SessionRecord | None:
        session = self._sessions.get(session_id)
        return session.record if session is not None else None

    def records(self) -> Iterator[SessionRecord]:
        return (s.record for s in self._sessions.values())

    def open(self, session_id: str, scope: str = "", *, explicit: bool = True) -> tuple[Session, bool]:
        """The session of a client's id (scoped), created if it is new; (session, is new). Marks it
        most recently used."""
        sid = scoped_id(scope, session_id)
        session = self._sessions.get(sid)
        is_new = session is None
        if session is None:
            session = self._add(Session(id=sid, explicit=explicit, record=self.policy.new_record(sid), scope=scope))
        self._sessions.move_to_end(sid)
        return session, is_new

    def resolve(
        self, messages: list[dict[str, Any]], explicit_id: str | None, scope: str = "", prints: list[bytes] | None = None,
        keys: bool = True,
    ) -> Resolution:
        """The session and turn a request continues; ``prints`` are its messages' fingerprints
        when the caller already has them (computed off the event loop for a large request);
        ``keys=False``: the new messages' keys are left to :meth:`Resolution.fill_keys`."""
        prints = fingerprints(messages) if prints is None else prints
        if explicit_id is not None:
            session, is_new = self.open(explicit_id, scope)
            base = self._longest_match(messages, prints, lambda fp: session.turns.get(fp))
        else:
            found: list[Session] = []

            def lookup(fp: bytes) -> TurnState | None:
                sid = self._index.get((scope, fp))
                owner = self._sessions.get(sid) if sid else None
                state = owner.turns.get(fp) if owner else None
                if state is not None:
                    found.append(owner)
                return state

            base = self._longest_match(messages, prints, lookup)
            is_new = base is None
            if base is not None:
                session = found[-1]
                self._sessions.move_to_end(session.id)
            else:
                session, _ = self.open(f"sess-{uuid.uuid4().hex}", scope, explicit=False)
        res = Resolution(session, base, base.n_messages if base else 0, is_new, prints[-1] if prints else b"")
        if keys:
            res.fill_keys(messages)
        return res

    def known_turn(self, messages: list[dict[str, Any]], explicit_id: str | None, scope: str = "") -> TurnState | None:
        """The longest stored turn that ``messages`` continue, found by comparing them with stored
        message keys (``==`` on the text, newest first, so an edit fails fast): nothing of the
        history is hashed. For an explicit id, among that session's turns; without one (implicit),
        among the turns whose last two messages are the request's at the same place, in the order
        and with the winner :meth:`resolve` would pick. None when nothing matches or a state has
        no keys (then :meth:`resolve` decides, by fingerprints)."""
        if explicit_id is None:
            return self._known_implicit(messages, scope)
        session = self._sessions.get(scoped_id(scope, explicit_id))
        if session is None or not session.turns:
            return None
        states = list(session.turns.values())
        if any(state.keys is None for state in states):
            return None
        n = len(messages)
        for state in sorted(states, key=lambda st: st.n_messages, reverse=True):
            if len(state.keys) <= n and _continues(state.keys, messages):
                return state
        return None

    def _known_implicit(self, messages: list[dict[str, Any]], scope: str) -> TurnState | None:
        """``resolve``'s implicit match without fingerprints: for each assistant message from the
        last, a stored turn ending there whose keys all match has the fingerprint of this prefix,
        so the fingerprint index names the same session and state that hashing would find."""
        if self._keyless or not self._tails:
            return None
        for i in range(len(messages) - 1, -1, -1):
            if messages[i].get("role") != "assistant":
                continue
            try:
                tail = (scope, message_tail(messages, i))
            except TypeError:  # an unhashable field: hashing decides
                return None
            for sid, fp in self._tails.get(tail, ()):
                session = self._sessions.get(sid)
                state = session.turns.get(fp) if session is not None else None
                if state is None or state.n_messages != i + 1 or not _continues(state.keys, messages):
                    continue
                owner = self._sessions.get(self._index.get((scope, fp), ""))
                found = owner.turns.get(fp) if owner is not None else None
                if found is not None and found.n_messages == i + 1:
                    return found
                break  # every state here has this prefix's fingerprint: the index has none of them
        return None

    def continue_turn(
        self, messages: list[dict[str, Any]], explicit_id: str | None, scope: str, base: TurnState, fingerprint: bytes,
        keys: bool = True,
    ) -> Resolution | None:
        """The resolution of a request that continues ``base`` (from :meth:`known_turn`), whose
        whole fingerprint the caller extended from ``base.fingerprint`` over the new messages;
        None if ``base`` left its session meanwhile (then :meth:`resolve` decides)."""
        sid = scoped_id(scope, explicit_id) if explicit_id is not None else self._index.get((scope, base.fingerprint), "")
        session = self._sessions.get(sid)
        if session is None or session.turns.get(base.fingerprint) is not base:
            return None
        self._sessions.move_to_end(session.id)
        res = Resolution(session, base, base.n_messages, False, fingerprint)
        if keys:
            res.fill_keys(messages)
        return res

    @staticmethod
    def _longest_match(messages, prints, lookup) -> TurnState | None:
        for i in range(len(messages) - 1, -1, -1):
            if messages[i].get("role") != "assistant":
                continue
            state = lookup(prints[i])
            if state is not None and state.n_messages == i + 1:
                return state
        return None

    def record_turn(self, session: Session, state: TurnState) -> None:
        """Remember the ids of a finished turn so the next request can continue it; then, past
        ``max_bytes``, forget the least recently used other sessions (and, if this one alone is
        too big, its own older turns)."""
        replaced = session.turns.get(state.fingerprint)
        if replaced is not None:
            self._count_bytes(session, -replaced.nbytes)
            self._untail(session, state.fingerprint, replaced)
        session.turns[state.fingerprint] = state
        self._tail(session, state)
        session.turns.move_to_end(state.fingerprint)
        self._count_bytes(session, state.nbytes)
        while len(session.turns) > MAX_TURN_STATES_PER_SESSION:
            self._drop_oldest_turn(session)
        if self.max_bytes is not None:
            while self.nbytes > self.max_bytes and self._forget_one_other(session):
                pass
            while self.nbytes > self.max_bytes and len(session.turns) > 1:
                self._drop_oldest_turn(session)
        self._index[(session.scope, state.fingerprint)] = session.id
        session.turn_count += 1

    def _tail(self, session: Session, state: TurnState) -> None:
        if state.keys is None:
            self._keyless += 1
            return
        self._tails.setdefault((session.scope, tail_of_key(state.keys)), {})[(session.id, state.fingerprint)] = None

    def _untail(self, session: Session, fp: bytes, state: TurnState) -> None:
        if state.keys is None:
            self._keyless -= 1
            return
        tail = (session.scope, tail_of_key(state.keys))
        entries = self._tails.get(tail)
        if entries is not None:
            entries.pop((session.id, fp), None)
            if not entries:
                del self._tails[tail]

    def _drop_oldest_turn(self, session: Session) -> None:
        old_fp, old = session.turns.popitem(last=False)
        self._count_bytes(session, -old.nbytes)
        self._untail(session, old_fp, old)
        if self._index.get((session.scope, old_fp)) == session.id:
            del self._index[(session.scope, old_fp)]

    def _forget_one_other(self, keep: Session) -> bool:
        """Forget the least recently used session that is idle and not ``keep``; False if none."""
        victim = next((s for s in self._sessions.values() if not s.inflight and s is not keep), None)
        if victim is None:
            return False
        self.forget(victim, "memory")
        return True

    def _count_bytes(self, session: Session, delta: int) -> None:
        session.nbytes += delta
        self.nbytes += delta

    def forget(self, session: Session, reason: str) -> None:
        """The one way out: drop the session and its index entries, tell the policy, release its
        lease on its worker, count it (``reason``: idle, capacity, memory, client, failed)."""
        if self._sessions.get(session.id) is not session:
            return
        del self._sessions[session.id]
        self.nbytes -= session.nbytes
        for fp, state in session.turns.items():
            if self._index.get((session.scope, fp)) == session.id:
                del self._index[(session.scope, fp)]
            self._untail(session, fp, state)
        self.policy.on_session_closed(session.record, reason)
        if session.worker is not None:
            session.worker.release(session.id)
        if self._metrics is not None:
            self._metrics.sessions_closed.labels(reason=reason).inc()

    def close(self, client_id: str, scope: str = "") -> None:
        """A client closes its session (``client_id`` within its key's ``scope``): forgotten, its
        lease released; 404 when the scope has no such session, 409 while a request of it runs
        (its turn would be recorded into a session that is gone)."""
        session = self._sessions.get(scoped_id(scope, client_id))
        if session is None:
            raise APIError(404, f"no session {client_id!r}", type="not_found", code="session_not_found")
        if session.inflight:
            raise APIError(409, f"session {client_id!r} has a request in flight", code="session_busy")
        self.forget(session, "client")

    def close_due(self, now: float) -> list[str]:
        """Forget the sessions the policy says are done (idle past their lease + grace) and that no
        request is using; returns their ids. Call it about every second."""
        closed = []
        for sid in self.policy.sessions_to_close(now):
            session = self._sessions.get(sid)
            if session is not None and not session.inflight:
                self.forget(session, "idle")
                closed.append(sid)
        return closed

    def _add(self, session: Session) -> Session:
        self._sessions[session.id] = session
        while len(self._sessions) > self.max_sessions:
            victim = next((s for s in self._sessions.values() if not s.inflight and s is not session), None)
            if victim is None:
                break
            self.forget(victim, "capacity")
        return session
