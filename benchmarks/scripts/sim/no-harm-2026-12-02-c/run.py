"""The no-harm simulator table (issue 24), round c: stock HiCache vs the product and candidate lock rules.

    PYTHONPATH=. python3 benchmarks/scripts/sim/no-harm-2026-12-02-c/run.py [--jobs N] [--only W ...] [--rows R ...]
        [--out DIR] [--table-only] [--copy-stock]

The table, its workloads and its columns: ``sidecar_tools/simulator/no_harm.py``. The stock rows
(``hicache``) are round b's files, copied (``--copy-stock``: the LRU path did not change); the rows are
round b's product (``product-b``: ``lock_due_backed_up`` true) and the candidate rules for backed-up leases
(``cand-*``: plugin settings, each row naming its rule so it does not depend on the defaults). Run as
``--copy-stock --rows cand-hostshort product-b cand-nolock cand-fcfs``, then ``--copy-stock --only
miniswe-o0.4 miniswe-o0.6 --rows cand-hostshort``. Every row has ``defer_with_host_room`` off (round d's
setting, now the default); the waiting-prefix refresh that round d added has no setting, so a re-run
differs by it.
"""

from sidecar_tools.simulator.no_harm import MATRIX_WORKLOADS, REPO, Round, product, run, stock

RESULTS = REPO / "benchmarks" / "results" / "sim"
BASE = {"max_leased_fraction": 0.8, "defer_with_host_room": False}


def _rule(**plugin):
    return lambda r: product({**BASE, **plugin}, r)


ROUND = Round(
    out=RESULTS / "no-harm-2026-12-02-c",
    rows={
        "hicache": stock,
        "product": _rule(),
        "cand-hostshort": _rule(lock_due_backed_up="host_short"),
        "product-b": _rule(lock_due_backed_up=True),
        "cand-nolock": _rule(lock_due_backed_up=False),
        "cand-fcfs": _rule(lock_due_backed_up=True, prefer_leased_requests=False),
        "cand-wait05": _rule(lock_due_backed_up=True, max_priority_wait_s=0.5),
    },
    workloads=(*MATRIX_WORKLOADS, "miniswe-o0.4", "miniswe-o0.6"),
    stock_from=RESULTS / "no-harm-2026-12-02-b",
)

if __name__ == "__main__":
    run(ROUND, description=__doc__.splitlines()[0])
