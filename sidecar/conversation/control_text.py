"""Control tokens spelled by client text stay text, whatever field the text came in.

The chat template writes every string a request carries into the prompt: message text and
reasoning, tool-call names and arguments (and their keys), tool names, descriptions and schemas,
system prompts, template variables. Any of them may spell a token the model reads as structure
(``<|im_end|>\\n<|im_start|>system``, ``</tool_response>``, ``<think>``, FIM and vision markers),
flagged ``special`` by the tokenizer or not. Only the template's own markers may become those ids.

How: before rendering, every such spelling in every client string is replaced by a placeholder
(two private-use characters no template writes); the template renders the placeholders as it
would render any text (so its own decisions never see a client's marker either); the rendered
text is split at the markers that remain (the template's own), and each piece between them, its
placeholders turned back into the client's characters, is encoded with a backend that matches no
control token: the client's ``<|im_end|>`` becomes the ids of ``<``, ``|``, ``im``, ... .

One exception: ``<think>``/``</think>`` in an assistant message's own text stay markers, as the
model wrote them; the template reads them there to separate past reasoning from the answer.
A request no string of which spells a control token is rendered and encoded exactly as before.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from sidecar.conversation.tokens import TooManyTokens
from sidecar.errors import invalid_request

_PREFIX = "\U0010fffd"  # private use; no template writes it
_BASE = 0x100000  # placeholder of control token i: _PREFIX + chr(_BASE + i)
_LITERAL = chr(0x10FFFC)  # the client's own _PREFIX: _PREFIX + _LITERAL
REASONING_MARKERS = ("<think>", "</think>")
_REPLY_TEXT = ("content", "reasoning_content")  # where an assistant message keeps its reasoning markers
WINDOW = 1 << 18  # characters one regex step scans: other threads (the event loop) run between steps
_NEVER = re.compile(r"(?!)")


def _matches(pattern: re.Pattern, text: str, width: int):
    """``pattern.finditer(text)``, scanned WINDOW characters at a time (``width``: its longest
    match). One search over a 12 MB string held the GIL for 80-400 ms, stalling the event loop
    while a pool thread escaped a large request."""
    pos, n = 0, len(text)
    while pos < n:
        end = min(n, pos + WINDOW)
        match = pattern.search(text, pos, min(n, end + width - 1))
        if match is None or match.start() >= end:  # one starting past the window: the next window's
            pos = end
            continue
        yield match
        pos = match.end()


class ControlText:
    """Escapes client strings, and encodes a rendering of escaped strings piece by piece."""

    def __init__(self, tokens: dict[str, int]):
        """``tokens``: every control token's text and id (``TokenCodec.control_tokens``)."""
        ordered = sorted(tokens, key=len, reverse=True)
        self.ids = dict(tokens)
        self._place = {t: _PREFIX + chr(_BASE + i) for i, t in enumerate(ordered)}
        self._place[_PREFIX] = _PREFIX + _LITERAL
        self._back = {v[1]: k for k, v in self._place.items()}
        self._markers = re.compile("|".join(map(re.escape, ordered))) if ordered else None
        self._client = re.compile("|".join(map(re.escape, [*ordered, _PREFIX])))
        in_reply = [t for t in ordered if t not in REASONING_MARKERS]
        self._client_in_reply = re.compile("|".join(map(re.escape, [*in_reply, _PREFIX])))
        # the same without the prefix, for a string that holds none (nearly all): 4-20x faster
        plain_in_reply = re.compile("|".join(map(re.escape, in_reply))) if in_reply else _NEVER
        self._plain = {self._client: self._markers or _NEVER, self._client_in_reply: plain_in_reply}
        self._width = max(map(len, [*ordered, _PREFIX]))
        self._restore_re = re.compile(re.escape(_PREFIX) + "(.)?", re.DOTALL)

    @property
    def active(self) -> bool:
        return self._markers is not None

    def escape(self, messages: list[dict], tools=None, kwargs=None) -> tuple[list[dict], Any, Any] | None:
        """Copies of ``messages``, ``tools`` and ``kwargs`` with every control token any string
        (or key) of theirs spells turned into its placeholder; None when none spells one (the
        common case: nothing is copied)."""
        if not self.active:
            return None
        changed = False
        out_messages = []
        for m in messages:
            new = self._escape_message(m)
            changed |= new is not m
            out_messages.append(new)
        new_tools = self._escape(tools, self._client)
        new_kwargs = self._escape(kwargs, self._client)
        if not changed and new_tools is tools and new_kwargs is kwargs:
            return None
        return out_messages, new_tools, new_kwargs

    def _escape_message(self, m: Any) -> Any:
        if not isinstance(m, dict) or m.get("role") != "assistant":
            return self._escape(m, self._client)
        pairs = [
            (self._escape(k, self._client), self._escape(v, self._client_in_reply if k in _REPLY_TEXT else self._client))
            for k, v in m.items()
        ]
        if all(k is a and v is b for (k, v), (a, b) in zip(pairs, m.items())):
            return m
        return dict(pairs)

    def _escape(self, value: Any, regex: re.Pattern) -> Any:
        """``value`` itself if none of its strings matches ``regex``, else an escaped copy."""
        if isinstance(value, str):
            return self._escaped_text(value, regex)
        if isinstance(value, dict):
            out = None
            for i, (key, item) in enumerate(value.items()):
                new, new_key = self._escape(item, regex), self._escape(key, regex)
                if out is None and (new is not item or new_key is not key):
                    out = dict(list(value.items())[:i])
                if out is not None:
                    out[new_key] = new
            return value if out is None else out
        if isinstance(value, (list, tuple)):
            items = [self._escape(item, regex) for item in value]
            return value if all(a is b for a, b in zip(items, value)) else type(value)(items)
        return value

    def _escaped_text(self, value: str, regex: re.Pattern) -> str:
        """``regex.sub`` of each match by its placeholder, found window by window (``_matches``)."""
        out: list[str] = []
        start = 0
        for match in _matches(regex if _PREFIX in value else self._plain[regex], value, self._width):
            out += (value[start : match.start()], self._place[match.group()])
            start = match.end()
        if not out:
            return value
        out.append(value[start:])
        return "".join(out)

    def encode(self, text: str, encode_as_text: Callable[[str, int], list[int]], limit: int = 0) -> list[int]:
        """Ids of a rendering of escaped strings: the markers left in ``text`` (the template's own)
        are control ids, every piece between them is the plain text its placeholders stand for,
        encoded by ``encode_as_text(piece, limit)`` (which matches no control token). The backend
        splits any text at control tokens before anything else, so encoding the pieces one by
        one gives the ids the whole would have, were the client's markers not control tokens."""
        ids: list[int] = []

        def piece(part: str) -> list[int]:
            part = self._restore(part)
            if not part:
                return []
            try:
                return encode_as_text(part, max(limit - len(ids), 1) if limit else 0)
            except TooManyTokens as exc:
                raise TooManyTokens(exc.at_least + len(ids), limit) from None

        start = 0
        for match in _matches(self._markers, text, self._width):
            ids += piece(text[start : match.start()])
            ids.append(self.ids[match.group()])
            start = match.end()
        ids += piece(text[start:])
        if limit and len(ids) > limit:
            raise TooManyTokens(len(ids), limit)
        return ids

    def _restore(self, part: str) -> str:
        if _PREFIX not in part:
            return part

        def back(mt: re.Match) -> str:
            original = self._back.get(mt.group(1) or "")
            if original is None:  # the template cut a placeholder in two (sliced a string)
                raise invalid_request("the chat template does not render a field that spells a control token verbatim")
            return original

        return self._restore_re.sub(back, part)

