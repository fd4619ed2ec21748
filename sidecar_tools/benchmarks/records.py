"""Per-turn records and the run summary: the report format shared by replay, simulator and report.

Recompute metric (the article's): a turn's *history* is what its session had already sent or
received before it (previous prompt + previous reply). Of that history, the tokens the engine did
not serve from cache were recomputed: ``recomputed = max(0, min(history, prompt) - cached)``.
The run's recomputed share is ``sum(recomputed) / sum(history)``.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class TurnRecord:
    session: str
    turn: int
    send_s: float = 0.0  # request sent, seconds since run start
    ttft_s: float | None = None  # first token - send (server/sidecar admission waits included)
    end_s: float | None = None  # last byte, seconds since run start
    client_wait_s: float = 0.0  # time the session waited for a client-side slot before this turn
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    history_tokens: int = 0
    tool_wait_s: float = 0.0  # gap the client waited after this turn
    ok: bool = False
    error: str = ""

    @property
    def recomputed_tokens(self) -> int:
        return recomputed(self.history_tokens, self.prompt_tokens, self.cached_tokens) if self.ok else 0


def recomputed(history: int, prompt: int, cached: int) -> int:
    """Uncached tokens among those the session had already sent or received."""
    return max(0, min(history, prompt) - cached)


CSV_FIELDS = [f.name for f in fields(TurnRecord)] + ["recomputed_tokens"]


def write_turns_csv(records: list[TurnRecord], path: str | Path) -> None:
    with Path(path).open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for r in records:
            w.writerow({**asdict(r), "recomputed_tokens": r.recomputed_tokens})


def read_turns_csv(path: str | Path) -> list[TurnRecord]:
    out = []
    with Path(path).open(newline="") as f:
        for row in csv.DictReader(f):
            row.pop("recomputed_tokens", None)
            out.append(TurnRecord(
                session=row["session"], turn=int(row["turn"]), send_s=float(row["send_s"]),
                ttft_s=float(row["ttft_s"]) if row["ttft_s"] else None,
                end_s=float(row["end_s"]) if row["end_s"] else None,
                client_wait_s=float(row["client_wait_s"]), prompt_tokens=int(row["prompt_tokens"]),
                cached_tokens=int(row["cached_tokens"]), completion_tokens=int(row["completion_tokens"]),
                history_tokens=int(row["history_tokens"]), tool_wait_s=float(row["tool_wait_s"]),
                ok=row["ok"] == "True", error=row["error"],
            ))
    return out


def _pct(xs: list[float], p: float) -> float | None:
    return round(float(np.percentile(xs, p)), 4) if xs else None


def summarize(records: list[TurnRecord], makespan_s: float, planned_turns: int | None = None) -> dict[str, Any]:
    """The headline numbers of one run."""
    ok = [r for r in records if r.ok]
    history = sum(r.history_tokens for r in ok)
    recomp = sum(r.recomputed_tokens for r in ok)
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    ttft_wait = [r.ttft_s + r.client_wait_s for r in ok if r.ttft_s is not None]
    errors: dict[str, int] = {}
    for r in records:
        if not r.ok:
            key = (r.error or "unknown").split(":")[0][:60]
            errors[key] = errors.get(key, 0) + 1
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens for r in ok)
    return {
        "makespan_s": round(makespan_s, 3),
        "turns_ok": len(ok),
        "turns_failed": len(records) - len(ok),
        "turns_planned": planned_turns,
        "errors": errors,
        "history_tokens": history,
        "recomputed_tokens": recomp,
        "recomputed_share": round(recomp / history, 4) if history else None,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "completion_tokens": sum(r.completion_tokens for r in ok),
        "cache_hit_share": round(cached / prompt, 4) if prompt else None,
        "ttft_p50_s": _pct(ttft, 50),
        "ttft_p90_s": _pct(ttft, 90),
        "ttft_p99_s": _pct(ttft, 99),
        "ttft_mean_s": round(float(np.mean(ttft)), 4) if ttft else None,
        "ttft_with_client_wait_p50_s": _pct(ttft_wait, 50),
        "ttft_with_client_wait_p90_s": _pct(ttft_wait, 90),
        "ttft_with_client_wait_p99_s": _pct(ttft_wait, 99),
    }


def save_run(out_dir: str | Path, name: str, run: dict[str, Any], records: list[TurnRecord]) -> Path:
    """Write ``<out>/<name>.json`` and ``<out>/<name>-turns.csv``; return the JSON path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(run, indent=1, default=str) + "\n")
    write_turns_csv(records, out / f"{name}-turns.csv")
    return path


def load_run(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())
