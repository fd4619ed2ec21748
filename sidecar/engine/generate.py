"""The ``/generate`` request of one turn, in SGLang's words: token ids, session, sampling, lease.

A turn's sampling options arrive in the sidecar's own words (``sidecar.turn.request.Sampling``,
whatever front door parsed them) and leave under SGLang's names. The lease the sidecar asks for rides in
``sampling_params.custom_params`` under the plugin's key; :mod:`sglang_ext.wire` spells it, and
this is the one sidecar module that imports it.
"""

from __future__ import annotations

import uuid
from typing import Any

from sglang_ext.wire import after_turn_state, lease_params

from sidecar.id_text import IdText
from sidecar.engine.lease import LeaseRequest


def sampling_params(sampling: Any, default_max_tokens: int, eos_ids: list[int], lease: LeaseRequest | None) -> dict[str, Any]:
    """A turn's ``Sampling`` (``sidecar.turn.request``: the sidecar's words) under SGLang's names,
    with the stop ids and the lease."""
    s = sampling
    params: dict[str, Any] = {"max_new_tokens": s.max_tokens or default_max_tokens}
    optional = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "min_p": s.min_p,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "repetition_penalty": s.repetition_penalty,
        "min_new_tokens": s.min_tokens,
        "ignore_eos": s.ignore_eos,
        "sampling_seed": s.seed,
    }
    params.update({k: v for k, v in optional.items() if v is not None})
    stop_ids = eos_ids + list(s.stop_token_ids or [])
    if stop_ids and not s.ignore_eos:
        params["stop_token_ids"] = stop_ids
    if lease is not None:
        params["custom_params"] = lease_params(lease.ttl_s, lease.expected_back_s, lease.spread_s)
    return params


def after_turn_body(session_id: str, lease: LeaseRequest) -> dict[str, Any]:
    """The ``/set_internal_state`` body that revises a finished turn's lease in the plugin."""
    return after_turn_state(
        session_id, ttl_s=lease.ttl_s, expected_back_s=lease.expected_back_s, spread_s=lease.spread_s
    )


def generate_request(
    input_ids: IdText, session_id: str, sampling_params: dict[str, Any], cache_salt: str | None = None
) -> dict[str, Any]:
    """The /generate body (the engine client adds ``stream``); a fresh ``rid`` names it for aborts.
    ``cache_salt`` namespaces SGLang's prefix cache (``RadixKey.cache_salt``): requests of
    different salts share no cached prefix."""
    body = {
        "rid": f"sidecar-{uuid.uuid4().hex}",
        "input_ids": input_ids,
        "session_id": session_id,
        "sampling_params": sampling_params,
    }
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    return body
