"""Does moving a session to another worker cost a recompute when the workers share HiCache's L3?

Two SGLang workers started with the same ``--hicache-storage-backend file`` path (one machine
here: the path is shared by construction; on two hosts, a shared mount). Each session's history
(``--history-tokens`` of token ids) is first served by worker A, which writes its KV through to
storage; after ``--settle-s`` the same history plus the next turn's new tokens goes to worker B,
which never saw it. B's time to first token and its ``cached_tokens`` (and their device / host /
storage split) say whether it read the history back or recomputed it. The baseline is the same
turn on B for a history nobody stored (a recompute), in the same run. Turns go one at a time
(``sequential``) and, for another set of sessions, all at once (``burst``: what a worker's loss
sends to the survivors).

    python -m sidecar_tools.benchmarks.l3_rehome --worker-a http://127.0.0.1:30000 \\
        --worker-b http://127.0.0.1:30001 --out results/l3-rehome.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from typing import Any

import aiohttp


async def _turn(http: aiohttp.ClientSession, url: str, ids: list[int], max_new: int) -> dict[str, Any]:
    """One streamed /generate: time to the first chunk, and the final meta_info."""
    body = {"input_ids": ids, "stream": True, "return_cached_tokens_details": True,
            "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}}
    start = time.perf_counter()
    first, meta, output = None, {}, []
    async with http.post(f"{url}/generate", json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"{url}/generate answered {r.status}: {(await r.text())[:300]}")
        async for line in r.content:
            if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                continue
            if first is None:
                first = time.perf_counter() - start
            chunk = json.loads(line[5:])
            meta, output = chunk.get("meta_info", meta), chunk.get("output_ids", output)
    details = meta.get("cached_tokens_details") or {}
    return {"ttft_s": first, "e2e_s": time.perf_counter() - start, "prompt_tokens": meta.get("prompt_tokens"),
            "cached_tokens": meta.get("cached_tokens"), "details": details, "output_ids": output}


def _history(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 100_000) for _ in range(n)]


async def _phase(http, url: str, prompts: list[list[int]], max_new: int, burst: bool) -> list[dict[str, Any]]:
    if burst:
        return list(await asyncio.gather(*(_turn(http, url, p, max_new) for p in prompts)))
    return [await _turn(http, url, p, max_new) for p in prompts]


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ttft = [r["ttft_s"] for r in rows]
    storage = [int(r["details"].get("storage") or 0) for r in rows]
    cached = [int(r["cached_tokens"] or 0) for r in rows]
    return {"n": len(rows), "ttft_median_s": statistics.median(ttft), "ttft_max_s": max(ttft),
            "cached_tokens_mean": statistics.fmean(cached), "storage_tokens_mean": statistics.fmean(storage),
            "prompt_tokens_mean": statistics.fmean(r["prompt_tokens"] or 0 for r in rows)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    timeout = aiohttp.ClientTimeout(total=600)
    out: dict[str, Any] = {"args": vars(args), "phases": {}}
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for mode in ("sequential", "burst"):
            burst = mode == "burst"
            histories = [_history(rng, args.history_tokens) for _ in range(args.sessions)]
            served = await _phase(http, args.worker_a, histories, args.output_tokens, burst)  # A computes and stores
            await asyncio.sleep(args.settle_s)  # write-through to storage is asynchronous
            nexts = [h + s["output_ids"] + _history(rng, args.new_tokens) for h, s in zip(histories, served)]
            moved = await _phase(http, args.worker_b, nexts, args.output_tokens, burst)  # B never saw them
            fresh = [_history(rng, len(n)) for n in nexts]  # the same length, stored nowhere: a recompute
            cold = await _phase(http, args.worker_b, fresh, args.output_tokens, burst)
            for rows in (served, moved, cold):
                for r in rows:
                    r.pop("output_ids")
            out["phases"][mode] = {
                "first_on_a": {"summary": _summary(served), "turns": served},
                "moved_to_b": {"summary": _summary(moved), "turns": moved},
                "recompute_on_b": {"summary": _summary(cold), "turns": cold},
            }
            m, c = out["phases"][mode]["moved_to_b"]["summary"], out["phases"][mode]["recompute_on_b"]["summary"]
            out["phases"][mode]["ttft_ratio_moved_over_recompute"] = m["ttft_median_s"] / c["ttft_median_s"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker-a", required=True)
    p.add_argument("--worker-b", required=True)
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--history-tokens", type=int, default=16_000)
    p.add_argument("--new-tokens", type=int, default=200, help="the next turn's new tokens (tool result)")
    p.add_argument("--output-tokens", type=int, default=16)
    p.add_argument("--settle-s", type=float, default=10.0, help="wait between A's turns and B's")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    result = asyncio.run(run(args))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    for mode, phases in result["phases"].items():
        for name in ("first_on_a", "moved_to_b", "recompute_on_b"):
            s = phases[name]["summary"]
            print(f"{mode:10s} {name:15s} TTFT median {s['ttft_median_s']:.3f} s (max {s['ttft_max_s']:.3f}), "
                  f"cached {s['cached_tokens_mean']:.0f} of {s['prompt_tokens_mean']:.0f} (storage {s['storage_tokens_mean']:.0f})")
        print(f"{mode:10s} moved / recompute TTFT: {phases['ttft_ratio_moved_over_recompute']:.2f}")


if __name__ == "__main__":
    main()
