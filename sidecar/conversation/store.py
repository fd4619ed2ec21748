"""Who is this request, and which exact token ids does the engine already hold for its history?

A session is a small tree of *turn states*. Each state is keyed by a fingerprint of the messages
through the reply the sidecar produced, and stores the exact ids the engine saw (prompt + output).
A request continues the state whose fingerprint equals its longest message prefix ending in an
assistant message; anything else starts a new branch that is rendered whole. An explicit session id
(header ``X-Session-Id``, body ``session_id`` or ``user``) wins; otherwise the fingerprint index
finds the session implicitly.

With auth on, every session belongs to a *scope* (one per API key). A client's id is stored and
sent to SGLang as ``"<scope>:<id>"`` (see :func:`scoped_id`), and implicit recognition only looks
at turns of the same scope, so one key can never continue, list or close another key's session.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterable

from sidecar.id_text import IdText

MAX_TURN_STATES_PER_SESSION = 16  # enough for retries and edits of recent turns


def scoped_id(scope: str, client_id: str) -> str:
    """The registry's (and SGLang's) id of a client's session id within a scope ("" = no auth)."""
    return f"{scope}:{client_id}" if scope else client_id


_SORTED_JSON = json.JSONEncoder(sort_keys=True, ensure_ascii=False)


def _canonical_calls(message: dict[str, Any]) -> str:
    """Tool calls as the model saw them: [name, parsed arguments] each, keys sorted ("" if none)."""
    calls = []
    for call in message.get("tool_calls") or ():
        fn = call.get("function", {})
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                pass
        calls.append([fn.get("name"), args])
    return _SORTED_JSON.encode(calls) if calls else ""


def extend_fingerprint(previous: bytes, message: dict[str, Any]) -> bytes:
    """The digest of ``previous`` followed by a message reduced to what the model saw: role, text,
    tool calls (name + parsed arguments), name and tool_call_id.

    Assistant text is compared stripped and tool-call ids are ignored, because agent frameworks
    re-serialize the replies they got back. The small fields go first, separated by NUL (``repr``
    and JSON never emit a raw NUL) and followed by the text's length, then the text itself: the
    encoding is unambiguous without escaping or copying the text, which is most of the bytes.
    """
    role = message.get("role")
    content = message.get("content") or ""
    if role == "assistant":
        content = content.strip()
    text = content.encode()  # strict: a lone surrogate (from parsed tool arguments) is a client error
    call_id = message.get("tool_call_id") if role == "tool" else None
    head = f"{role!r}\x00{message.get('name')!r}\x00{call_id!r}\x00{_canonical_calls(message)}\x00{len(text)}\x00"
    h = hashlib.blake2b(previous, digest_size=16)
    h.update(head.encode())
    h.update(text)
    return h.digest()


def fingerprints(messages: Iterable[dict[str, Any]]) -> list[bytes]:
    """Chained digests: element i fingerprints messages[0..i]."""
    out, h = [], b""
    for message in messages:
        h = extend_fingerprint(h, message)
        out.append(h)
    return out


@dataclass
class TurnState:
    """The engine-side truth after one turn: exactly the ids it holds for this history."""

    fingerprint: bytes
    n_messages: int  # messages covered, the reply included
    token_ids: IdText  # prompt ids + generated ids
    end_id: int | None  # stop token that ended the reply (None: cut by length or stop string)


@dataclass
class Session:
    id: str  # scoped: what the registry, the policy and SGLang see
    explicit: bool
    scope: str = ""
    created_at: float = field(default_factory=time.monotonic)
    last_active: float = field(default_factory=time.monotonic)
    turns: "OrderedDict[bytes, TurnState]" = field(default_factory=OrderedDict)
    inflight: int = 0
    context_tokens: int = 0
    turn_count: int = 0

    @property
    def public_id(self) -> str:
        """The id as its client knows it (the scope prefix removed)."""
        return self.id[len(self.scope) + 1 :] if self.scope else self.id

    def state(self, lease_until: float | None, now: float) -> str:
        if self.inflight:
            return "generating"
        if lease_until is not None and lease_until > now:
            return "leased"
        return "idle"

    def describe(self, lease_until: float | None) -> dict[str, Any]:
        """The /v1/sessions entry; ``lease_until`` comes from the policy, which owns the lease."""
        now = time.monotonic()
        return {
            "id": self.public_id,
            "explicit": self.explicit,
            "state": self.state(lease_until, now),
            "tokens": self.context_tokens,
            "turns": self.turn_count,
            "branches": len(self.turns),
            "idle_s": round(now - self.last_active, 3),
            "lease_remaining_s": round(max(0.0, lease_until - now), 3) if lease_until else None,
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


class SessionRegistry:
    """One owner for sessions and their turn states; bounded, least recently used forgotten first."""

    def __init__(self, max_sessions: int = 10_000, on_forget=None):
        self.max_sessions = max_sessions
        self._on_forget = on_forget  # called with each session dropped to respect max_sessions
        self._sessions: "OrderedDict[str, Session]" = OrderedDict()
        self._index: dict[tuple[str, bytes], str] = {}  # (scope, turn fingerprint) -> session id

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    def all(self, scope: str | None = None) -> list[Session]:
        """Every session, or only those of ``scope``."""
        return [s for s in self._sessions.values() if scope is None or s.scope == scope]

    def resolve(self, messages: list[dict[str, Any]], explicit_id: str | None, scope: str = "") -> Resolution:
        prints = fingerprints(messages)
        if explicit_id is not None:
            sid = scoped_id(scope, explicit_id)
            session = self._sessions.get(sid)
            is_new = session is None
            if session is None:
                session = self._add(Session(id=sid, explicit=True, scope=scope))
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
            else:
                session = self._add(Session(id=scoped_id(scope, f"sess-{uuid.uuid4().hex}"), explicit=False, scope=scope))
        self._sessions.move_to_end(session.id)
        return Resolution(session, base, base.n_messages if base else 0, is_new, prints[-1] if prints else b"")

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
        """Remember the ids of a finished turn so the next request can continue it."""
        session.turns[state.fingerprint] = state
        session.turns.move_to_end(state.fingerprint)
        while len(session.turns) > MAX_TURN_STATES_PER_SESSION:
            old_fp, _ = session.turns.popitem(last=False)
            if self._index.get((session.scope, old_fp)) == session.id:
                del self._index[(session.scope, old_fp)]
        self._index[(session.scope, state.fingerprint)] = session.id
        session.context_tokens = len(state.token_ids)
        session.turn_count += 1
        session.last_active = time.monotonic()

    def forget(self, session_id: str) -> Session | None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            for fp in session.turns:
                if self._index.get((session.scope, fp)) == session_id:
                    del self._index[(session.scope, fp)]
        return session

    def _add(self, session: Session) -> Session:
        self._sessions[session.id] = session
        while len(self._sessions) > self.max_sessions:
            victim = next((s for s in self._sessions.values() if not s.inflight), None)
            if victim is None:
                break
            self.forget(victim.id)
            if self._on_forget is not None:
                self._on_forget(victim)
        return session
