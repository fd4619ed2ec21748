"""The policy's calls of one turn, in the order a turn makes them.

The turn core (``sidecar.turn.core.Turn``) makes these calls, and so do the simulator's
in-process sidecar (``sidecar_tools.simulator.virtual_replay.SidecarLoop``) and the offline gap
replay (``sidecar_tools.gaps.evaluate``): one sequence, so what the tools measure is what the
product does. Admission (``policy.admit``, or the simulator's
``offer_admission`` in virtual time) comes before :func:`turn_started`; ``release_admission``
after the turn ended, however it ended.
"""

from __future__ import annotations

from collections.abc import Callable

from sidecar.engine.lease import LeaseRequest
from sidecar.policy import SessionPolicy, TurnEnd

REVISE_IF_CHANGED_BY = 0.2  # relative change of the TTL or the expected return worth a message


def turn_started(policy: SessionPolicy, session_id: str, prompt_tokens: int, now: float) -> LeaseRequest | None:
    """The request leaves for its worker: the policy counts it, then says the lease it asks for
    (None: no lease)."""
    policy.on_request(session_id, prompt_tokens, now)
    return policy.lease_request(session_id, prompt_tokens, now)


def turn_finished(
    policy: SessionPolicy,
    session_id: str,
    context_tokens: int,
    tool_names: list[str],
    sent: LeaseRequest | None,
    now: float,
    revise: Callable[[LeaseRequest], object] | None,
) -> None:
    """A turn finished (``context_tokens``: prompt + reply): the gap starts, and the lease
    revised for it goes to the worker through ``revise`` (None: the worker has no plugin) when it
    moved from what the request carried (``sent``), and the policy hears it went."""
    policy.on_turn_end(TurnEnd(session_id, context_tokens, tool_names, now))
    revised = policy.after_turn(session_id, now)
    if revised is not None and revise is not None and worth_revising(sent, revised):
        revise(revised)
        policy.lease_revised(session_id, revised, now)


def worth_revising(sent: LeaseRequest | None, revised: LeaseRequest) -> bool:
    """Send the after-turn lease only when the reply's tools moved the prediction (most turns'
    expectation is what the request already carried; each update is one more call to SGLang)."""
    if sent is None:
        return True

    def moved(a: float | None, b: float | None) -> bool:
        if a is None or b is None:
            return (a is None) != (b is None)
        return abs(a - b) > REVISE_IF_CHANGED_BY * max(abs(a), 1e-3)

    return moved(sent.ttl_s, revised.ttl_s) or moved(sent.expected_back_s, revised.expected_back_s)
