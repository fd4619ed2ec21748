#!/usr/bin/env bash
# Ratio-1 capacities on other arrival / session draws (simulator): the searches of capacity-2026-12-02-b for
# stock HiCache and the product at host ratio 1, both distributions, with --seed 3 and --seed 4 (the committed
# searches use seed 2). Whether the product's 1.16x / 1.05x hold beyond one draw: the traces verdicts rest on the
# ~5 worst of ~445 later turns.
#   bash benchmarks/scripts/sim/capacity-seeds-2026-12-03/run.sh [SEED ...]     (~10 min a seed on 2 cores)
set -uo pipefail
cd "$(dirname "$0")/../../../.." || exit 1
BASE=benchmarks/results/sim/capacity-seeds-2026-12-03
for seed in ${*:-3 4}; do
  OUT=$BASE/seed$seed WINDOW="--seed $seed" COPY_STOCK=0 JOBS=${JOBS:-2} \
    bash benchmarks/scripts/sim/capacity-2026-12-02-b/run.sh \
    hicache-reference-r1 product-reference-r1 hicache-traces-r1 product-traces-r1
done
