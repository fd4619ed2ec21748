"""The no-harm simulator table (issue 24), round b: stock HiCache vs the product on six workloads.

    PYTHONPATH=. python3 benchmarks/scripts/sim/no-harm-2026-12-02-b/run.py [--jobs N] [--only W ...] [--rows R ...]
        [--out DIR] [--table-only]

The table, its workloads and its columns: ``sidecar_tools/simulator/no_harm.py``. Beyond the 2026-12-01
round: on the ratio-1 workloads the rows ``product-wait120`` (the preset with ``max_wait = 120``: the
door's trade-off) and ``hicache-wb`` / ``product-wb`` (both with SGLang's ``--hicache-write-policy
write_back``: the host tier then holds only what the GPU gave up, twice the distinct KV of write-through at
ratio 1; another engine flag, so not the no-harm pair), and miniswe with its copies 0.4 / 0.6 s apart.
The product is the plugin's config of the time, ``{"max_leased_fraction": 0.8}``; settings added since
(``defer_with_host_room``) take their defaults in a re-run.
"""

from sidecar_tools.simulator.no_harm import MATRIX_WORKLOADS, REPO, Round, product, run, stock, unconstrained

PLUGIN = {"max_leased_fraction": 0.8}
ROUND = Round(
    out=REPO / "benchmarks" / "results" / "sim" / "no-harm-2026-12-02-b",
    rows={
        "hicache": stock,
        "product": lambda r: product(PLUGIN, r),
        "unconstrained": unconstrained,
        "product-wait120": lambda r: product(PLUGIN, r, "--sidecar-set", "admission.max_wait=120"),
        "hicache-wb": lambda r: [*stock(r), "--hicache-write-policy", "write_back"],
        "product-wb": lambda r: product(PLUGIN, r, "--hicache-write-policy", "write_back"),
    },
    workloads=(*MATRIX_WORKLOADS, "miniswe-o0.4", "miniswe-o0.6"),
    unconstrained_on=("0.5s", "tracelab"),
    ratio_1_only=("product-wait120", "hicache-wb", "product-wb"),
)

if __name__ == "__main__":
    run(ROUND, description=__doc__.splitlines()[0])
