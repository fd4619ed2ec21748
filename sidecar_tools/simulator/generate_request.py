"""What SGLang 0.5.23 accepts at /generate, for the simulated server (``server.py``) that serves it.

Two gates, in SGLang's order (``../shared/docs/sglang-0.5.23-internals.md``):

* the schema, ``sglang.api.v1.GenerateRequest``: field types and the closed set of sampling keys.
  SGLang answers ``400 {"error": "<text>"}`` (a plain string) before anything else runs;
* the semantic checks of the tokenizer manager and ``SamplingParams.verify`` that a server
  launched with ``--skip-tokenizer-init`` makes afterwards: a prompt of ids, value ranges, no
  option that needs a tokenizer, and the context length. Answered as an error object (in-stream
  when streaming).

What the simulator does not emulate (batches, n > 1) it refuses itself. No sglang import.
"""

from __future__ import annotations

from typing import Any

VOCAB_SIZE = 151936  # Qwen3's config.json vocab_size (embedding rows)

TEXT_PROMPT_ERROR = (
    "The engine initialized with skip_tokenizer_init=True cannot accept text prompts. "
    "Please provide input_ids or re-initialize the engine with skip_tokenizer_init=False."
)

# SamplingParams contract of sglang.api.v1 (unknown keys rejected), name -> kind.
SAMPLING_PARAM_KINDS: dict[str, str] = {
    "max_new_tokens": "int",
    "stop": "str_or_list",
    "stop_token_ids": "int_list",
    "stop_regex": "str_or_list",
    "temperature": "float",
    "top_p": "float",
    "top_k": "int",
    "min_p": "float",
    "frequency_penalty": "float",
    "presence_penalty": "float",
    "repetition_penalty": "float",
    "min_new_tokens": "int",
    "n": "int",
    "json_schema": "str",
    "regex": "str",
    "ebnf": "str",
    "structural_tag": "str",
    "ignore_eos": "bool",
    "skip_special_tokens": "bool",
    "spaces_between_special_tokens": "bool",
    "no_stop_trim": "bool",
    "stream_interval": "int",
    "logit_bias": "dict",
    "sampling_seed": "int",
    "custom_params": "any",
    "beam_width": "int",
    "watermark": "dict",
    "choice": "str_list",
}


class GenerateRequestError(ValueError):
    """A request SGLang refuses; ``status`` is the HTTP status it answers with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


class SchemaError(GenerateRequestError):
    """Refused by the schema gate: SGLang answers ``400 {"error": "<text>"}`` (a plain string)."""


# --------------------------------------------------------------------------- the schema gate


def check_schema(body: Any) -> None:
    """Field types of ``GenerateRequest`` and its sampling params (unknown sampling keys too)."""
    if not isinstance(body, dict):
        raise SchemaError("invalid type: expected a JSON object for GenerateRequest")
    _check_type(body.get("rid"), "str_or_list", "rid")
    _check_type(body.get("text"), "str_or_list", "text")
    _check_token_ids(body.get("input_ids"))
    _check_type(body.get("stream"), "bool", "stream")
    _check_type(body.get("session_id"), "str", "session_id")
    _check_type(body.get("extra_key"), "str_or_list", "extra_key")
    _check_type(body.get("cache_salt"), "str_or_list", "cache_salt")
    _check_type(body.get("priority"), "int", "priority")
    params = body.get("sampling_params")
    for one in params if isinstance(params, list) else [params]:
        _check_sampling_types(one)


def _check_sampling_types(params: Any) -> None:
    if params is None:
        return
    if not isinstance(params, dict):
        raise SchemaError(f"invalid type: {_describe(params)}, expected a JSON object for SamplingParams")
    for key, value in params.items():
        kind = SAMPLING_PARAM_KINDS.get(key)
        if kind is None:
            expected = ", ".join(f"`{k}`" for k in SAMPLING_PARAM_KINDS)
            raise SchemaError(f"unknown field `{key}`, expected one of {expected}")
        _check_type(value, kind, key)


def _check_token_ids(value: Any) -> None:
    if value is None:
        return
    ok = isinstance(value, list) and (
        all(_is_int(v) for v in value) or all(isinstance(v, list) and all(_is_int(x) for x in v) for v in value)
    )
    if not ok:
        raise SchemaError(f"invalid type: {_describe(value)}, expected a value or an array of values for TokenIdsOrList")


_KIND_CHECKS = {
    "int": lambda v: _is_int(v),
    "float": lambda v: _is_int(v) or isinstance(v, float),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "dict": lambda v: isinstance(v, dict),
    "str_or_list": lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v)),
    "int_list": lambda v: isinstance(v, list) and all(_is_int(x) for x in v),
    "str_list": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
}


def _check_type(value: Any, kind: str, name: str) -> None:
    if value is None or kind == "any":
        return
    if not _KIND_CHECKS[kind](value):
        expected = {"int": "i64", "float": "f64", "bool": "a boolean", "str": "a string"}.get(kind, kind)
        raise SchemaError(f"invalid type: {_describe(value)}, expected {expected} (field `{name}`)")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _describe(value: Any) -> str:
    if isinstance(value, str):
        return f'string "{value}"'
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    return type(value).__name__


# --------------------------------------------------------------------------- the semantic checks


def check_prompt(body: dict) -> Any:
    """The prompt's ``input_ids`` (a flat list, or a batch of lists): no text prompts without a
    tokenizer, and a session continues either by id or by ``session_params``, not both."""
    if body.get("session_id") is not None and body.get("session_params") is not None:
        raise GenerateRequestError("session_id and session_params cannot both be set.")
    input_ids = body.get("input_ids")
    if input_ids is None:
        if body.get("text") is not None:
            raise GenerateRequestError(TEXT_PROMPT_ERROR)
        raise GenerateRequestError("Either text, input_ids or input_embeds should be provided.")
    return input_ids


def check_sampling(params: dict) -> None:
    """``SamplingParams.verify`` (the part a client can trip over) and, without a tokenizer,
    ``raise_if_tokenizer_required``: stop strings, stop regexes and min_new_tokens need one."""
    _check_sampling_values(params)
    _raise_if_tokenizer_required(params)


def _check_sampling_values(p: dict) -> None:
    temperature = p.get("temperature", 1.0)
    if temperature is not None and temperature < 0:
        raise GenerateRequestError(f"temperature must be a non-negative finite number, got {temperature}.")
    top_p = p.get("top_p", 1.0)
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise GenerateRequestError(f"top_p must be in (0, 1], got {top_p}.")
    top_k = p.get("top_k")
    if top_k is not None and (top_k < 1 and top_k != -1):
        raise GenerateRequestError(f"top_k must be -1 (disable) or at least 1, got {top_k}.")
    for name in ("frequency_penalty", "presence_penalty"):
        value = p.get(name)
        if value is not None and not -2.0 <= value <= 2.0:
            raise GenerateRequestError(f"{name} must be in [-2, 2], got {value}.")
    max_new = p.get("max_new_tokens")
    if max_new is not None and max_new < 0:
        raise GenerateRequestError(f"max_new_tokens must be at least 0, got {max_new}.")
    grammars = [p.get(k) for k in ("json_schema", "regex", "ebnf", "structural_tag")]
    if sum(g is not None for g in grammars) > 1:
        raise GenerateRequestError("Only one of json_schema, regex, ebnf, or structural_tag can be set.")


def _raise_if_tokenizer_required(p: dict) -> None:
    for key in ("stop", "stop_regex"):  # text matching needs the tokenizer to decode
        value = p.get(key)
        if value:
            value = [value] if isinstance(value, str) else value
            raise GenerateRequestError(
                f"{key}={value!r} is unavailable when skip_tokenizer_init=True "
                "(requires tokenizer to decode tokens to text for matching)."
            )
    min_new = p.get("min_new_tokens") or 0
    if min_new > 0:
        raise GenerateRequestError(
            f"min_new_tokens={min_new} is unavailable when skip_tokenizer_init=True "
            "(requires tokenizer for eos_token_id)."
        )


def check_lengths(input_ids: list, params: dict, context_length: int) -> None:
    """``TokenizerManager._validate_one_request``: the prompt, and prompt + ``max_new_tokens``,
    must fit the model's context length (no ``--allow-auto-truncate``)."""
    n_in = len(input_ids)
    if n_in >= context_length:
        raise GenerateRequestError(
            f"The input ({n_in} tokens) is longer than the model's context length ({context_length} tokens)."
        )
    max_new = params.get("max_new_tokens")
    if max_new is not None and max_new + n_in > context_length:
        raise GenerateRequestError(
            "Requested token count exceeds the model's maximum context length "
            f"of {context_length} tokens. You requested a total of {max_new + n_in} "
            f"tokens: {n_in} tokens from the input messages and {max_new} tokens for "
            "the completion. Please reduce the number of tokens in the input messages "
            "or the completion to fit within the limit."
        )
