"""Messages to token ids through the model's own chat template, without ever re-rendering history.

A first turn (or a new branch) is rendered whole. A next turn is rendered as a *suffix*: the text the
template would put after the previous assistant reply, up to the new generation prompt. The suffix
is found by rendering an anchor conversation whose assistant content is a unique marker, followed by
the new messages, and cutting after the marker. Templates that rewrite past assistant turns (Qwen3
strips ``<think>`` blocks from them) therefore never touch ids the engine already holds.

A whole render reuses the ids of its leading system block (system prompt + tools, typically shared
by every session of an agent) from a small cache, when that block is a verbatim prefix of the render
ending at a clean tokenizer cut (see :meth:`TokenCodec.splits_at`).
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections import OrderedDict
from typing import Any

from sidecar.conversation.control_text import ControlText
from sidecar.conversation.tokens import TokenCodec, TooManyTokens
from sidecar.errors import APIError, invalid_request

_MARKER = "\u2063sidecar-reply-end\u2063"
_ANCHOR_USER = {"role": "user", "content": "."}


class HeadCache:
    """Bounded LRU: rendered system block text -> its exact ids (only blocks verified to cut cleanly).
    Locked: large prompts are rendered on the tokenizer thread, the others on the event loop."""

    def __init__(self, max_entries: int = 64, max_chars: int = 4_000_000):
        self.max_entries, self.max_chars = max_entries, max_chars
        self._entries: "OrderedDict[str, list[int] | None]" = OrderedDict()  # None: known not to cut cleanly
        self._chars = 0
        self._lock = threading.Lock()

    def get(self, text: str) -> tuple[bool, list[int] | None]:
        """(known, ids); ids None for a block known not to cut cleanly."""
        with self._lock:
            if text not in self._entries:
                return False, None
            self._entries.move_to_end(text)
            return True, self._entries[text]

    def put(self, text: str, ids: list[int] | None) -> None:
        if len(text) > self.max_chars:
            return
        with self._lock:
            if text not in self._entries:
                self._chars += len(text)
            self._entries[text] = ids
            while len(self._entries) > self.max_entries or self._chars > self.max_chars:
                old, _ = self._entries.popitem(last=False)
                self._chars -= len(old)

    def __len__(self) -> int:
        return len(self._entries)


class ChatRenderer:
    def __init__(self, tokenizer):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.codec = TokenCodec(tokenizer)
        self.eos_ids = self._eos_ids()
        self.vocab_size = len(tokenizer)  # ids the tokenizer knows (added tokens included)
        self.control = ControlText(self.codec.control_tokens())  # what client text may not spell
        self.heads = HeadCache()

    def _eos_ids(self) -> list[int]:
        ids = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        for tok in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>"):
            tid = self.tokenizer.convert_tokens_to_ids(tok)
            if isinstance(tid, int) and tid != self.tokenizer.unk_token_id and tid is not None:
                ids.add(tid)
        return sorted(ids)

    def _render(self, messages: list[dict], tools, kwargs, add_generation_prompt: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(
                messages,
                tools=tools,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                **(kwargs or {}),
            )
        except Exception as exc:  # jinja raises its own errors for messages the template refuses
            raise invalid_request(f"the chat template cannot render these messages: {exc}") from None

    def check_template_kwargs(self, kwargs: dict[str, Any] | None) -> None:
        """chat_template_kwargs are template variables (enable_thinking, ...); they may not swap the
        template itself, whose Jinja loops would run on the event loop and stall every session."""
        reserved = sorted(set(kwargs or ()) & _template_call_params(type(self.tokenizer)))
        if reserved:
            raise invalid_request(f"chat_template_kwargs may not set {', '.join(reserved)}", param="chat_template_kwargs")

    def encode(self, text: str, limit: int = 0) -> list[int]:
        return self.codec.encode(text, limit)

    def render_full(self, messages: list[dict], tools=None, kwargs=None, limit: int = 0) -> list[int]:
        """Ids of a whole conversation plus the generation prompt (first turn or new branch).
        ``limit`` > 0: TooManyTokens (``sidecar.conversation.tokens``) rather than more ids, known
        from the rendered text's length where it can be, before any tokenizing."""
        escaped = self.control.escape(messages, tools, kwargs)
        if escaped is not None:  # some field spells a control token: it stays text
            text = self._render(*escaped, add_generation_prompt=True)
            self.codec.check_fits(len(text), limit)
            return self.control.encode(text, self.codec.encode_as_text, limit)
        text = self._render(messages, tools, kwargs, add_generation_prompt=True)
        self.codec.check_fits(len(text), limit)
        head = self._head(messages, tools, kwargs, text, limit)
        if head is None:
            return self.encode(text, limit)
        head_text, head_ids = head
        try:
            return head_ids + self.encode(text[len(head_text) :], max(limit - len(head_ids), 1) if limit else 0)
        except TooManyTokens as exc:
            raise TooManyTokens(exc.at_least + len(head_ids), limit) from None

    def _head(self, messages: list[dict], tools, kwargs, text: str, limit: int = 0) -> tuple[str, list[int]] | None:
        """The leading system block of ``text`` and its ids, if it is cached (or cacheable) and
        ``text`` can be cut right after it without changing a single id."""
        head_text = self._system_block_text(messages, tools, kwargs)
        if not isinstance(head_text, str) or not text.startswith(head_text) or not self.codec.splits_at(text, len(head_text)):
            return None
        known, ids = self.heads.get(head_text)
        if not known:
            ids = self._verified_head_ids(head_text, text, limit)
            self.heads.put(head_text, ids)
        return (head_text, ids) if ids is not None else None

    def system_block_ids(self, messages: list[dict], tools=None, kwargs=None) -> list[int] | None:
        """The ids of the leading system block (system messages + tools) as ``render_full`` cached
        them; None if it did not (no system message, or a block that does not cut cleanly)."""
        head_text = self._system_block_text(messages, tools, kwargs)
        return self.heads.get(head_text)[1] if isinstance(head_text, str) else None

    def _system_block_text(self, messages: list[dict], tools, kwargs) -> str | None:
        """The rendering of the leading system messages (with the tools), if there are some and
        other messages follow."""
        n = 0
        while n < len(messages) and messages[n].get("role") == "system":
            n += 1
        if n == 0 or n == len(messages):
            return None
        try:
            return self._render(messages[:n], tools, kwargs, add_generation_prompt=False)
        except APIError:  # a template may refuse a conversation without a user turn
            return None

    def _verified_head_ids(self, head_text: str, text: str, limit: int = 0) -> list[int] | None:
        """The block's ids, once checked against encoding the whole text (paid once per block)."""
        head_ids = self.encode(head_text, limit)  # limited too: a 10 MB system prompt stops at the limit
        whole = self.encode(text, limit)
        if whole[: len(head_ids)] != head_ids or whole[len(head_ids) :] != self.encode(text[len(head_text) :], limit):
            return None
        return head_ids

    def render_suffix(
        self, new_messages: list[dict], previous_end_id: int | None, tools=None, kwargs=None, limit: int = 0
    ) -> list[int]:
        """Ids that follow a previous reply: its turn closing, the new messages, the generation prompt.

        ``previous_end_id`` is the stop token the previous reply ended with (already in the engine's
        ids); its text is not sent again. A reply cut by length gets the template's full closing.
        """
        anchor = [_ANCHOR_USER, {"role": "assistant", "content": _MARKER}]
        escaped = self.control.escape(new_messages, tools, kwargs)
        if escaped is not None:  # some field spells a control token: it stays text
            new_messages, tools, kwargs = escaped
        text = self._render(anchor + new_messages, tools, kwargs, add_generation_prompt=True)
        cut = text.rfind(_MARKER)
        if cut < 0:
            raise invalid_request("the chat template does not render assistant content verbatim")
        suffix = text[cut + len(_MARKER) :]
        if previous_end_id is not None:
            end_text = self.codec.decode([previous_end_id], skip_special_tokens=False)
            if end_text and suffix.startswith(end_text):
                suffix = suffix[len(end_text) :]
        if escaped is not None:
            return self.control.encode(suffix, self.codec.encode_as_text, limit)
        return self.encode(suffix, limit)


@functools.cache
def _template_call_params(tokenizer_type: type) -> frozenset[str]:
    """apply_chat_template's own parameters (chat_template, tokenize, ...): never template variables."""
    params = inspect.signature(tokenizer_type.apply_chat_template).parameters.values()
    return frozenset(p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)) - {"self"}
