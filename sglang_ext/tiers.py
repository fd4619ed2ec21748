"""The host-tier rules: what a lease costs to lose, and when to lock or load it.

With HiCache a session's KV can be on the GPU, backed up on host (write-through), or only on
host. Losing the GPU copy of backed-up KV costs a reload (tokens / host-to-GPU rate), losing KV
with no host copy costs a recompute. So a lease needs a lock only while its KV would otherwise be
recomputed, or reloaded on the critical path (the session is expected back sooner than a reload
takes, plus a margin); otherwise it stays soft and SGLang may demote the KV to host. Pure
arithmetic on a ``PathState`` and the lease clock, no sglang import.
"""

from __future__ import annotations

from dataclasses import dataclass

from .lease_table import Lease
from .settings import SessionTTLSettings


@dataclass(frozen=True)
class PathState:
    """Where the tokens of a lease's path (its node up to the root) are now."""

    device_tokens: int = 0  # on the GPU
    host_only_tokens: int = 0  # only on host: a reload before the session can use them
    unbacked_tokens: int = 0  # on the GPU without a host copy: a recompute if evicted
    exists: bool = True  # the node is still in the tree (on either tier)

    @property
    def tokens(self) -> int:
        return self.device_tokens + self.host_only_tokens


def reload_s(tokens: int, settings: SessionTTLSettings) -> float:
    return tokens / settings.host_load_tokens_per_s


def critical_window(
    lease: Lease, tokens: int, now: float | None, settings: SessionTTLSettings
) -> tuple[float, float] | None:
    """[open, close] of the lease clock during which losing ``tokens`` of GPU KV would put a
    reload on the session's critical path: from a reload (+ margin) before its earliest expected
    return to its latest one (+ margin). None without an expected return."""
    expected = lease.expected_back(now)
    if expected is None:
        return None
    margin = settings.reload_margin_s
    opens = expected - lease.spread_s - reload_s(tokens, settings) - margin
    return opens, expected + lease.spread_s + margin


def in_window(window: tuple[float, float] | None, now: float | None) -> bool:
    return window is not None and now is not None and window[0] <= now <= window[1]


def host_short(host_tokens: int, leased_tokens: int, gpu_tokens: int) -> bool:
    """The host tier is short: beside the leased sessions' KV it cannot hold one more GPU pool's
    worth of copies, so a backed-up session whose GPU copy goes may lose its host copy too before
    it returns (a recompute, not a reload). Host KV no lease covers does not count: the host
    evicts it first (``order.eviction_key``), as it fills with copies of sessions that ended."""
    return host_tokens - leased_tokens < gpu_tokens


def wants_hard(
    lease: Lease,
    state: PathState,
    now: float | None,
    settings: SessionTTLSettings,
    busy: bool = False,
    host_is_short: bool = True,
) -> bool:
    """Lock the lease's KV: some of it has no host copy, or its session is due (or has a request
    waiting, ``busy``), all of it is on the GPU and (``lock_due_backed_up = "host_short"`` or
    ``defer_with_host_room``) the host tier is short (``host_is_short``: see ``host_short``)."""
    if state.unbacked_tokens > 0:
        return True
    if state.host_only_tokens > 0:
        return False  # part of it is on host already: a lock would not keep a reload away
    mode = settings.lock_due_backed_up
    if mode is False or (settings.reads_host_room and not host_is_short):
        return False
    return busy or in_window(critical_window(lease, state.tokens, now, settings), now)


def wants_prefetch(lease: Lease, state: PathState, now: float | None, settings: SessionTTLSettings) -> bool:
    """Start loading the host-only part now, so it is on the GPU when the session returns."""
    if state.host_only_tokens <= 0 or lease.prefetch is not None:
        return False
    return in_window(critical_window(lease, state.host_only_tokens, now, settings), now)


def next_change(lease: Lease, state: PathState, now: float, settings: SessionTTLSettings) -> float | None:
    """The next lease-clock time at which this lease's tier or prefetch decision may change."""
    tokens = state.host_only_tokens if state.host_only_tokens > 0 else state.tokens
    window = critical_window(lease, tokens, now, settings)
    if window is None:
        return None
    later = [t for t in window if t > now]
    return min(later) if later else None
