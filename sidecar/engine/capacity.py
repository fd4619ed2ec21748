"""What one SGLang worker can hold, as its ``/server_info`` reports it: the KV pool and the prompt
limit. The policy admits sessions against a worker's capacity; no HTTP here, so the policy may
import it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineCapacity:
    max_total_num_tokens: int  # tokens in the worker's KV pool (0 = unknown)
    max_req_input_len: int = 0  # most prompt tokens one request may have (0 = unknown)

    @classmethod
    def from_server_info(cls, info: dict[str, Any]) -> EngineCapacity:
        """From SGLang's /server_info ({} when it did not answer: everything unknown)."""
        return cls(int(info.get("max_total_num_tokens") or 0), int(info.get("max_req_input_len") or 0))
