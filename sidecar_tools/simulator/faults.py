"""The faults a simulated SGLang can be told to show at /generate (tests set them at any time).

Each ``*_next`` counter is consumed by one /generate request, in arrival order. Engine-wide faults
(killed, restarted, frozen, unhealthy) are methods and flags of the server itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Faults:
    """Fault injection knobs of one server.

    * ``hang_up_next``: that many requests find their connection closed before any response
      line, as when SGLang's uvicorn drops a keep-alive connection idle for 5 s
      (``SGLANG_TIMEOUT_KEEP_ALIVE``) just as the client reuses it. Nothing is recorded or run.
    * ``fail_next``: that many requests (recorded) answer ``fail_status`` with ``fail_body``.
    * ``drop_next``: that many requests lose their connection after ``drop_after_tokens``
      streamed tokens (the engine aborts them, as SGLang does for a client that went away);
      a non-streamed one runs to the end and then gets no response at all.
    * ``first_token_delay``: seconds every request waits before the engine sees it (abortable;
      the request counts as running meanwhile), e.g. a scheduler busy elsewhere.
    """

    hang_up_next: int = 0
    fail_next: int = 0
    fail_status: int = 503
    fail_body: Any = field(default_factory=lambda: {"error": {"message": "Service Unavailable (injected)"}})
    drop_next: int = 0
    drop_after_tokens: int = 0
    first_token_delay: float = 0.0

    def take_hang_up(self) -> bool:
        return self._take("hang_up_next")

    def take_failure(self) -> bool:
        return self._take("fail_next")

    def take_drop(self) -> bool:
        return self._take("drop_next")

    def _take(self, name: str) -> bool:
        left = getattr(self, name)
        if left > 0:
            setattr(self, name, left - 1)
            return True
        return False
