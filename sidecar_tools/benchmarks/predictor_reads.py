"""Per-call microseconds of the predictor reads the lease policy makes each turn (prints; not a test).

A predictor learns ``--tools`` tool names (and final answers, at three context sizes), then each
read is timed over ``--calls`` calls with nothing learned in between (the histograms change only
when an observation settles), and a whole turn with its one gap learned first: the reads of
``LeasePolicy.lease_request``, ``on_turn_end`` and ``after_turn`` and four of the projection's
``duty_cycle`` (one per idle session it weighs).

    python -m sidecar_tools.benchmarks.predictor_reads [--tools 20] [--calls 10000]
"""

from __future__ import annotations

import argparse
import random
import time

from sidecar.policy.final_answers import with_chance_of_return
from sidecar.policy.lease_policy import expected_return
from sidecar.policy.predictor import ReturnTimePredictor, SessionGapStats
from sidecar.policy.settings import PolicySettings
from sidecar.policy.ttl import LeaseTtlRule


def learned(tools: int, seed: int = 0) -> tuple[ReturnTimePredictor, list[str], list[SessionGapStats]]:
    settings = PolicySettings(mode="predictive")
    predictor = ReturnTimePredictor(settings)
    rng = random.Random(seed)
    names = [f"tool{i}" for i in range(tools)]
    sessions = [SessionGapStats() for _ in range(8)]
    for i in range(40 * tools):
        name = rng.choice(names + [None])
        gap = rng.lognormvariate(0.0, 1.5)
        predictor.observe([name] if name else [], gap, sessions[i % 8], context_tokens=rng.choice([3000, 20000, 90000]))
    predictor.settle()
    return predictor, names, sessions


def timed(call, calls: int) -> float:
    """Microseconds per ``call(i)``, the best of three passes (the machine is shared)."""
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for i in range(calls):
            call(i)
        best = min(best, time.perf_counter() - start)
    return best / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tools", type=int, default=20, help="tool names learned")
    parser.add_argument("--calls", type=int, default=10_000, help="calls timed per read")
    args = parser.parse_args()
    predictor, names, sessions = learned(args.tools)
    rule = LeaseTtlRule(predictor.settings)
    n_names, n_sess = len(names), len(sessions)
    dist = predictor.distribution([names[0]], sessions[0])

    def learn(i: int) -> None:
        predictor.observe([names[i % n_names]], 0.5 + (i % 7), sessions[i % n_sess], context_tokens=20000)
        predictor.settle()

    def turn(i: int) -> None:
        learn(i)  # the gap before this turn
        session, tools = sessions[i % n_sess], [names[i % n_names]]
        ahead = predictor.next_reply_distribution(session, 20000)  # lease_request
        rule.predictive_ttl(ahead, 20000, 0.0, 0.3)
        expected_return(ahead)
        predictor.distribution(tools, session).median()  # on_turn_end
        back = predictor.distribution(tools, session)  # after_turn
        rule.predictive_ttl(back, 20000, 0.01, 0.3)
        expected_return(back, 0.01)
        for k in range(4):  # duty_cycle of idle sessions
            predictor.distribution([names[(i + k) % n_names]], sessions[(i + k) % n_sess]).median(0.5)

    reads = {
        "distribution(tool, session)": lambda i: predictor.distribution([names[i % n_names]], sessions[i % n_sess]),
        "distribution(tool, session).median(elapsed)  [duty_cycle]": lambda i: predictor.distribution(
            [names[i % n_names]], sessions[i % n_sess]).median(0.1 * (i % 5)),
        "next_reply_distribution(session, ctx)": lambda i: predictor.next_reply_distribution(
            sessions[i % n_sess], (3000, 20000, 90000)[i % 3]),
        "ttl_rule.predictive_ttl(dist)": lambda i: rule.predictive_ttl(dist, 20000, 0.0, 0.3),
        "expected_return(dist, elapsed)": lambda i: expected_return(dist, 0.1 * (i % 5)),
        "with_chance_of_return(dist, p)": lambda i: with_chance_of_return(dist, 0.7),
        "observe + settle (one gap learned)": learn,
        "one turn: its gap learned, then its reads (the 11 above)": turn,
    }
    print(f"| call ({args.tools} tools learned, best of 3 x {args.calls} calls) | us per call |")
    print("|---|---|")
    for label, call in reads.items():
        for i in range(200):  # warm up
            call(i)
        print(f"| {label} | {timed(call, args.calls):.2f} |")


if __name__ == "__main__":
    main()
