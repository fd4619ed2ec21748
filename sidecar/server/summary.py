"""The one line the sidecar logs once it is configured: what it serves, in front of what, with which
capacity, policy, admission and auth, so an operator can check a start-up at a glance. It comes
before the socket is bound; "ready, listening" follows the bind."""

from __future__ import annotations

from sidecar.engine.capacity import EngineCapacity
from sidecar.engine.worker import Workers
from sidecar.settings import SidecarSettings


def startup_summary(settings: SidecarSettings, workers: Workers, model_name: str, tokenizer: str) -> str:
    server, policy, admission = settings.server, settings.policy, settings.admission
    parts = [
        f"starting on http://{server.host}:{server.port}/v1 in front of SGLang at {server.sglang_url}",
        f"model {model_name} (tokenizer {tokenizer or 'unknown'})",
        *(_capacity(worker.capacity, server.max_prompt_tokens) for worker in workers),
        "policy " + {
            "off": "off (no leases)",
            "fixed": f"fixed ({policy.fixed_ttl:g} s leases)",
            "predictive": f"predictive (leases {policy.min_ttl:g}-{policy.max_ttl:g} s)",
        }[policy.mode],
        f"admission on (headroom {admission.headroom:g}, queue {admission.max_queue})" if admission.enabled else "admission off",
        "auth " + _auth(server),
    ]
    return " | ".join(parts)


def _capacity(capacity: EngineCapacity, max_prompt_tokens: int | None) -> str:
    if not capacity.max_total_num_tokens:
        kv = "KV: unknown (no /server_info from SGLang)"
    else:
        host = f"host {capacity.host_tokens:,} tokens" if capacity.host_tokens else "no host tier"
        plugin = "session_ttl plugin" if capacity.plugin else "no session_ttl plugin (leases off)"
        kv = f"KV: GPU {capacity.max_total_num_tokens:,} tokens, {host}{_storage(capacity)}, {plugin}"
    limit = max_prompt_tokens or capacity.max_req_input_len
    return kv + (f", prompts up to {limit:,} tokens" if limit else "")


def _storage(capacity: EngineCapacity) -> str:
    if capacity.storage_backend is None:
        return ""
    return f", L3 {capacity.storage_backend} (prefetch {capacity.storage_prefetch_policy})"


def _auth(server) -> str:
    sources = [name for name, on in (("--api-key", server.api_key), (f"keys file {server.api_keys_file}", server.api_keys_file)) if on]
    return f"on ({' + '.join(sources)})" if sources else "off (no key needed)"
