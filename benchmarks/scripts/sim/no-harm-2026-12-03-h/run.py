"""The no-harm simulator table (issue 24), round h: a session let in at the door's max_wait without room is paced.

    PYTHONPATH=. python3 benchmarks/scripts/sim/no-harm-2026-12-03-h/run.py --copy-stock [--jobs N] [--only W ...]

The table, its workloads and its columns: ``sidecar_tools/simulator/no_harm.py``. The product is the
shipped default (the plugin with ``{"max_leased_fraction": 0.8}`` and ``configs/coding-agent.toml``), now
with ``paced_turn_max_wait`` 10 s: a session the door lets in at ``max_wait`` without room waits at each
later turn, before any new session, until it fits the budget (then it is admitted like any other) or
10 s (``sidecar.policy.admission``). Where the door lets everyone in (every ratio-3 workload) nobody is
paced. The stock rows come from rounds b, f and g (``--copy-stock``: the LRU path did not change).
"""

from sidecar_tools.simulator.no_harm import MATRIX_WORKLOADS, REPO, Round, product, run, stock

RESULTS = REPO / "benchmarks" / "results" / "sim"
ROUND = Round(
    out=RESULTS / "no-harm-2026-12-03-h",
    rows={"hicache": stock, "product": lambda r: product({"max_leased_fraction": 0.8}, r)},
    workloads=(*MATRIX_WORKLOADS, "miniswe-o0.4", "miniswe-o0.6", "0.5s-n26", "5s-n26",
               "0.5s-openai", "5s-openai", "5s-openai-n26"),
    stock_from=(RESULTS / "no-harm-2026-12-02-b", RESULTS / "no-harm-2026-12-03-f", RESULTS / "no-harm-2026-12-03-g"),
)

if __name__ == "__main__":
    run(ROUND, description=__doc__.splitlines()[0])
