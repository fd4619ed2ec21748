"""The per-worker tables a several-worker replay prints under its summary line: how the load
spread over the workers (is one of them the bottleneck? would one fewer do?) and what a worker
loss cost. Pure formatting of the run JSON's ``workers`` and ``faults`` entries (no sglang)."""

from __future__ import annotations

from typing import Any

WORKER_COLUMNS = (
    ("worker", "worker", "{}"),
    ("sessions", "sessions_placed", "{}"),
    ("turns", "turns_served", "{}"),
    ("prompt tok", "prompt_tokens", "{:,}"),
    ("recomputed tok", "recomputed_tokens", "{:,}"),
    ("L3 read tok", "storage_read_tokens", "{:,}"),
    ("peak used KV", "peak_used_kv_tokens", "{:,}"),
    ("peak resident KV", "peak_resident_kv_tokens", "{:,}"),
    ("peak host", "peak_host_used_tokens", "{:,}"),
    ("busy", "busy_fraction", "{:.0%}"),
    ("admission waits", "admission_waits", "{}"),
    ("wait s", "admission_wait_s", "{:.1f}"),
    ("lost at s", "lost_at_s", "{:g}"),
)


def _cell(fmt: str, value: Any) -> str:
    return "-" if value is None else fmt.format(value)


def format_workers(workers: list[dict[str, Any]]) -> str:
    """A markdown table, one row per worker."""
    rows = ["| " + " | ".join(title for title, _, _ in WORKER_COLUMNS) + " |",
            "|" + "---|" * len(WORKER_COLUMNS)]
    for w in workers:
        rows.append("| " + " | ".join(_cell(fmt, w.get(key)) for _, key, fmt in WORKER_COLUMNS) + " |")
    return "\n".join(rows)


def format_faults(faults: dict[str, Any]) -> str:
    """One line: what the worker losses cost."""
    l3 = faults.get("l3")
    return (f"worker loss: {faults['failed_requests']} requests failed (retried) | {faults['rehomed_sessions']} sessions "
            f"re-homed, {faults['rehome_history_tokens']:,} history tokens | their first turns on the new worker: "
            f"{faults['rehomed_recomputed_tokens']:,} recomputed, {faults['rehomed_l3_read_tokens']:,} read from L3"
            + (f" ({l3['read_gbps']:g} GB/s, {l3['read_s']:.2f} s of reads)" if l3 else "")
            + f", TTFT mean {_cell('{:.2f}', faults['rehomed_ttft_mean_s'])} s, max {_cell('{:.2f}', faults['rehomed_ttft_max_s'])} s"
            + (f" | L3 pays above ~{faults['l3_break_even_gbps']:g} GB/s for these histories"
               if faults.get("l3_break_even_gbps") else ""))
