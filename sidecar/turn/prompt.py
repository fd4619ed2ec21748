"""The exact ids a turn sends the engine, and the one error for a prompt past the length limit.

A continuing turn sends the engine's own ids of the previous turn and renders only the new
messages after them (what SGLang cached is matched token for token); a new session or a branch
renders the whole history. Either way the length limit is checked ahead where the text's length
alone tells, so no megabytes are tokenized only to be refused.
"""

from __future__ import annotations

from sidecar.conversation.chat_template import ChatRenderer
from sidecar.conversation.store import Resolution
from sidecar.conversation.tokens import TooManyTokens
from sidecar.errors import APIError, invalid_request
from sidecar.id_text import IdText
from sidecar.turn.request import TurnRequest


def prompt_ids(renderer: ChatRenderer, req: TurnRequest, res: Resolution, forced: str | None, limit: int) -> IdText:
    """The engine's ids of the previous turn + only the new messages, or the whole history,
    then the forced tool-call prefix; TooManyTokens past ``limit`` (0: none), known before
    tokenizing where the text's length alone tells (``TokenCodec.check_fits``)."""
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
