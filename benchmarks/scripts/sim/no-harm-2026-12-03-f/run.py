"""The no-harm simulator table (issue 24), round f: the door prices an overshoot from its priors until a service time is measured.

    PYTHONPATH=. python3 benchmarks/scripts/sim/no-harm-2026-12-03-f/run.py --copy-stock [--jobs N] [--only W ...]

The table, its workloads and its columns: ``sidecar_tools/simulator/no_harm.py``. The product is the
shipped default (the plugin with ``{"max_leased_fraction": 0.8}``, ``defer_with_host_room`` on, and
``configs/coding-agent.toml``), now with ``Projection.overflow_tokens`` pricing the KV an admission pushes
past the budget from the priors (every holding session at its projected size, out for its predicted gap)
before any turn's service time is measured, instead of allowing no overflow then; the stock rows are
round b's files (``--copy-stock``: the LRU path did not change).
"""

from sidecar_tools.simulator.no_harm import MATRIX_WORKLOADS, REPO, Round, product, run, stock

RESULTS = REPO / "benchmarks" / "results" / "sim"
ROUND = Round(
    out=RESULTS / "no-harm-2026-12-03-f",
    rows={"hicache": stock, "product": lambda r: product({"max_leased_fraction": 0.8}, r)},
    workloads=(*MATRIX_WORKLOADS, "miniswe-o0.4", "miniswe-o0.6"),
    stock_from=RESULTS / "no-harm-2026-12-02-b",
)

if __name__ == "__main__":
    run(ROUND, description=__doc__.splitlines()[0])
