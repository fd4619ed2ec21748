"""What-if tables from the simulator (one process, ~1-2 min on 2 cores):
    python3 benchmarks/scripts/sim/whatif.py > benchmarks/results/sim/whatif.md
The product as it is now: sidecar (configs/coding-agent.toml) + session_ttl plugin with
max_leased_fraction 0.8 (prefer_leased_requests on). Reference workload.
1. KV budget sweep: LRU vs the product.
2. The admission gate's projection (admission.projection_turns), at 0.5 s and 5 s tool gaps.
"""

from __future__ import annotations

import functools

from sidecar_tools.simulator.calibrate import simulate_spec
from sidecar_tools.simulator.costmodel import load_calibration

CONFIG = "configs/coding-agent.toml"
PLUGIN = {"policy": "session_ttl", "policy_config": {"max_leased_fraction": 0.8}}


def product(**admission) -> dict:
    return {**PLUGIN, "sidecar": {"config": CONFIG, **({"admission": admission} if admission else {})}}


def run(**spec) -> dict:
    """One simulated reference run (0.5 s gaps, 173,200 KV tokens unless ``spec`` says otherwise): its summary."""
    return simulate_spec({"preset": "reference", "tool_wait": 0.5, "kv_tokens": 173_200, **spec}, _cost())[0]


@functools.cache
def _cost():
    return load_calibration()[0]


def cell(s: dict) -> str:
    return f"{s['makespan_s']:.1f} s / {100 * s['recomputed_share']:.1f} % / {s['ttft_p90_s']:.2f} s"


def main() -> None:
    print("# What-if runs (simulated, reference workload)\n")
    print("Cells: makespan / recomputed history / TTFT p90 (admission waits included). The product: sidecar "
          f"(`{CONFIG}`) + `session_ttl` plugin, `max_leased_fraction` 0.8.\n")
    print("## KV budget (0.5 s tool gaps)\n")
    print("| KV tokens | LRU | sidecar + plugin |\n|---|---|---|")
    for kv in (120_000, 173_200, 250_000, 350_000):
        print(f"| {kv:,} | {cell(run(kv_tokens=kv, policy='lru'))} | {cell(run(kv_tokens=kv, **product()))} |")

    print("\n## Admission projection (173,200 KV tokens)\n")
    print("| | 0.5 s tool gaps | 5 s tool gaps |\n|---|---|---|")
    print(f"| LRU, no sidecar | {cell(run(policy='lru'))} | {cell(run(policy='lru', tool_wait=5.0))} |")
    print(f"| plugin only, client lease 30 s | {cell(run(lease_ttl=30, **PLUGIN))} | {cell(run(lease_ttl=30, tool_wait=5.0, **PLUGIN))} |")
    for turns in (0, 1, 4, 8, 16):
        label = "admission off" if turns == 0 else f"projection_turns {turns}" + (" (shipped)" if turns == 8 else "")
        spec = product(enabled=False) if turns == 0 else product(projection_turns=turns)
        print(f"| sidecar + plugin, {label} | {cell(run(**spec))} | {cell(run(tool_wait=5.0, **spec))} |")
    print(f"| LRU, client cap of 12 sessions | {cell(run(policy='lru', max_concurrent_sessions=12))} | "
          f"{cell(run(policy='lru', max_concurrent_sessions=12, tool_wait=5.0))} |")


if __name__ == "__main__":
    main()
