"""What the simulated model says, and where SGLang makes it stop.

A *responder* is the model: ``responder(input_ids, sampling_params) -> ids`` (may be async).
``plan_reply`` then applies SGLang's stop rules to whatever it returned, as the scheduler's
``Req.check_finished`` does: the first EOS id (the model's, plus ``stop_token_ids``) ends the reply
and is kept in ``output_ids``, ``ignore_eos`` disables both, ``max_new_tokens`` caps the length.
``stop`` strings need a tokenizer and are refused earlier (``generate_request``). No sglang import.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Awaitable, Callable
from typing import Any

IM_END_ID = 151645  # Qwen3's <|im_end|>
ENDOFTEXT_ID = 151643  # Qwen3's <|endoftext|>
DEFAULT_EOS_IDS = (IM_END_ID, ENDOFTEXT_ID)  # generation_config.json of Qwen3
QWEN3_NUM_BPE_TOKENS = 151643  # ids below this are plain BPE tokens, never special

Responder = Callable[[list[int], dict[str, Any]], list[int] | Awaitable[list[int]]]


def random_responder(seed: int = 0, vocab: tuple[int, int] = (0, QWEN3_NUM_BPE_TOKENS)) -> Responder:
    """Dummy weights decoding greedily: the same prompt (and seed) gives the same reply.

    ``max_new_tokens`` plain ids in ``[vocab[0], vocab[1])``, never a special id, so generation
    ends with ``length`` unless the client adds ``stop_token_ids``."""
    low, high = vocab

    def responder(input_ids: list[int], sampling_params: dict[str, Any]) -> list[int]:
        digest = hashlib.sha256(f"{seed}:{input_ids}".encode()).digest()
        rng = random.Random(int.from_bytes(digest[:8], "big"))
        count = sampling_params.get("max_new_tokens")
        return [rng.randrange(low, high) for _ in range(128 if count is None else count)]

    return responder


def scripted_responder(*outputs: list[int]) -> Responder:
    """The given id lists, one per request, in order; the last one repeats.

    E.g. ``scripted_responder(tok.encode('<tool_call>...</tool_call>') + [IM_END_ID])``."""
    if not outputs:
        raise ValueError("scripted_responder needs at least one reply")
    queue = [list(o) for o in outputs]

    def responder(input_ids: list[int], sampling_params: dict[str, Any]) -> list[int]:
        return list(queue.pop(0) if len(queue) > 1 else queue[0])

    return responder


def plan_reply(raw: list[int], sampling_params: dict[str, Any], max_new_tokens: int,
               eos_token_ids: tuple[int, ...] = DEFAULT_EOS_IDS) -> tuple[list[int], dict[str, Any]]:
    """(the ids SGLang would emit, its finish reason) for a model that would say ``raw``.

    A reply that runs dry before any stop finishes with ``length`` at its own length."""
    stop_ids: set[int] = set()
    if not sampling_params.get("ignore_eos"):
        stop_ids = set(eos_token_ids) | set(sampling_params.get("stop_token_ids") or [])
    planned: list[int] = []
    for token in list(raw)[:max_new_tokens]:
        planned.append(int(token))
        if token in stop_ids:
            return planned, {"type": "stop", "matched": int(token)}
    return planned, {"type": "length", "length": len(planned)}
