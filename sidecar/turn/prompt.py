"""The exact ids a turn sends the engine, and the one error for a prompt past the length limit.

A continuing turn sends the engine's own ids of the previous turn and renders only the new
messages after them (what SGLang cached is matched token for token); a new session or a branch
renders the whole history. Either way the length limit is checked ahead where the text's length
alone tells, so no megabytes are tokenized only to be refused.
"""

from __future__ import annotations

from typing import Any

from sidecar.conversation.chat_template import ChatRenderer
from sidecar.conversation.store import Resolution
from sidecar.conversation.tokens import CUT_SLACK, TooManyTokens
from sidecar.errors import APIError, invalid_request
from sidecar.id_text import IdText
from sidecar.turn.request import TurnRequest


def prompt_ids(renderer: ChatRenderer, req: TurnRequest, res: Resolution, forced: str | None, limit: int) -> IdText:
    """The engine's ids of the previous turn + only the new messages, or the whole history,
    then the forced tool-call prefix; TooManyTokens past ``limit`` (0: none), known before
    tokenizing where the text's length alone tells (``TokenCodec.check_fits``)."""
    res.fill_keys(req.messages)  # the new messages' keys, of their size too (off the loop when large)
    if res.base is not None:
        new = req.messages[res.new_messages_from :]
        room = max(limit - len(res.base.token_ids), 1) if limit else 0
        try:
            ids = res.base.token_ids + renderer.render_suffix(new, res.base.end_id, req.tools, req.template_kwargs, room)
        except TooManyTokens as exc:
            raise TooManyTokens(exc.at_least + len(res.base.token_ids), limit) from None
    else:
        ids = IdText(renderer.render_full(req.messages, req.tools, req.template_kwargs, limit))
    if forced is not None:
        ids += renderer.encode(forced)
    return ids


def too_long(count: str, limit: int) -> APIError:
    """The 400 of a prompt of ``count`` tokens ("at least N" when counting stopped early)."""
    return invalid_request(
        f"prompt is {count} tokens, more than the limit of {limit}", param="messages", code="context_length_exceeded"
    )


COUNT_TOKENS_LIMIT = 1 << 18  # count_tokens' limit while no worker has told its own
SURELY_TOO_LONG_CHARS_PER_TOKEN = 8  # a request with more text than this per allowed token is counted before it is hashed
COUNTED_STRING_CHARS = 1024  # the strings it is counted by: those at least this long (each loses 2 x CUT_SLACK)


def count_rendered_strings(codec, req: TurnRequest, limit: int) -> None:
    """TooManyTokens if the long strings every chat template writes whole (tool results', users' and
    system text, tool calls, tool definitions, template variables; not assistant text, whose
    reasoning a template may drop) have more than ``limit`` tokens as plain text, less CUT_SLACK
    at either end of each (where they meet the template's text). Counting stops past the limit."""
    strings: list[str] = []
    _long_strings([m for m in req.messages if m.get("role") != "assistant"], strings, content_only=True)
    _long_strings([m.get("tool_calls") for m in req.messages if m.get("role") == "assistant"], strings)
    _long_strings([req.tools, req.template_kwargs], strings)
    counted = 0
    for text in sorted(strings, key=len, reverse=True):
        room = limit - counted + 2 * CUT_SLACK
        try:
            counted += len(codec.encode_as_text(text, room)) - 2 * CUT_SLACK
        except TooManyTokens as exc:
            raise TooManyTokens(counted + exc.at_least - 2 * CUT_SLACK, limit) from None
        if counted > limit:
            raise TooManyTokens(counted, limit)


def _long_strings(value: Any, out: list[str], content_only: bool = False) -> None:
    """The strings of at least COUNTED_STRING_CHARS in ``value`` (of each message only its content)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if len(item) >= COUNTED_STRING_CHARS:
                out.append(item)
        elif isinstance(item, dict):
            stack.extend([item.get("content")] if content_only else item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
