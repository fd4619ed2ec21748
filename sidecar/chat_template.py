"""Messages to token ids through the model's own chat template, without ever re-rendering history.

A first turn (or a new branch) is rendered whole. A next turn is rendered as a *suffix*: the text the
template would put after the previous assistant reply, up to the new generation prompt. The suffix
is found by rendering an anchor conversation whose assistant content is a unique marker, followed by
the new messages, and cutting after the marker. Templates that rewrite past assistant turns (Qwen3
strips ``<think>`` blocks from them) therefore never touch ids the engine already holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sidecar.errors import invalid_request

_MARKER = "\u2063sidecar-reply-end\u2063"
_ANCHOR_USER = {"role": "user", "content": "."}


@dataclass(frozen=True)
class ForcedPrefix:
    """Text appended after the generation prompt to force a tool call (tool_choice required/named)."""

    text: str


class ChatRenderer:
    def __init__(self, tokenizer, template_kwargs: dict[str, Any] | None = None):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        self.eos_ids = self._eos_ids()

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
                **{**self.template_kwargs, **(kwargs or {})},
            )
        except Exception as exc:  # jinja raises its own errors for messages the template refuses
            raise invalid_request(f"the chat template cannot render these messages: {exc}") from None

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def render_full(self, messages: list[dict], tools=None, kwargs=None) -> list[int]:
        """Ids of a whole conversation plus the generation prompt (first turn or new branch)."""
        return self.encode(self._render(messages, tools, kwargs, add_generation_prompt=True))

    def render_suffix(
        self, new_messages: list[dict], previous_end_id: int | None, tools=None, kwargs=None
    ) -> list[int]:
        """Ids that follow a previous reply: its turn closing, the new messages, the generation prompt.

        ``previous_end_id`` is the stop token the previous reply ended with (already in the engine's
        ids); its text is not sent again. A reply cut by length gets the template's full closing.
        """
        anchor = [_ANCHOR_USER, {"role": "assistant", "content": _MARKER}]
        text = self._render(anchor + new_messages, tools, kwargs, add_generation_prompt=True)
        cut = text.rfind(_MARKER)
        if cut < 0:
            raise invalid_request("the chat template does not render assistant content verbatim")
        suffix = text[cut + len(_MARKER) :]
        if previous_end_id is not None:
            end_text = self.tokenizer.decode([previous_end_id], skip_special_tokens=False)
            if end_text and suffix.startswith(end_text):
                suffix = suffix[len(end_text) :]
        return self.encode(suffix)

    def forced_prefix(self, tool_choice, tools) -> ForcedPrefix | None:
        """Hermes-style forcing: 'required' opens a tool call, a named choice also writes the name."""
        if tool_choice == "required":
            return ForcedPrefix("<tool_call>\n")
        if tool_choice is not None and not isinstance(tool_choice, str):
            name = tool_choice.function.name
            return ForcedPrefix('<tool_call>\n{"name": "' + name + '", "arguments": ')
        return None

