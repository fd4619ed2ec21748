"""The wire between the sidecar and this plugin: the keys both sides spell.

A request's lease rides in ``sampling_params.custom_params`` of ``/generate`` (SGLang's request
schema accepts that dict and rejects other unknown sampling keys). This module is the one place
the keys are written; the sidecar's engine client and the tooling import it. No sglang import, so
importing it never loads SGLang.
"""

from __future__ import annotations

# Seconds the plugin keeps the session's KV after this request finishes (0 or absent: no lease).
LEASE_TTL_PARAM = "session_lease_ttl_s"


def lease_params(ttl_s: float) -> dict[str, float]:
    """The ``custom_params`` dict that asks for a lease of ``ttl_s`` seconds."""
    return {LEASE_TTL_PARAM: float(ttl_s)}
