#!/usr/bin/env bash
# Issue 24, capacity at ratio 1: upper bounds for any cache / admission policy with stock's engine flags, and
# product-side probes (SIMULATOR). ~25 min on 2 cores. Writes benchmarks/results/sim/capacity-r1-bound-2026-12-03/.
#   bash benchmarks/scripts/sim/capacity-r1-bound-2026-12-03/run.sh [bounds|timeline|probes]...   (default: all)
set -uo pipefail
cd "$(dirname "$0")/../../../.." || exit 1
HERE=benchmarks/scripts/sim/capacity-r1-bound-2026-12-03
OUT=${OUT:-benchmarks/results/sim/capacity-r1-bound-2026-12-03}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1 OUT
STEPS=${*:-bounds timeline probes}
L="flock -s /tmp/bench.lock nice -n 10"
for step in $STEPS; do case $step in
bounds)  # idealised engines (oracle.py's docstring): capacity searches, two at a time
  for e in free-host-r10 free-host-r2 free-host-r1; do
    $L python3 $HERE/oracle.py search --engine $e --dist reference --start 24 --out "$OUT" &
    $L python3 $HERE/oracle.py search --engine $e --dist traces --start 14.46 --out "$OUT"; wait
  done
  # the product's door and leases with a perfect gap predictor (the sidecar's best case)
  $L python3 $HERE/oracle.py run --engine r1 --config product --sim-flag=--expected-back-oracle --tag backoracle \
     --dist reference --rate 24.4 --rate 26.56 --out "$OUT" &
  $L python3 $HERE/oracle.py run --engine r1 --config product --sim-flag=--expected-back-oracle --tag backoracle \
     --dist traces --rate 12 --rate 14.46 --out "$OUT"; wait ;;
timeline)  # 600,000 GPU tokens (nothing evicted), turns saved: the KV the live sessions keep, and the eviction oracle
  U=$OUT/unconstrained
  $L python3 -m sidecar_tools.benchmarks.capacity run --config hicache --dist reference --hicache-ratio 1 --kv-tokens 600000 \
     --rate 19.92 --rate 23.2 --rate 26.56 --rate 29.88 --save-runs --out "$U" &
  $L python3 -m sidecar_tools.benchmarks.capacity run --config hicache --dist traces --hicache-ratio 1 --kv-tokens 600000 \
     --rate 9.64 --rate 10.14 --rate 12 --rate 14.46 --rate 16 --rate 18.63 --save-runs --out "$U"; wait
  python3 $HERE/kv_demand.py "$U"/*-at-*.json --json "$OUT/kv-demand.json" >/dev/null
  python3 $HERE/shed_oracle.py "$U"/*-at-*.json --json "$OUT/shed-oracle.json" >/dev/null ;;
probes)
  bash $HERE/probes.sh product-ref product-tr mlf1-tr mlf05-tr nolease-tr noadm-tr share1-tr longlease-tr shortlease-tr \
       wait10-ref longlease-ref shortlease-ref ;;
esac; done
