"""Where the sidecar's CPU goes, from a py-spy speedscope profile of the load test.

    python -m sidecar_tools.benchmarks.profile_shares benchmarks/results/load/profile-sidecar-300.speedscope.json

Each busy sample (idle samples, waiting in the selector, are dropped) is put in the first group
whose frames it contains, in the order below (so the tokenizer called from a render counts as
tokenizer, not as render); prints a markdown table of the shares. Functions renamed since the
committed profile was recorded are matched under both names (SessionRegistry.resolve is now
SessionStore.resolve, remember_turn is Turn._record). Record the profile with
``python -m sidecar_tools.benchmarks.load_benchmark ... --mode sidecar --sidecar-arg=--event-loop=asyncio --profile F``
(asyncio, so the event loop's own frames are visible).
"""

from __future__ import annotations

import collections
import json
import sys
from collections.abc import Callable

Stack = list[tuple[str, str]]  # (function, file name) from the outermost frame in


def _any(stack: Stack, names: set[str] = frozenset(), files: set[str] = frozenset()) -> bool:
    return any(name in names or file in files for name, file in stack)


GROUPS: list[tuple[str, Callable[[Stack], bool]]] = [
    ("tokenizer encode (new messages)", lambda s: _any(s, {"TokenCodec.encode"})),
    ("chat template render (Jinja)", lambda s: _any(s, {"ChatRenderer._render", "ChatRenderer._head"})),
    ("body read, parse + validation", lambda s: _any(s, {"parse_chat_request", "BaseModel.model_validate"}, files={"body.py"})),
    ("session lookup + fingerprints",
     lambda s: _any(s, {"SessionStore.resolve", "SessionRegistry.resolve", "SessionStore.known_turn", "SessionStore.continue_turn",
                        "fingerprints", "chain_fingerprint", "extend_fingerprint", "Message.to_template"})),
    ("policy (gap learning, lease, admission, session lifecycle)",
     lambda s: _any(s, files={"lease_policy.py", "predictor.py", "admission.py", "lifecycle.py", "distribution.py"})),
    ("remember the turn", lambda s: _any(s, {"Turn._record", "remember_turn"})),
    ("engine request (aiohttp client send)", lambda s: _any(s, {"EngineClient._open"})),
    ("relay: SSE frames + writes to the agent", lambda s: _any(s, {"stream_reply.<locals>.send"})),
    ("relay: read + parse SGLang chunks, detokenize, tool calls", lambda s: _any(s, {"Generation.events", "Generation.batches", "EngineClient.generate_stream", "EngineClient.generate_batches"})),
    ("rest of the handler", lambda s: _any(s, {"chat_completions", "stream_reply"})),
    ("event loop, sockets, aiohttp outside the handler", lambda s: True),
]


def shares(profile_path: str) -> dict[str, float]:
    data = json.load(open(profile_path))
    frames = data["shared"]["frames"]
    names = [f["name"] for f in frames]
    files = [f["file"].rsplit("/", 1)[-1] for f in frames]
    prof = data["profiles"][0]
    weights = prof.get("weights") or [1] * len(prof["samples"])
    count: collections.Counter[str] = collections.Counter()
    total = 0.0
    for sample, weight in zip(prof["samples"], weights):
        if not sample or "select" in names[sample[-1]]:
            continue
        stack = [(names[i], files[i]) for i in sample]
        total += weight
        count[next(label for label, match in GROUPS if match(stack))] += weight
    return {label: count[label] / total for label, _ in GROUPS} if total else {}


def top_self(profile_path: str, n: int = 25) -> list[tuple[str, str, float]]:
    """The ``n`` functions with the most self time: (function, file, share of the busy samples)."""
    data = json.load(open(profile_path))
    frames = data["shared"]["frames"]
    prof = data["profiles"][0]
    weights = prof.get("weights") or [1] * len(prof["samples"])
    count: collections.Counter[int] = collections.Counter()
    total = 0.0
    for sample, weight in zip(prof["samples"], weights):
        if not sample or "select" in frames[sample[-1]]["name"]:
            continue
        total += weight
        count[sample[-1]] += weight
    if not total:
        return []
    return [(frames[i]["name"], frames[i]["file"].rsplit("/", 1)[-1], w / total) for i, w in count.most_common(n)]


def main(argv: list[str]) -> None:
    top = 0
    if len(argv) == 3 and argv[1] == "--top":
        top = int(argv[2])
        argv = argv[:1]
    if len(argv) != 1:
        raise SystemExit(__doc__)
    print("| | share of the sidecar's busy CPU |\n|---|---|")
    for label, share in shares(argv[0]).items():
        print(f"| {label} | {share * 100:.0f} % |")
    if top:
        print("\n| function (self time) | file | share of the busy CPU |\n|---|---|---|")
        for name, file, share in top_self(argv[0], top):
            print(f"| `{name}` | {file} | {share * 100:.1f} % |")


if __name__ == "__main__":
    main(sys.argv[1:])
