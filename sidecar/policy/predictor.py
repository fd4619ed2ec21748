"""When does a session come back? Learned online from the tool gaps the sidecar observes.

Model (hierarchical, in log time):
* global:  a decayed histogram of every gap, shrunk toward a log-normal prior
           (``prior_weight`` pseudo-observations of LogNormal(prior_median_s, prior_sigma));
* tool:    one decayed histogram per tool name (the reply's tool_calls; no tool = "(none)"),
           shrunk toward the global distribution with ``tool_shrinkage`` pseudo-observations;
* session: a speed factor, exp(mean log(actual / tool median)) over the session's gaps, shrunk
           toward 1 with ``session_shrinkage`` pseudo-observations; it stretches the tool's
           distribution in time. Tool histograms learn the de-stretched gaps. Gaps after final
           answers (no tool: a person reads) have a factor of their own.
A reply that asks for several tools is predicted by its slowest tool (largest median). Before the
reply is known (the lease is sent with the request), the prediction is the mixture of tool
distributions weighted by how often replies at this context size (one class per doubling) asked
for each, shrunk toward the overall mix - a session's last reply, with its largest context, is
the one that never comes back.

Forgetting: each observation multiplies a histogram's old weight by 0.5 ** (1 / half_life_obs),
so a tool whose gaps change is re-learned within a few half-lives. A session that is closed
without coming back counts as "never back" (the overflow bin) until it does come back, when that
observation is taken back and the true gap learned instead.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from sidecar.policy.distribution import GapDistribution, LogTimeGrid
from sidecar.policy.settings import PolicySettings

NO_TOOL = "(none)"
MAX_TOOL_NAME_CHARS = 64
MAX_SESSION_SCALE = 20.0
_VERSIONS = itertools.count(1)  # one number per histogram state, unique across histograms


def context_bucket(context_tokens: int) -> int:
    """Context size class: 0 below 4K tokens, then one per doubling."""
    return max(0, int(context_tokens).bit_length() - 12)


def tool_keys(tool_names: Iterable[str]) -> tuple[str, ...]:
    """Sorted distinct tool names of one reply, truncated; a reply without tools is ("(none)",)."""
    keys = {(name or "").strip()[:MAX_TOOL_NAME_CHARS] or "(unnamed)" for name in tool_names}
    return tuple(sorted(keys)) or (NO_TOOL,)


class DecayedHistogram:
    """Bin weights where each new observation first scales the old ones by ``decay``.

    ``version`` changes with every change of ``counts`` and is never reused (not even by another
    histogram): what was computed from a histogram stays valid while its version is the same."""

    __slots__ = ("counts", "decay", "updates", "version")

    def __init__(self, size: int, decay: float):
        self.counts = np.zeros(size)
        self.decay = decay
        self.updates = 0
        self.version = next(_VERSIONS)

    def add(self, mass: np.ndarray) -> None:
        self.counts *= self.decay
        self.counts += mass
        self.updates += 1
        self.version = next(_VERSIONS)

    def remove(self, mass: np.ndarray, added_at_update: int) -> None:
        """Take back ``mass`` added when ``updates`` was ``added_at_update`` (decayed since)."""
        self.counts -= mass * self.decay ** (self.updates - added_at_update)
        np.maximum(self.counts, 0.0, out=self.counts)
        self.version = next(_VERSIONS)

    @property
    def total(self) -> float:
        return float(self.counts.sum())


@dataclass
class CensoredMark:
    """What one censored observation added, so it can be taken back if the session returns."""

    added: list[tuple[DecayedHistogram, np.ndarray, int]]


@dataclass
class SessionGapStats:
    """What the predictor knows about one session (kept in the session table).

    Returns after a final answer (a reply without tool calls) are paced by a person reading it,
    returns after tool calls by the tools: each kind has its own speed factor, so a slow reader
    does not stretch the session's tool gaps, nor quick tools its reading times."""

    log_shift_sum: float = 0.0  # decayed sum of log(actual gap / tool median), after tool calls
    shift_weight: float = 0.0  # decayed number of those
    final_log_shift_sum: float = 0.0  # the same after final answers
    final_shift_weight: float = 0.0
    returns_after_final: int = 0  # times this session came back after a final answer

    def shift(self, final_answer: bool) -> tuple[float, float]:
        """(decayed log-shift sum, weight) of the kind of reply."""
        if final_answer:
            return self.final_log_shift_sum, self.final_shift_weight
        return self.log_shift_sum, self.shift_weight

    def learn_shift(self, final_answer: bool, residual: float, decay: float) -> None:
        if final_answer:
            self.final_log_shift_sum = self.final_log_shift_sum * decay + residual
            self.final_shift_weight = self.final_shift_weight * decay + 1.0
            self.returns_after_final += 1
        else:
            self.log_shift_sum = self.log_shift_sum * decay + residual
            self.shift_weight = self.shift_weight * decay + 1.0


class ReturnTimePredictor:
    def __init__(self, settings: PolicySettings, grid: LogTimeGrid | None = None):
        self.settings = settings
        self.grid = grid or LogTimeGrid(min_s=0.01, horizon_s=settings.horizon_s)
        self.decay = 0.5 ** (1.0 / settings.half_life_obs)
        self._prior = self.grid.lognormal_pmf(settings.prior_median_s, settings.prior_sigma)
        self._final_answer_prior = self.grid.lognormal_pmf(settings.final_answer_prior_median_s, settings.prior_sigma)
        self._never = np.zeros(self.grid.size)  # one observation "not back within the horizon"
        self._never[self.grid.overflow] = 1.0
        self._never.flags.writeable = False
        self._global = DecayedHistogram(self.grid.size, self.decay)
        self._tools: OrderedDict[str, DecayedHistogram] = OrderedDict()
        self._global_mix: dict[str, float] = {}
        self._mix_by_context: dict[int, dict[str, float]] = {}
        self._mix_version = 0  # bumped with every change of the two mix tables
        # Reads are cached (histograms change only when an observation settles, reads come several
        # per turn and per idle session): per tool, (its version, the global one or None, shrunk
        # pmf, distribution at scale 1); per context bucket, ((global version, mix version),
        # mixture). A session's speed factor is applied on top (GapDistribution.scaled).
        self._shapes: dict[str, list] = {}
        self._global_shape: list | None = None
        self._final_answer_shape = (self._final_answer_prior, GapDistribution(self.grid, self._final_answer_prior))
        self._mixtures: dict[int | None, tuple[tuple[int, int], GapDistribution]] = {}
        self._prior.flags.writeable = False
        self._final_answer_prior.flags.writeable = False
        self.observations = 0
        # observe() only queues; the histogram arithmetic runs, in order, before the predictor is
        # next read (every public method settles first), so results are the same as learning at
        # once, and a request's gap is learned after it went to the engine, not on its way there
        self._pending: deque[tuple] = deque()

    # ------------------------------------------------------------------ prediction
    def distribution(self, tool_names: Iterable[str], session: SessionGapStats | None = None) -> GapDistribution:
        """Gap after a reply that asked for ``tool_names`` ([] = no tool)."""
        self.settle()
        key = self._dominant_key(tool_keys(tool_names))
        return self._key_shape(key)[1].scaled(self._scale(session, key == NO_TOOL))

    def next_reply_distribution(
        self, session: SessionGapStats | None = None, context_tokens: int | None = None
    ) -> GapDistribution:
        """Gap after the coming reply, whose tool calls are not known yet."""
        self.settle()
        bucket = context_bucket(context_tokens) if context_tokens else None
        # every change of a tool histogram comes with one of the global histogram (_learn, retract)
        signature = (self._global.version, self._mix_version)
        cached = self._mixtures.get(bucket)
        if cached is None or cached[0] != signature:
            cached = self._mixtures[bucket] = (signature, self._mixture(context_tokens))
        return cached[1].scaled(self._scale(session))

    def _mixture(self, context_tokens: int | None) -> GapDistribution:
        weights = {k: w for k, w in self._population_mix(context_tokens).items() if w > 0 and k in self._tools}
        total = sum(weights.values())
        if total <= 0:
            return self._global_pmf_and_shape()[1]
        pmf = sum(w / total * self._key_entry(k, self._tools[k])[2] for k, w in weights.items())
        return GapDistribution(self.grid, pmf)

    def _population_mix(self, context_tokens: int | None) -> dict[str, float]:
        """P(next reply's dominant tool = k) across sessions, given the context size if known."""
        total = sum(self._global_mix.values())
        if total <= 0:
            return {}
        overall = {k: c / total for k, c in self._global_mix.items()}
        bucket = self._mix_by_context.get(context_bucket(context_tokens)) if context_tokens else None
        if not bucket:
            return overall
        m = self.settings.tool_shrinkage
        bucket_total = sum(bucket.values())
        return {k: (bucket.get(k, 0.0) + m * p) / (bucket_total + m) for k, p in overall.items()}

    def session_scale(self, session: SessionGapStats | None) -> float:
        """How much slower (>1) or faster (<1) than usual this session comes back."""
        self.settle()
        return self._scale(session)

    def _scale(self, session: SessionGapStats | None, final_answer: bool = False) -> float:
        if session is None:
            return 1.0
        log_sum, weight = session.shift(final_answer)
        if weight <= 0:
            return 1.0
        shift = log_sum / (weight + self.settings.session_shrinkage)
        return float(min(max(math.exp(shift), 1 / MAX_SESSION_SCALE), MAX_SESSION_SCALE))

    def known_tools(self) -> list[str]:
        self.settle()
        return list(self._tools)

    # ------------------------------------------------------------------ learning
    def observe(
        self,
        tool_names: Iterable[str],
        gap_s: float,
        session: SessionGapStats | None = None,
        context_tokens: int | None = None,
        count_mix: bool = True,
    ) -> None:
        """The session came back ``gap_s`` seconds after a reply that asked for ``tool_names``.

        ``count_mix=False``: the reply was already counted in the tool mix (by a censored
        observation now retracted). Queued: learned when the predictor is next read.
        """
        self._pending.append((tool_keys(tool_names), gap_s, session, context_tokens, count_mix))
        if len(self._pending) >= 4096:  # bound the queue of a predictor nobody reads
            self.settle()

    def settle(self) -> None:
        """Learn the queued observations, oldest first."""
        while self._pending:
            self._observe_now(*self._pending.popleft())

    def _observe_now(self, keys, gap_s, session, context_tokens, count_mix) -> None:
        dominant = self._dominant_key(keys)
        final_answer = dominant == NO_TOOL
        scale = self._scale(session, final_answer)
        base_gap = max(gap_s, 0.0) / scale
        if session is not None:
            median = self._key_shape(dominant)[1].median()
            if math.isfinite(median) and median > 0:
                clamped = min(max(gap_s, self.grid.min_s), self.grid.horizon_s)
                session.learn_shift(final_answer, math.log(clamped / median), self.decay)
        onehot = np.zeros(self.grid.size)
        onehot[self.grid.bin_of(base_gap)] = 1.0
        self._learn(keys, dominant, onehot, context_tokens, count_mix)

    def observe_censored(self, tool_names: Iterable[str], context_tokens: int | None = None) -> CensoredMark:
        """A session was closed without coming back after a reply that asked for ``tool_names``.

        Learned as "not back within the horizon" (overflow bin). If the session comes back after
        all, ``retract`` the returned mark and ``observe`` the true gap (the session table keeps
        closed sessions' gaps for that), so only sessions that never return stay counted as such.
        """
        self.settle()
        keys = tool_keys(tool_names)
        dominant = self._dominant_key(keys)
        return CensoredMark(self._learn(keys, dominant, self._never, context_tokens, True))

    def retract(self, mark: CensoredMark) -> None:
        """Undo a censored observation (the session came back after all; observe its gap next)."""
        self.settle()
        live = {id(h) for h in self._tools.values()} | {id(self._global)}
        for hist, mass, at in mark.added:
            if id(hist) in live:
                hist.remove(mass, at)

    # ------------------------------------------------------------------ internals
    def _learn(self, keys, dominant, mass: np.ndarray, context_tokens, count_mix):
        """Add one observation to each tool's and the global histogram; returns what was added."""
        added = []
        for key in keys:
            hist = self._tools.get(key) or self._new_tool(key)
            self._tools.move_to_end(key)
            hist.add(mass)
            added.append((hist, mass, hist.updates))
        self._global.add(mass)
        added.append((self._global, mass, self._global.updates))
        self.observations += 1
        if count_mix:
            self._count_mix(dominant, context_tokens)
        return added

    def _count_mix(self, dominant: str, context_tokens: int | None) -> None:
        self._mix_version += 1
        for k in self._global_mix:
            self._global_mix[k] *= self.decay
        self._global_mix[dominant] = self._global_mix.get(dominant, 0.0) + 1.0
        if context_tokens:
            bucket = self._mix_by_context.setdefault(context_bucket(context_tokens), {})
            for k in bucket:
                bucket[k] *= self.decay
            bucket[dominant] = bucket.get(dominant, 0.0) + 1.0

    def _new_tool(self, key: str) -> DecayedHistogram:
        hist = DecayedHistogram(self.grid.size, self.decay)
        self._tools[key] = hist
        while len(self._tools) > self.settings.max_tools:
            dropped, _ = self._tools.popitem(last=False)
            self._shapes.pop(dropped, None)
            self._mix_version += 1
            self._global_mix.pop(dropped, None)
            for bucket in self._mix_by_context.values():
                bucket.pop(dropped, None)
        return hist

    def _global_pmf_and_shape(self) -> tuple[np.ndarray, GapDistribution]:
        """The global histogram shrunk toward the prior, and its distribution (cached)."""
        entry = self._global_entry()
        if entry[2] is None:
            entry[2] = GapDistribution(self.grid, entry[1])
        return entry[1], entry[2]

    def _global_entry(self) -> list:
        """[global version, shrunk pmf, distribution or None (built on the first read)]."""
        entry = self._global_shape
        if entry is None or entry[0] != self._global.version:
            k0 = self.settings.prior_weight
            total = self._global.total
            if total + k0 <= 0:
                pmf = self._prior
            else:
                pmf = (self._global.counts + k0 * self._prior) / (total + k0)
                pmf.flags.writeable = False
            entry = self._global_shape = [self._global.version, pmf, None]
        return entry

    def _key_shape(self, key: str) -> tuple[np.ndarray, GapDistribution]:
        """A tool's histogram shrunk toward the global pmf (final answers: toward their own prior),
        and its distribution at scale 1; cached until either histogram changes."""
        hist = self._tools.get(key)
        if hist is None:
            return self._final_answer_shape if key == NO_TOOL else self._global_pmf_and_shape()
        entry = self._key_entry(key, hist)
        if entry[3] is None:  # built on the first read: a mixture needs the pmfs only
            entry[3] = GapDistribution(self.grid, entry[2])
        return entry[2], entry[3]

    def _key_entry(self, key: str, hist: DecayedHistogram) -> list:
        """[tool version, global version (None: final answers), shrunk pmf, distribution or None]."""
        base = None if key == NO_TOOL else self._global.version
        entry = self._shapes.get(key)
        if entry is not None and entry[0] == hist.version and entry[1] == base:
            return entry
        k1 = self.settings.tool_shrinkage
        total = hist.total
        if total + k1 <= 0:  # nothing of its own: the prior's
            pmf, shape = self._final_answer_shape if key == NO_TOOL else self._global_pmf_and_shape()
        else:
            # a person reads a final answer: human-paced, not like the tools
            prior = self._final_answer_prior if key == NO_TOOL else self._global_entry()[1]
            pmf, shape = (hist.counts + k1 * prior) / (total + k1), None
            pmf.flags.writeable = False
        entry = self._shapes[key] = [hist.version, base, pmf, shape]
        return entry

    def _dominant_key(self, keys: tuple[str, ...]) -> str:
        if len(keys) == 1:
            return keys[0]
        medians = {k: self._key_shape(k)[1].median() for k in keys}
        return max(keys, key=lambda k: (medians[k], k))
