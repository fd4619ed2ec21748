"""Fingerprints of message histories: a request continues the turn whose fingerprint equals its
history's, so the digest must see exactly what the model saw and nothing the client re-serializes.

Messages are in the chat-template shape every front door converts its wire format to (role,
content text, tool_calls with name + arguments, name, tool_call_id).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Iterable

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


def reply_message(content: str, tool_calls: Iterable[tuple[str, str]]) -> dict[str, Any]:
    """The sidecar's reply as the next request will carry it back (calls: (name, JSON arguments))."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    calls = [{"function": {"name": name, "arguments": arguments}} for name, arguments in tool_calls]
    if calls:
        message["tool_calls"] = calls
    return message
