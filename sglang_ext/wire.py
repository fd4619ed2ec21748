"""The wire between the sidecar and this plugin: the keys both sides spell.

Two channels, both plain SGLang 0.5.23 HTTP:

* **With a request.** A request's lease rides in ``sampling_params.custom_params`` of
  ``/generate`` (SGLang's request schema accepts that dict and rejects other unknown sampling
  keys): ``lease_params()``.
* **After a turn.** ``POST /set_internal_state {"server_args": {...}}`` reaches every scheduler
  rank in its input stream; the plugin takes the keys that start with ``AFTER_TURN_PREFIX`` and
  passes the rest to SGLang (which still refuses keys it does not know). Values must be numbers
  (SGLang's ``SetInternalStateReq``): ``after_turn_state()``.

This module is the one place the keys are written and parsed (``parse_*``, the plugin's side);
the sidecar's engine client and the tooling import it. No sglang import, so importing it never
loads SGLang.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# Seconds the plugin keeps the session's KV after this request finishes (0 or absent: no lease).
LEASE_TTL_PARAM = "session_lease_ttl_s"
# Seconds after this request finishes at which the session is expected to send its next request.
EXPECTED_BACK_PARAM = "session_expected_back_s"
# How early the session may come back relative to that expectation (seconds, >= 0).
EXPECTED_SPREAD_PARAM = "session_expected_spread_s"

AFTER_TURN_PREFIX = "sglang_ext:"
# After-turn fields: "sglang_ext:<field>:<session_id>" -> seconds from when the plugin applies it.
AFTER_TURN_FIELDS = {"ttl": LEASE_TTL_PARAM, "expect": EXPECTED_BACK_PARAM, "spread": EXPECTED_SPREAD_PARAM}


def lease_params(
    ttl_s: float, expected_back_s: float | None = None, spread_s: float | None = None
) -> dict[str, float]:
    """The ``custom_params`` dict that asks for a lease of ``ttl_s`` seconds, optionally saying
    when the session is expected back (seconds after this request finishes) and how early."""
    out = {LEASE_TTL_PARAM: float(ttl_s)}
    if expected_back_s is not None:
        out[EXPECTED_BACK_PARAM] = float(expected_back_s)
    if spread_s is not None:
        out[EXPECTED_SPREAD_PARAM] = float(spread_s)
    return out


def after_turn_key(field: str, session_id: str) -> str:
    if field not in AFTER_TURN_FIELDS:
        raise ValueError(f"unknown after-turn field {field!r}; known: {sorted(AFTER_TURN_FIELDS)}")
    if not session_id:
        raise ValueError("after-turn update needs a session id")
    return f"{AFTER_TURN_PREFIX}{field}:{session_id}"


def after_turn_state(
    session_id: str,
    *,
    ttl_s: float | None = None,
    expected_back_s: float | None = None,
    spread_s: float | None = None,
) -> dict[str, dict[str, float]]:
    """The JSON body of ``POST /set_internal_state`` that updates a finished turn's lease.

    ``ttl_s`` restarts the lease (0 ends it); ``expected_back_s`` / ``spread_s`` replace the
    session's expected return. All are seconds from when the plugin applies the update."""
    values = {"ttl": ttl_s, "expect": expected_back_s, "spread": spread_s}
    args = {after_turn_key(f, session_id): float(v) for f, v in values.items() if v is not None}
    if not args:
        raise ValueError("after_turn_state needs at least one of ttl_s, expected_back_s, spread_s")
    return {"server_args": args}


def parse_after_turn_key(key: str) -> tuple[str, str] | None:
    """``(field, session_id)`` of a plugin key, None for a key that is not the plugin's;
    ValueError for a plugin key that is malformed."""
    if not key.startswith(AFTER_TURN_PREFIX):
        return None
    field, sep, session_id = key[len(AFTER_TURN_PREFIX) :].partition(":")
    if not sep or field not in AFTER_TURN_FIELDS or not session_id:
        raise ValueError(
            f"malformed plugin key {key!r}; expected '{AFTER_TURN_PREFIX}<field>:<session_id>' "
            f"with field one of {sorted(AFTER_TURN_FIELDS)}"
        )
    return field, session_id


def parse_after_turn(keys: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """The plugin keys of one ``/set_internal_state`` as ``{session: {field: seconds}}``;
    ValueError naming the first bad key or value."""
    updates: dict[str, dict[str, float]] = {}
    for key, value in keys.items():
        parsed = parse_after_turn_key(key)
        if parsed is None:
            raise ValueError(f"{key!r} is not a plugin key (it starts with {AFTER_TURN_PREFIX!r})")
        field, session_id = parsed
        seconds = seconds_or_none(value)
        if seconds is None:
            raise ValueError(f"{key} must be a finite number of seconds >= 0, got {value!r}")
        updates.setdefault(session_id, {})[field] = seconds
    return updates


# ------------------------------------------------------------------ parsing (the plugin's side)
def asked_ttl(custom_params: Any) -> Any:
    """The TTL value one request sent, as sent (None when absent): for a warning about a bad one."""
    return custom_params.get(LEASE_TTL_PARAM) if isinstance(custom_params, Mapping) else None


def parse_ttl(custom_params: Any, default_ttl_s: float) -> float | None:
    """TTL in seconds requested by one request (not yet bounded: the lease table bounds it by
    ``max_ttl_s``), or None when it ends the lease.

    Missing key -> ``default_ttl_s``; 0, negative, non-finite or non-numeric -> None.
    """
    value: Any = default_ttl_s
    if isinstance(custom_params, Mapping) and LEASE_TTL_PARAM in custom_params:
        value = custom_params[LEASE_TTL_PARAM]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    if not math.isfinite(value) or value <= 0.0:
        return None
    return value


def parse_expectation(custom_params: Any) -> tuple[float | None, float]:
    """(seconds until the session is expected back, spread) asked by one request.

    No expectation, or a bad one (negative, non-finite, non-numeric), is None; a bad spread is 0."""
    if not isinstance(custom_params, Mapping):
        return None, 0.0
    expect = seconds_or_none(custom_params.get(EXPECTED_BACK_PARAM))
    spread = seconds_or_none(custom_params.get(EXPECTED_SPREAD_PARAM))
    return expect, (spread or 0.0)


def seconds_or_none(value: Any) -> float | None:
    """A finite number of seconds >= 0, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) and value >= 0.0 else None
