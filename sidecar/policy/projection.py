"""What the admission gate counts a worker at: its measured residency plus the growth its open
sessions are still expected to add (the rule itself: ``sidecar.policy.admission``).

Learned over all sessions (an exponential average, rate ``LEARNING_RATE``): the tokens a turn adds
(``growth_tokens``), the seconds from a request to its reply's end (``service_s``) and from one
request of a session to its next (``cycle_s`` = service + tool gap).
"""

from __future__ import annotations

from sidecar.policy.lifecycle import SessionRecord
from sidecar.policy.residency import Load
from sidecar.policy.settings import AdmissionSettings

LEARNING_RATE = 0.1  # of the growth, service-time and turn-cycle averages


class Projection:
    def __init__(self, settings: AdmissionSettings, predictor):
        self.settings = settings
        self.predictor = predictor
        self.growth_tokens = float(settings.expected_growth_tokens)
        self.service_s: float | None = None  # None until observed
        self.cycle_s: float | None = None

    # ------------------------------------------------------------------ learning
    def learn_growth(self, growth: int) -> None:
        if self.settings.learn_growth:
            self.growth_tokens += LEARNING_RATE * (growth - self.growth_tokens)

    def learn_service(self, seconds: float) -> None:
        self.service_s = _ewma(self.service_s, max(0.0, seconds))

    def learn_cycle(self, seconds: float) -> None:
        self.cycle_s = _ewma(self.cycle_s, seconds)

    # ------------------------------------------------------------------ projection
    def turns_ahead(self, hierarchy: bool) -> float:
        """Turns of growth a session is projected at: with a host tier ``host_tier_projection_turns``
        (its KV stays until it ends); else ``projection_horizon_s`` / the learned turn cycle, or
        ``projection_turns`` (no horizon set, or no cycle observed yet)."""
        if hierarchy:
            return self.settings.host_tier_projection_turns
        horizon = self.settings.projection_horizon_s
        if horizon > 0 and self.cycle_s:
            return horizon / self.cycle_s
        return self.settings.projection_turns

    def growth(self, hierarchy: bool) -> float:
        """Tokens a new session is expected to add before admission is reconsidered."""
        return self.growth_tokens * self.turns_ahead(hierarchy)

    def projected(self, load: Load, hierarchy: bool, growth: float, now: float) -> float:
        """Tokens the gate counts a worker's sessions at (``growth``: a session's projected growth).

        With a host tier every session holding KV counts: its context + growth_tokens x its turns
        left (the turns it took shrink what it still adds). Without one, the resident sessions:
        running ones their context + ``growth``; idle leased ones the same, or with ``idle_weight =
        duty_cycle`` that x their ``duty_cycle``.
        """
        if hierarchy:
            return load.holding_tokens + self.growth_tokens * load.holding_turns_left
        running = load.running_tokens + growth * load.running
        if self.settings.idle_weight != "duty_cycle" or self.service_s is None:
            idle = load.resident - load.running
            return running + (load.resident_tokens - load.running_tokens) + growth * idle
        return running + sum(self.duty_cycle(r, now) * (r.context_tokens + growth) for r in load.idle_leased.values())

    def duty_cycle(self, record: SessionRecord, now: float) -> float:
        """Share of the time from now to the end of an idle session's next turn that it runs:
        service / (service + remaining gap), the remaining gap being the predictor's median time
        to its return given how long it has been out (it grows for a session that is overdue).
        1 before a service time is known or while no gap is open."""
        if self.service_s is None or record.turn_ended_at is None:
            return 1.0
        dist = self.predictor.distribution(record.turn_tools, record.gap_stats)
        remaining = dist.median(max(0.0, now - record.turn_ended_at))
        if remaining == float("inf"):
            return 0.0
        total = self.service_s + remaining
        return self.service_s / total if total > 0 else 1.0


def _ewma(mean: float | None, value: float) -> float:
    return value if mean is None else mean + LEARNING_RATE * (value - mean)
