"""Fingerprints of message histories: a request continues the turn whose fingerprint equals its
history's, so the digest must see exactly what the model saw and nothing the client re-serializes.

Messages are in the chat-template shape every front door converts its wire format to (role,
content text, tool_calls with name + arguments, name, tool_call_id).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable, NamedTuple

from pydantic_core import PydanticSerializationError, from_json, to_json

_SORTED_JSON = json.JSONEncoder(sort_keys=True, ensure_ascii=False)  # the rare fallback only (see below)


def _sorted(value: Any) -> Any:
    """``value`` with every object's keys in sorted order (to_json keeps insertion order)."""
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def _calls(message: dict[str, Any]) -> tuple[list[list[Any]], bool]:
    """[name, parsed arguments] of each tool call, and whether a parse took the stdlib's way.

    Parsed by pydantic-core (a turn's new messages pass here). Arguments it refuses (not JSON, or
    holding an escaped lone surrogate) take the stdlib's way as before: kept as text, or parsed
    into a str that ``extend_fingerprint`` then refuses as the client's error."""
    calls, fallback = [], False
    for call in message.get("tool_calls") or ():
        fn = call.get("function", {})
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = from_json(args)
            except ValueError:
                fallback = True
                try:
                    args = json.loads(args)
                except ValueError:
                    pass
        calls.append([fn.get("name"), args])
    return calls, fallback


def _canonical(calls: list[list[Any]], fallback: bool) -> str:
    if not calls:
        return ""
    if not fallback:
        try:
            return to_json(_sorted(calls)).decode()
        except PydanticSerializationError:  # a lone surrogate in arguments parsed upstream
            pass
    return _SORTED_JSON.encode(calls)


def _canonical_calls(message: dict[str, Any]) -> str:
    """Tool calls as the model saw them: [name, parsed arguments] each, keys sorted ("" if none)."""
    return _canonical(*_calls(message))


def _calls_json(calls: list[list[Any]], fallback: bool) -> bytes | None:
    """The calls' compact JSON in their own key order: equal bytes mean equal canonical calls
    (the same JSON values, so the same once sorted), found without sorting (see same_message)."""
    if not calls or fallback:
        return None
    try:
        return to_json(calls)
    except PydanticSerializationError:
        return None


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


def chain_fingerprint(previous: bytes, messages: Iterable[dict[str, Any]]) -> bytes:
    """``previous`` extended by each message in turn: the last of ``fingerprints`` when
    ``previous`` fingerprints the messages before these."""
    for message in messages:
        previous = extend_fingerprint(previous, message)
    return previous


def fingerprints(messages: Iterable[dict[str, Any]]) -> list[bytes]:
    """Chained digests: element i fingerprints messages[0..i]."""
    out, h = [], b""
    for message in messages:
        h = extend_fingerprint(h, message)
        out.append(h)
    return out


class MessageKey(NamedTuple):
    """A stored message reduced to what its fingerprint covers, so that the next request's copy of
    it can be compared with ``==`` (memcmp of the text) instead of being hashed again."""

    role: Any
    text: str  # stripped for an assistant message
    name: Any
    call_id: Any
    calls: tuple  # (name, arguments as sent) of each tool call: the cheap comparison
    canonical_calls: str  # _canonical_calls: the comparison when the arguments were re-serialized
    # the calls' JSON with parsed arguments in their own key order: the comparison when a door
    # parsed the arguments the reply streamed as text (every assistant message of every request)
    calls_json: bytes | None = None


def _raw_calls(message: dict[str, Any]) -> tuple:
    return tuple(
        (fn.get("name"), fn.get("arguments")) for fn in (c.get("function", {}) for c in message.get("tool_calls") or ())
    )


def message_key(message: dict[str, Any]) -> MessageKey:
    role = message.get("role")
    content = message.get("content") or ""
    calls, fallback = _calls(message)
    return MessageKey(
        role,
        content.strip() if role == "assistant" else content,
        message.get("name"),
        message.get("tool_call_id") if role == "tool" else None,
        _raw_calls(message),
        _canonical(calls, fallback),
        _calls_json(calls, fallback),
    )


def same_message(key: MessageKey, message: dict[str, Any]) -> bool:
    """Whether ``message`` has the fingerprint of the message ``key`` was made from, without
    hashing it: its role, name, tool_call_id and text compare equal, and its tool calls too (as
    sent, or once canonical when the client re-serialized their arguments)."""
    role = message.get("role")
    if role != key.role or message.get("name") != key.name:
        return False
    if (message.get("tool_call_id") if role == "tool" else None) != key.call_id:
        return False
    content = message.get("content") or ""
    if (content.strip() if role == "assistant" else content) != key.text:
        return False
    if not key.calls and not message.get("tool_calls"):
        return True
    raw = _raw_calls(message)
    if raw == key.calls:
        return True
    if key.calls_json is not None and raw and not any(isinstance(args, str) for _, args in raw):
        try:  # arguments parsed by the door: their JSON as it is, before any sorting
            if to_json([[name, args] for name, args in raw]) == key.calls_json:
                return True
        except PydanticSerializationError:
            pass
    return _canonical_calls(message) == key.canonical_calls


def _weak(role: Any, text: str, name: Any, call_id: Any, call_names: tuple) -> tuple:
    return (role, text, name, call_id, call_names)


def tail_of_key(keys: tuple[MessageKey, ...]) -> int:
    """A hash of what the last two stored messages of a turn have in common with any request's
    copies of them that ``same_message`` accepts (role, text, name, call id, tool names), and of
    how many messages the turn covers: where an implicit request looks for the turn it
    continues (equal hashes are candidates, compared in full)."""
    def weak(key: MessageKey) -> tuple:
        return _weak(key.role, key.text, key.name, key.call_id, tuple(name for name, _ in key.calls))

    return hash((weak(keys[-2]) if len(keys) > 1 else None, weak(keys[-1]), len(keys)))


def message_tail(messages: list[dict[str, Any]], i: int) -> int:
    """``tail_of_key`` of the keys of ``messages[: i + 1]``, read off the messages themselves
    (Python's string hash of two messages' text, nothing canonicalized); TypeError for a field
    that no key could hold."""
    def weak(message: dict[str, Any]) -> tuple:
        role = message.get("role")
        content = message.get("content") or ""
        names = tuple(fn.get("name") for fn in (c.get("function", {}) for c in message.get("tool_calls") or ()))
        return _weak(role, content.strip() if role == "assistant" else content, message.get("name"),
                     message.get("tool_call_id") if role == "tool" else None, names)

    return hash((weak(messages[i - 1]) if i > 0 else None, weak(messages[i]), i + 1))


def reply_message(content: str, tool_calls: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """The sidecar's reply as the next request will carry it back (calls: (name, JSON arguments))."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    calls = [{"function": {"name": name, "arguments": arguments}} for name, arguments in tool_calls]
    if calls:
        message["tool_calls"] = calls
    return message
