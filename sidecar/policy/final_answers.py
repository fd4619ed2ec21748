"""Does a session come back after a final answer (a reply without tool calls)?

After tool calls an agent returns as soon as its tools are done; after a final answer it returns
only if a person reads the answer and writes again (human-paced: seconds to minutes), and most
sessions simply end there. A lease that covers the usual human wait is then wasted on every
session's last turn. So the policy asks how likely a return is:

    p = (own returns + m * p_population) / (own returns + m)

where own returns are this session's returns after its earlier final answers (a session that came
back after one is human-paced: its agent waits for a person), m = ``session_shrinkage``, and
p_population = (returns + 1) / (returns + ends + 2) over all sessions' final answers (decayed
like the predictor's histograms; an end is a session closed after a final answer without coming
back, taken back if it does come back). Below ``ENDS_BELOW`` the reply gets the short
end-of-session lease; otherwise the gap distribution after final answers is mixed with "never
back" in proportion 1 - p and the TTL rule decides on that.
"""

from __future__ import annotations

from sidecar.policy.distribution import GapDistribution

ENDS_BELOW = 0.5  # a final answer after which a return is less likely than this ends the session


class FinalAnswerStats:
    """Returns and ends after final answers, over all sessions."""

    def __init__(self, decay: float):
        self.decay = decay
        self.returns = 0.0
        self.ends = 0.0

    def returned(self, retracted_end: bool = False) -> None:
        """A session came back after a final answer (``retracted_end``: it had been counted as ended)."""
        if retracted_end:
            self.ends = max(0.0, self.ends - 1.0)
        self._decay()
        self.returns += 1.0

    def ended(self) -> None:
        """A session was closed after a final answer without coming back."""
        self._decay()
        self.ends += 1.0

    def _decay(self) -> None:
        self.returns *= self.decay
        self.ends *= self.decay

    def p_population(self) -> float:
        return (self.returns + 1.0) / (self.returns + self.ends + 2.0)

    def p_return(self, own_returns: int, shrinkage: float) -> float:
        """P(this session comes back after its final answer)."""
        return (own_returns + shrinkage * self.p_population()) / (own_returns + shrinkage)


def with_chance_of_return(dist: GapDistribution, p: float) -> GapDistribution:
    """``dist`` given that the session comes back at all with probability ``p`` only."""
    pmf = p * dist.pmf  # the finite bins as p * pmf + (1 - p) * 0 were: the same bits
    pmf[dist.grid.overflow] += 1.0 - p
    return GapDistribution(dist.grid, pmf, dist.scale)
