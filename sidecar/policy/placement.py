"""Where a new session goes when several workers serve: the worker with the most room for its
projected footprint (GPU + host tier of that worker, minus what its sessions are projected to
need: ``sidecar.policy.projection`` over ``sidecar.policy.residency``). ``choose_worker`` is the
rule (pure data in, a worker's name out); ``Placement`` feeds it each worker's room.

A session then stays on its worker (its KV is there); only a worker's loss moves it (the turn core
re-homes it, with a full recompute on the new worker).
"""

from __future__ import annotations

from collections.abc import Callable

from sidecar.engine.capacity import EngineCapacity
from sidecar.policy.lifecycle import SessionRecord
from sidecar.policy.projection import Projection
from sidecar.policy.residency import Residency
from sidecar.policy.shared_prefix import Share
from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerRoom:
    """One worker as placement sees it."""

    worker: str
    budget_tokens: float  # GPU + host tokens less (1 - headroom) x GPU tokens; 0 = capacity not known yet
    projected_tokens: float  # what its resident sessions are projected to need
    sessions: int  # its resident sessions
    overflow_tokens: float = 0.0  # how far past the budget a projection may go (``host_tier_recompute_share``)
    paced: int = 0  # its paced sessions that new ones wait behind (``Placement._holds_back``)

    @property
    def free_tokens(self) -> float:
        return self.budget_tokens - self.projected_tokens

    def fits(self, tokens: float) -> bool:
        """The gate's rule on one worker: unknown capacity or nothing resident always fits (a lone
        session always runs, so the gate cannot deadlock), else no paced session may hold new ones back
        there and the projection must fit the budget (+ the overflow it may take)."""
        return (self.budget_tokens <= 0 or self.sessions == 0
                or (not self.paced and self.projected_tokens + tokens <= self.budget_tokens + self.overflow_tokens))


def choose_worker(rooms: list[WorkerRoom], tokens: float, force: bool = False) -> str | None:
    """The worker a session of ``tokens`` projected tokens starts on: among those it fits, the one
    with the most free tokens (ties: fewer sessions, then the order given); None when it fits
    nowhere, unless ``force`` (it waited long enough, or admission is off): then the roomiest.
    Workers whose capacity is still unknown are used only when none is known."""
    known = [r for r in rooms if r.budget_tokens > 0] or rooms
    candidates = known if force else [r for r in known if r.fits(tokens)]
    if not candidates:
        return None
    order = {r.worker: i for i, r in enumerate(known)}
    best = max(candidates, key=lambda r: (r.free_tokens if r.budget_tokens > 0 else 0.0, -r.sessions, -order[r.worker]))
    return best.worker


class Placement:
    """The workers new sessions may go to, their capacities, and each one's room now."""

    def __init__(self, capacity: EngineCapacity, worker: str, headroom: float, residency: Residency,
                 projection: Projection, clock: Callable[[], float], distinct: bool = False,
                 recompute_share: float = 0.0, recompute_cost: Callable[[float], float] | None = None,
                 paced_hold_s: float = 0.0):
        """``distinct``: the budget counts what GPU + host hold without duplicates
        (``EngineCapacity.distinct_hierarchy_tokens``) instead of their sum. ``recompute_share``:
        with a host tier, the share of engine time the KV pushed past the budget may cost as it is
        recomputed (``recompute_cost(tokens)``: engine seconds to recompute a context of that size).
        ``paced_hold_s``: how long after its last turn a paced session still goes before new ones."""
        self.recompute_share = recompute_share
        self.paced_hold_s = paced_hold_s
        self.recompute_cost = recompute_cost
        self.capacities: dict[str, EngineCapacity] = {worker: capacity}  # by name (its URL)
        self.placeable: set[str] = {worker}
        self.headroom = headroom
        self.residency = residency
        self.projection = projection
        self.clock = clock
        self.distinct = distinct

    def budget(self, capacity: EngineCapacity) -> float:
        """What the worker's hierarchy holds less the headroom's share of its GPU pool (0: capacity
        not known yet). The headroom is room for prefill chunks and decode growth, which only the GPU
        pool needs: a host tier three times the GPU's adds its whole size, not 90 % of it."""
        tokens = capacity.distinct_hierarchy_tokens if self.distinct else capacity.hierarchy_tokens
        return max(0.0, tokens - (1.0 - self.headroom) * capacity.max_total_num_tokens)

    @property
    def first(self) -> EngineCapacity:
        """The first worker's capacity: with one worker, the engine's."""
        return next(iter(self.capacities.values()))

    def set_capacity(self, capacity: EngineCapacity, worker: str | None) -> None:
        worker = next(iter(self.capacities)) if worker is None else worker
        if worker not in self.capacities:
            self.placeable.add(worker)
        self.capacities[worker] = capacity

    def set_placeable(self, worker: str, placeable: bool) -> None:
        if placeable and worker in self.capacities:
            self.placeable.add(worker)
        else:
            self.placeable.discard(worker)

    def capacity_of(self, worker: str | None) -> EngineCapacity:
        """The worker's capacity (the first worker's when it has none, or with one worker)."""
        if len(self.capacities) > 1 and worker is not None:
            return self.capacities.get(worker, self.first)
        return self.first

    def hierarchy(self) -> bool:
        """The host tier decides the projection (the first worker's, as every worker is alike)."""
        return self.first.host_tokens > 0

    def overflow_tokens(self, worker: str | None, now: float) -> float:
        """Tokens past the budget ``worker`` may take with its host tier (``Projection.overflow_tokens``)."""
        if self.recompute_share <= 0 or self.recompute_cost is None or self.capacity_of(worker).host_tokens <= 0:
            return 0.0
        return self.projection.overflow_tokens(self._load(worker, now), now, self.recompute_share, self.recompute_cost)

    def summary(self, worker: str | None, now: float, candidate: float | None = None,
                share: Share | None = None) -> tuple[float, float, int]:
        """(tokens, projected tokens as the gate counts them, sessions) of ``worker``'s resident
        sessions (None: all of them), the host tier's holding sessions included where there is one;
        ``candidate``: a new session's projection and ``share`` its shared prefix (``Projection.projected``)."""
        capacity = self.capacities.get(worker, self.first) if worker is not None else self.first
        hierarchy = capacity.host_tokens > 0
        load = self._load(worker, now)
        projected = self.projection.projected(load, hierarchy, self.projection.growth(self.hierarchy()), now, candidate,
                                              share)
        if hierarchy:
            return load.holding_tokens, projected, load.holding
        return load.resident_tokens, projected, load.resident

    def rooms(self, candidate: float | None = None, share: Share | None = None) -> list[WorkerRoom]:
        """Each placeable worker's room now (``candidate``: for a new session of that projection,
        ``share`` the prefix it shares with open sessions)."""
        now = self.clock()
        out = []
        for worker, capacity in self.capacities.items():
            if worker in self.placeable:
                _, projected, sessions = self.summary(worker, now, candidate, share)
                paced = self._paced_holding_back(worker, now)
                out.append(WorkerRoom(worker, self.budget(capacity), projected, sessions,
                                      self.overflow_tokens(worker, now), paced))
        return out

    def _paced_holding_back(self, worker: str, now: float) -> int:
        """Paced sessions on ``worker`` that new sessions wait behind (none to look for with pacing off)."""
        if self.paced_hold_s <= 0:
            return 0
        return sum(self._holds_back(r, now) for r in self._load(worker, now).holding_records.values())

    def _holds_back(self, record: SessionRecord, now: float) -> bool:
        """A paced session new sessions wait behind: running, or within ``paced_hold_s`` of its last
        turn (an agent in its tool loop, back in a moment). One away longer (a long tool call, or
        gone without closing) holds nobody back: each new session would wait the door's max_wait."""
        return record.paced and (record.running > 0 or record.turn_ended_at is None
                                 or now - record.turn_ended_at < self.paced_hold_s)

    def resume(self, session_id: str, worker: str | None) -> bool:
        """A paced session's next turn has room on its ``worker``: the projection with it counted
        at its remaining growth fits the budget, or no admitted session holds KV there beside it.
        No overflow (``host_tier_recompute_share``): the session is past the budget already, and
        resuming paced sessions into the overflow recomputed 28 % of the 48-agent overload's
        history where the budget alone recomputes 4 %."""
        now = self.clock()
        load = self._load(worker, now)
        capacity = self.capacity_of(worker)
        projected = self.projection.projected(load, capacity.host_tokens > 0, self.projection.growth(self.hierarchy()),
                                              now, resuming=session_id)
        admitted = sum(not r.paced for r in load.holding_records.values() if r.session_id != session_id)
        return WorkerRoom(worker or "", self.budget(capacity), projected, admitted).fits(0.0)

    def choose(self, tokens: float, force: bool = False, share: Share | None = None) -> str | None:
        """The worker a session of ``tokens`` projected tokens fits on, or None (``force``: the
        roomiest anyway; ``share``: the prefix it shares with open sessions)."""
        return choose_worker(self.rooms(tokens, share), tokens, force)

    def resident_fraction(self, worker: str | None, now: float) -> float:
        """How full ``worker`` is with resident sessions (running or leased) over its GPU + host
        tokens: its own sessions with several workers, the one pool's otherwise."""
        capacity = self.capacity_of(worker).hierarchy_tokens
        if capacity <= 0:
            return 0.0
        return min(self._load(worker, now).resident_tokens / capacity, 1.0)

    def _load(self, worker: str | None, now: float):
        """The sessions ``worker`` answers for: the one pool's with one worker (or none named),
        its own with several."""
        if worker is None or len(self.capacities) <= 1:
            return self.residency.total(now)
        return self.residency.load(worker, now, alone=False)

    def worker_state(self) -> dict[str, tuple[float, int, int]]:
        """Per worker: (tokens of the sessions holding KV there, leases, sessions placed there)."""
        now = self.clock()
        out = {}
        for worker in self.capacities:
            load = self.residency.load(worker, now, alone=False)
            out[worker] = (float(load.holding_tokens), load.leases, load.sessions)
        return out
