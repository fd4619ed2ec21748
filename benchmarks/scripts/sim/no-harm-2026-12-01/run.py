"""The no-harm simulator table (issue 24), first round: stock HiCache vs the product on six workloads.

    PYTHONPATH=. python3 benchmarks/scripts/sim/no-harm-2026-12-01/run.py [--jobs N] [--only W ...] [--rows R ...]
        [--out DIR] [--table-only]

The table, its workloads and its columns: ``sidecar_tools/simulator/no_harm.py``. This round's product is
the plugin's config of the time, ``{"max_leased_fraction": 0.8}`` (a re-run gets today's defaults for
everything that config does not name).
"""

from sidecar_tools.simulator.no_harm import REPO, Round, product, run, stock, unconstrained

PLUGIN = {"max_leased_fraction": 0.8}
ROUND = Round(
    out=REPO / "benchmarks" / "results" / "sim" / "no-harm-2026-12-01",
    rows={"hicache": stock, "product": lambda r: product(PLUGIN, r), "unconstrained": unconstrained},
    unconstrained_on=("0.5s", "tracelab"),
)

if __name__ == "__main__":
    run(ROUND, description=__doc__.splitlines()[0])
