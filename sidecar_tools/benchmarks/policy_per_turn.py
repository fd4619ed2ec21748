"""The policy's CPU per turn at few and at many open sessions (prints; not a timed test).

Each turn is the turn core's sequence of policy calls for a continuing session (admission, then
``sidecar.turn.policy_calls``' turn_started and turn_finished, the calls the turn core makes, then
release_admission; the worker is taken to run the plugin), with one new session
admitted and one closed every 50 turns and the store's close pass every 200 turns (once a second at
~200 turns/s), on ``configs/coding-agent.toml``'s policy over a GPU + host pool. The figure that
matters is the ratio: per-turn work must not grow with the number of open sessions.

    python -m sidecar_tools.benchmarks.policy_per_turn [--sessions 50,2000] [--turns 4000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from sidecar.conversation.store import SessionStore
from sidecar.policy import EngineCapacity, build_policy
from sidecar.settings import load_settings
from sidecar.turn.policy_calls import turn_finished, turn_started

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "coding-agent.toml"


def per_turn_us(open_sessions: int, turns: int, repeat: int = 3) -> float:
    """Median over ``repeat`` passes of the policy's CPU microseconds per turn."""
    settings = load_settings(str(CONFIG), {"policy": {"mode": "predictive"}})
    clock = [1000.0]
    policy = build_policy(settings, EngineCapacity(max_total_num_tokens=10_000_000, host_tokens=300_000_000),
                          clock=lambda: clock[0])
    store = SessionStore(policy, max_sessions=open_sessions + 100)
    ids = [f"s{i}" for i in range(open_sessions)]

    def turn(sid: str, new: bool) -> None:
        record = store.record(sid)
        prompt = record.context_tokens + 900 if record is not None else 3000
        now = clock[0]
        policy.offer_admission(sid, prompt, new)
        sent = turn_started(policy, sid, prompt, now)
        clock[0] += 0.005
        turn_finished(policy, sid, prompt + 200, ["bash"], sent, clock[0], revise=lambda lease: None)
        policy.release_admission(sid)

    for sid in ids:  # every session opened, one turn taken: idle in its tool gap
        store.open(sid)
        turn(sid, True)
    passes = []
    fresh = 0
    for _ in range(repeat + 1):  # the first pass warms up
        start = time.process_time()
        for i in range(turns):
            if i % 50 == 0:  # one session ends, another starts
                store.forget(store.get(ids[fresh % len(ids)]), "client")
                ids[fresh % len(ids)] = sid = f"new{fresh}"
                fresh += 1
                store.open(sid)
                turn(sid, True)
            if i % 200 == 0:
                store.close_due(clock[0])
            turn(ids[i % len(ids)], False)
        passes.append((time.process_time() - start) / turns)
    return statistics.median(passes[1:]) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", default="50,2000", help="open-session counts, comma-separated")
    parser.add_argument("--turns", type=int, default=4000, help="turns timed per pass")
    args = parser.parse_args()
    counts = [int(n) for n in args.sessions.split(",")]
    figures = {n: per_turn_us(n, args.turns) for n in counts}
    base = figures[counts[0]]
    print("| open sessions | policy CPU per turn (us) | ratio to the first |")
    print("|---|---|---|")
    for n, us in figures.items():
        print(f"| {n} | {us:.1f} | {us / base:.2f} |")


if __name__ == "__main__":
    main()
