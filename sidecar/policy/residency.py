"""Residency: what each worker holds of the open sessions, kept as counters, not rescanned.

Every event that changes a session's record (a turn starts or ends, a lease is sent or revised,
the session is placed, re-homed or closed) calls ``update(record, now)``: the record's previous
contribution is taken off its worker's counters and the new one added. Reading a worker's
residency then costs the same at 50 and at 2,000 open sessions (the admission gate, the TTL's
pressure term and /metrics all read these counters). A lease runs out with time, not with an
event: expiries wait in a heap and every read first applies those that passed (``advance``).

A session counts on its worker (``record.worker``; one not placed yet counts on no worker, which
the sole worker's figures include when there is one worker) as
    running   a request of it is admitted and not released,
    leased    the lease the sidecar asked for has not expired,
    resident  running or leased (its KV is in use or held on the GPU),
    holding   resident, or a turn of it finished (the engine has its KV in one of its tiers),
and, while holding, with ``turns left`` = max(projected turns - turns it took, 1) (or, with
``shrink`` off, all the projected turns; none while it is paced: it grows only as the gate lets
its turns through): the turns of growth the gate still expects of it where the host tier keeps
every open session's KV (``sidecar.policy.admission``).
"""

from __future__ import annotations

import heapq
import itertools
from collections import ChainMap
from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass, field

from sidecar.policy.lifecycle import SessionRecord


@dataclass
class Load:
    """The counters of one worker (or of the sessions placed nowhere yet)."""

    sessions: int = 0
    leases: int = 0
    running: int = 0
    running_tokens: int = 0
    resident: int = 0
    resident_tokens: int = 0
    holding: int = 0
    holding_tokens: int = 0
    holding_turns_left: float = 0.0
    # resident sessions with no request running (leased, idle): the duty-cycle weight is
    # per session and time, so the gate weighs these few one by one (insertion-ordered)
    idle_leased: MutableMapping[str, SessionRecord] = field(default_factory=dict)
    # the holding sessions one by one, for the rules that weigh each (``projection.Projection``)
    holding_records: MutableMapping[str, SessionRecord] = field(default_factory=dict)

    def plus(self, other: Load) -> Load:
        """The sum of two loads (the idle sessions of both)."""
        return Load(
            self.sessions + other.sessions,
            self.leases + other.leases,
            self.running + other.running,
            self.running_tokens + other.running_tokens,
            self.resident + other.resident,
            self.resident_tokens + other.resident_tokens,
            self.holding + other.holding,
            self.holding_tokens + other.holding_tokens,
            self.holding_turns_left + other.holding_turns_left,
            ChainMap(self.idle_leased, other.idle_leased),  # read-only: no copy of either
            ChainMap(self.holding_records, other.holding_records),
        )


# what one record adds: (worker, running, leased, holding, tokens, turns left)
_Contribution = tuple[str | None, bool, bool, bool, int, float]


def growth_turns(record: SessionRecord, turns_left: Callable[[int], float]) -> float:
    """The turns of growth still counted for a holding session: ``turns_left(turns taken)``, or none
    while it is paced (it grows only as the gate lets its turns through). The residency's counters
    and the gate's projection both count by this."""
    return 0.0 if record.paced else turns_left(record.turns)


class Residency:
    """Per-worker counters of the open sessions (see the module docstring)."""

    def __init__(self, projected_turns: float, shrink: bool = True):
        self.projected_turns = projected_turns  # host tier: the turns a session is projected at admission
        self.shrink = shrink  # False: every session keeps all of them until it closes
        self._loads: dict[str | None, Load] = {}
        self._counted: dict[str, _Contribution] = {}  # session id -> what it adds now
        self._records: dict[str, SessionRecord] = {}
        self._expiries: list[tuple[float, int, SessionRecord]] = []
        self._expiry_queued: dict[str, float] = {}  # session id -> the lease expiry last pushed for it
        self._seq = itertools.count()
        self.now = float("-inf")  # the latest time counted (reads at an earlier time see this one)

    def __len__(self) -> int:
        return len(self._counted)

    # ------------------------------------------------------------------ events
    def update(self, record: SessionRecord, now: float) -> None:
        """The record changed (or is new): count what it adds from now on."""
        self.advance(now)
        sid = record.session_id
        old = self._counted.get(sid)
        new = self._contribution(record, max(now, self.now))
        if old != new or self._records.get(sid) is not record:
            if old is not None:
                self._apply(self._records[sid], old, -1)
            self._counted[sid] = new
            self._records[sid] = record
            self._apply(record, new, +1)
        # leased: it stops being so at its expiry, also where a revision moved only the expiry
        if new[2] and self._expiry_queued.get(sid) != record.lease_expires_at:
            self._expiry_queued[sid] = record.lease_expires_at
            heapq.heappush(self._expiries, (record.lease_expires_at, next(self._seq), record))

    def remove(self, record: SessionRecord) -> None:
        """The session was closed: it counts nowhere any more."""
        sid = record.session_id
        old = self._counted.pop(sid, None)
        self._expiry_queued.pop(sid, None)
        if old is not None:
            self._apply(self._records.pop(sid), old, -1)

    def advance(self, now: float) -> None:
        """Leases that expired by ``now`` stop counting as such."""
        if now <= self.now:
            return
        self.now = now
        expiries = self._expiries
        while expiries and expiries[0][0] <= now:
            expires, _, record = heapq.heappop(expiries)
            if self._expiry_queued.get(record.session_id) == expires:
                del self._expiry_queued[record.session_id]
            counted = self._counted.get(record.session_id)
            if counted is not None and counted[2] and self._records[record.session_id] is record:
                if record.lease_expires_at is None or record.lease_expires_at <= now:
                    self.update(record, now)

    def turns_left(self, turns: int) -> float:
        """The turns of growth still expected of a session that took ``turns``."""
        return max(self.projected_turns - (turns if self.shrink else 0), 1.0)

    # ------------------------------------------------------------------ reads
    def load(self, worker: str | None, now: float, alone: bool) -> Load:
        """The counters of ``worker`` at ``now``; ``alone`` (one worker): with the unplaced sessions."""
        self.advance(now)
        own = self._loads.get(worker) or Load()
        if alone and worker is not None and None in self._loads:
            return own.plus(self._loads[None])
        return own

    def total(self, now: float) -> Load:
        """Every open session's counters together."""
        self.advance(now)
        loads = list(self._loads.values())
        out = loads[0] if loads else Load()
        for load in loads[1:]:
            out = out.plus(load)
        return out

    def workers(self) -> Iterable[str]:
        return [w for w in self._loads if w is not None]

    # ------------------------------------------------------------------ internals
    def _contribution(self, r: SessionRecord, now: float) -> _Contribution:
        running = r.running > 0
        leased = r.lease_expires_at is not None and now < r.lease_expires_at
        holding = running or leased or r.holds_kv()
        turns_left = growth_turns(r, self.turns_left) if holding else 0.0
        return (r.worker, running, leased, holding, r.context_tokens, turns_left)

    def _apply(self, record: SessionRecord, c: _Contribution, sign: int) -> None:
        worker, running, leased, holding, tokens, turns_left = c
        load = self._loads.get(worker)
        if load is None:
            load = self._loads[worker] = Load()
        load.sessions += sign
        if leased:
            load.leases += sign
        if running:
            load.running += sign
            load.running_tokens += sign * tokens
        if running or leased:
            load.resident += sign
            load.resident_tokens += sign * tokens
            if not running:
                if sign > 0:
                    load.idle_leased[record.session_id] = record
                else:
                    load.idle_leased.pop(record.session_id, None)
        if holding:
            load.holding += sign
            load.holding_tokens += sign * tokens
            load.holding_turns_left += sign * turns_left
            if sign > 0:
                load.holding_records[record.session_id] = record
            else:
                load.holding_records.pop(record.session_id, None)
