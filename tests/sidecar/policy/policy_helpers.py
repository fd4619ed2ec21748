"""Shared helpers for the policy tests (a fake clock, distributions, a policy on a session store)."""

from __future__ import annotations

import numpy as np
from prometheus_client import CollectorRegistry

from sidecar.conversation.store import SessionStore
from sidecar.engine.capacity import EngineCapacity
from sidecar.policy.distribution import GapDistribution, LogTimeGrid
from sidecar.policy.lease_policy import LeasePolicy
from sidecar.policy.settings import AdmissionSettings, PolicySettings


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


GRID = LogTimeGrid(min_s=0.01, horizon_s=3600.0)


def mixture(components, never: float = 0.0, sigma: float = 0.15) -> GapDistribution:
    """A gap distribution: [(probability, median seconds), ...] plus P(never back)."""
    pmf = np.zeros(GRID.size)
    for p, median in components:
        pmf += p * GRID.lognormal_pmf(median, sigma)
    pmf[GRID.overflow] += never
    return GapDistribution(GRID, pmf)


def make_policy(clock=None, capacity=100_000, registry=None, policy=None, admission=None, max_sessions=10_000, **lifecycle):
    """A LeasePolicy bound to a session store of its own (``policy.sessions``)."""
    lease_policy = LeasePolicy(
        PolicySettings(**(policy or {"mode": "predictive"})),
        AdmissionSettings(**(admission or {})),
        EngineCapacity(capacity),
        registry=registry or CollectorRegistry(),
        clock=clock or FakeClock(),
        max_sessions=max_sessions,
        **lifecycle,
    )
    return on_store(lease_policy, max_sessions)


def on_store(policy, max_sessions: int = 10_000):
    """The policy bound to a session store of its own (the store binds itself: ``policy.sessions``)."""
    SessionStore(policy, max_sessions)
    return policy


async def admit(policy, session_id: str, prompt_tokens: int, is_new_session: bool = True, prompt_ids=None) -> None:
    """A request of ``session_id`` as the turn core makes it: the session is opened in the store
    (if it is new there), then admitted (with its prompt's ids, if given)."""
    policy.sessions.open(session_id)
    if prompt_ids is None:
        await policy.admit(session_id, prompt_tokens, is_new_session)
    else:
        await policy.admit(session_id, prompt_tokens, is_new_session, prompt_ids=prompt_ids)


def lease_ttl(policy, session_id: str, context_tokens: int, now: float) -> float | None:
    """The TTL the request's lease asks for (None: no lease), through the public lease_request."""
    lease = policy.lease_request(session_id, context_tokens, now)
    return lease.ttl_s if lease is not None else None


def revised_ttl(policy, session_id: str, now: float) -> float | None:
    """The after-turn lease, sent and taken as the session's lease, as the turn core does."""
    lease = policy.after_turn(session_id, now)
    if lease is None:
        return None
    policy.lease_revised(session_id, lease, now)
    return lease.ttl_s
