"""What the admission gate counts a worker at: its measured residency plus the growth its open
sessions are still expected to add (the rule itself: ``sidecar.policy.admission``).

Learned over all sessions (an exponential average, rate ``LEARNING_RATE``): the tokens a turn adds
(``growth_tokens``; with ``growth_prior_turns`` a mean in which the prior counts for that many turns,
then forgetting at ``GROWTH_FORGETTING`` a turn), the seconds from a request to its reply's end (``service_s``) and from one
request of a session to its next (``cycle_s`` = service + tool gap); with ``learn_session_turns``
also the turns a session takes before it ends (``session_turns``, a running mean at first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sidecar.policy.lifecycle import SessionRecord
from sidecar.policy.residency import Load, growth_turns
from sidecar.policy.settings import AdmissionSettings
from sidecar.policy.shared_prefix import Share

LEARNING_RATE = 0.1  # of the growth, service-time and turn-cycle averages
GROWTH_FORGETTING = 0.01  # with growth_prior_turns: the growth's rate once it is a mean of 100 turns


class Projection:
    def __init__(self, settings: AdmissionSettings, predictor, turns_left: Callable[[int], float] | None = None):
        """``turns_left(turns taken)``: the turns of growth a holding session is still projected at
        (``residency.Residency.turns_left``)."""
        self.settings = settings
        self.predictor = predictor
        self.turns_left = turns_left or (lambda turns: max(settings.host_tier_projection_turns - turns, 1.0))
        self.growth_tokens = float(settings.expected_growth_tokens)
        self.service_s: float | None = None  # None until observed
        self.cycle_s: float | None = None
        self.session_turns = float(settings.host_tier_projection_turns)  # turns a session takes
        self._ended = 0
        self._growths = 0  # turns whose growth was learned

    # ------------------------------------------------------------------ learning
    def learn_session_turns(self, turns: int) -> float | None:
        """A session ended after ``turns`` turns: the mean session length, if it is learned
        (``learn_session_turns``; the prior counts as one session), else None."""
        if not self.settings.learn_session_turns or turns <= 0:
            return None
        self._ended += 1
        rate = max(1.0 / (self._ended + 1), LEARNING_RATE)
        self.session_turns += rate * (turns - self.session_turns)
        return self.session_turns

    def learn_growth(self, growth: int) -> None:
        """A turn added ``growth`` tokens. The first turns to end are the short ones (a short reply
        decodes sooner, a short tool result prefills sooner), so the first dozens alone understate
        the growth; ``growth_prior_turns`` makes the prior weigh as that many turns against them."""
        if not self.settings.learn_growth:
            return
        self._growths += 1
        prior = self.settings.growth_prior_turns
        rate = LEARNING_RATE if prior <= 0 else max(1.0 / (prior + self._growths), GROWTH_FORGETTING)
        self.growth_tokens += rate * (growth - self.growth_tokens)

    def learn_service(self, seconds: float) -> None:
        self.service_s = _ewma(self.service_s, max(0.0, seconds))

    def learn_cycle(self, seconds: float) -> None:
        self.cycle_s = _ewma(self.cycle_s, seconds)

    # ------------------------------------------------------------------ projection
    def turns_ahead(self, hierarchy: bool) -> float:
        """Turns of growth a new session is projected at: with a host tier ``host_tier_projection_turns``
        or the learned session length (its KV stays until it ends); else ``projection_horizon_s`` / the learned turn cycle, or
        ``projection_turns`` (no horizon set, or no cycle observed yet)."""
        if hierarchy:
            return self.session_turns
        horizon = self.settings.projection_horizon_s
        if horizon > 0 and self.cycle_s:
            return horizon / self.cycle_s
        return self.settings.projection_turns

    def growth(self, hierarchy: bool) -> float:
        """Tokens a new session is expected to add before admission is reconsidered."""
        return self.growth_tokens * self.turns_ahead(hierarchy)

    def projected(self, load: Load, hierarchy: bool, growth: float, now: float, candidate: float | None = None,
                  share: Share | None = None, resuming: str | None = None) -> float:
        """Tokens the gate counts a worker's sessions at (``growth``: a session's projected growth;
        ``candidate``: the projection of a new session about to be placed, which the ``peak`` rule
        needs to know: then the result + ``candidate`` is what the worker would count with it;
        ``share``: the prefix the new session shares with open sessions; ``resuming``: a paced session
        whose next turn asks for room, counted running with its turns left).

        With a host tier every session holding KV counts: its context + growth_tokens x its turns
        left (none for a paced session: it grows only as the gate lets its turns through; the turns
        it took shrink what it still adds; with ``host_tier_projection = peak`` the
        most they hold at once, ``peak``), an idle one x its ``duty_cycle`` with
        ``host_tier_idle_weight = duty_cycle``. A prefix that holding sessions share (``Share``) is
        counted once, at the largest weight of those holding it: SGLang's radix tree and its host tier
        hold it once. Without one, the resident sessions: running ones their context + ``growth``;
        idle leased ones the same, or with ``idle_weight = duty_cycle`` that x their ``duty_cycle``.
        """
        if hierarchy:
            weigh = self.settings.host_tier_idle_weight == "duty_cycle" and self.service_s is not None
            if self.settings.host_tier_projection == "peak":
                sessions = [(r.context_tokens, self._turns_left(r, resuming), self._weight(r, now, weigh, resuming), r.share)
                            for r in load.holding_records.values()]
                if candidate is None:
                    return self.peak(sessions)
                turns = self.session_turns
                start = max(candidate - self.growth_tokens * turns, 0.0)
                return self.peak([*sessions, (start, turns, 1.0, share)]) - candidate
            total = load.holding_tokens + self.growth_tokens * load.holding_turns_left
            weights = {}
            for r in load.holding_records.values():
                w = weights[r.session_id] = self._weight(r, now, weigh, resuming)
                if r.session_id == resuming:  # the residency counts a paced one without the growth it resumes
                    total += self.growth_tokens * (self._turns_left(r, resuming) - growth_turns(r, self.turns_left))
                elif w < 1.0:
                    total -= (1.0 - w) * (r.context_tokens + self.growth_tokens * self._turns_left(r))
            total -= held_twice([(r.share, weights[r.session_id]) for r in load.holding_records.values()])
            if share is not None and any(r.share == share for r in load.holding_records.values()):
                total -= share.tokens  # the new session's prefix is held already
            return total
        running = load.running_tokens + growth * load.running
        if self.settings.idle_weight != "duty_cycle" or self.service_s is None:
            idle = load.resident - load.running
            return running + (load.resident_tokens - load.running_tokens) + growth * idle
        return running + sum(self.duty_cycle(r, now) * (r.context_tokens + growth) for r in load.idle_leased.values())

    def peak(self, sessions: Iterable[tuple[float, float, float, Share | None]]) -> float:
        """The most ``sessions`` (context, turns left, weight, shared prefix) hold at once over the
        turns ahead: each grows by ``growth_tokens`` a turn until its turns are done, then its KV is
        gone. The sum rises between two ends and drops at each, so its peak is just before one of
        them. A shared prefix counts once while any session holding it is there, at the largest
        weight among them (the one that runs most needs it on the GPU that often)."""
        best = weight = tokens = 0.0
        held: dict[int, float] = {}  # prefix -> the weight it is counted at so far
        for context, turns, w, share in sorted(sessions, key=lambda s: -s[1]):
            weight += w
            if share is None:
                tokens += w * context
            else:
                tokens += w * max(context - share.tokens, 0)
                top = held.get(share.key, 0.0)
                if w > top:
                    tokens += (w - top) * share.tokens
                    held[share.key] = w
            best = max(best, tokens + self.growth_tokens * turns * weight)
        return best

    def overflow_tokens(self, load: Load, now: float, share: float, recompute_cost: Callable[[float], float]) -> float:
        """Tokens past the budget the worker may take when the KV they push out, taken from the
        sessions between turns that cost least to lose (their recompute / the time to their
        predicted return + a service time: the plugin gives up the latest returns first),
        recomputed as they return, costs at most ``share`` of the engine's time.

        Until a turn's service time is measured (a run's first agents start together, none between
        turns yet) the loss is priced as the projection's peak has it, from the priors: every
        holding session at its projected size, out for the predicted gap of its coming reply, with
        no service time (which only overprices the loss). Allowing nothing then held the last of 24
        reference agents at ratio 3 for 1.4 s, for an overshoot of 0.8 % of the host tier."""
        if share <= 0:
            return 0.0
        losses = []  # (engine seconds per second per token, tokens)
        for r in load.holding_records.values():
            if self.service_s is None:  # the priors: the projected peak, nothing measured yet
                tokens = r.context_tokens + self.growth_tokens * self._turns_left(r)
                until = self.predictor.next_reply_distribution(r.gap_stats, int(tokens)).median()
            elif r.running or r.turn_ended_at is None:
                continue
            else:
                tokens = r.context_tokens
                dist = self.predictor.distribution(r.turn_tools, r.gap_stats)
                until = dist.median(max(0.0, now - r.turn_ended_at)) + self.service_s
            if tokens <= 0 or until <= 0:  # nothing to lose, or back at once: not given up
                continue
            rate = 0.0 if until == float("inf") else recompute_cost(tokens) / until
            losses.append((rate / tokens, tokens))
        tokens = spent = 0.0
        for per_token, n in sorted(losses):
            if spent + per_token * n > share:
                return tokens + ((share - spent) / per_token if per_token > 0 else n)
            spent += per_token * n
            tokens += n
        return tokens

    def _turns_left(self, record: SessionRecord, resuming: str | None = None) -> float:
        """The turns of growth still projected for a holding session (``growth_turns``); the paced
        one ``resuming`` is counted as if it ran on, with all its turns left."""
        if record.session_id == resuming:
            return self.turns_left(record.turns)
        return growth_turns(record, self.turns_left)

    def _weight(self, record: SessionRecord, now: float, weigh: bool, resuming: str | None) -> float:
        """A holding session's weight in the projection: 1 for the one ``resuming`` (about to run),
        else ``_idle_weight``."""
        return 1.0 if record.session_id == resuming else self._idle_weight(record, now, weigh)

    def _idle_weight(self, record: SessionRecord, now: float, weigh: bool) -> float:
        """1, or a session's duty cycle while it is between turns (``weigh``)."""
        return self.duty_cycle(record, now) if weigh and record.running == 0 else 1.0

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


def held_twice(sessions: Iterable[tuple[Share | None, float]]) -> float:
    """Tokens a plain sum of the sessions (shared prefix, weight) counts more than once: each shared
    prefix counted at every weight but the largest."""
    total: dict[int, tuple[int, float, float]] = {}  # prefix -> (its tokens, sum of weights, largest)
    for share, w in sessions:
        if share is not None:
            _, summed, top = total.get(share.key, (share.tokens, 0.0, 0.0))
            total[share.key] = (share.tokens, summed + w, max(top, w))
    return sum(tokens * (summed - top) for tokens, summed, top in total.values())


def _ewma(mean: float | None, value: float) -> float:
    return value if mean is None else mean + LEARNING_RATE * (value - mean)
