#!/usr/bin/env bash
# Engine timelines (one row a virtual second: running / queued requests in SGLang, KV held, resident
# KV, host-tier tokens, sessions at the sidecar's door, prefill / decode seconds so far) of the
# ratio-1 rows of the no-harm table: stock HiCache, the product, and the product under the
# 2026-12-01 admission rule (full 16-turn projection, GPU + host summed, max_wait 120 s).
#   bash benchmarks/scripts/sim/no-harm-2026-12-02-b/timelines.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=${1:-benchmarks/results/sim/no-harm-2026-12-02-b/timelines}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1
TL=benchmarks/scripts/sim/no-harm-2026-12-02-b/timeline.py
REAL=benchmarks/results/real-traces
PRODUCT=(--policy session_ttl --policy-config '{"max_leased_fraction": 0.8}' --sidecar-config configs/coding-agent.toml)
OLD=(--sidecar-set admission.host_tier_projection=full --sidecar-set admission.host_tier_capacity=sum
     --sidecar-set admission.learn_session_turns=false --sidecar-set admission.host_tier_idle_weight=full
     --sidecar-set admission.host_tier_recompute_share=0 --sidecar-set admission.max_wait=120)
OVERLOAD=(--trace benchmarks/results/h200-2026-12-01/trace-overload.jsonl --tool-wait 0.5 --kv-tokens 173200 --hicache-ratio 1)
TRACELAB=(--trace $REAL/tracelab-examples.jsonl --replicate 7 --replicate-offset 20 --context-length 65536
          --kv-tokens 173200 --hicache-ratio 1)
run() { local name=$1; shift; echo "$name: $(python3 $TL "$OUT/$name.tsv" -- "$@" 2>&1 | tail -1)"; }
run hicache-overload "${OVERLOAD[@]}" --policy lru
run product-overload "${OVERLOAD[@]}" "${PRODUCT[@]}"
run product-wait120-overload "${OVERLOAD[@]}" "${PRODUCT[@]}" --sidecar-set admission.max_wait=120
run rule-2026-12-01-overload "${OVERLOAD[@]}" "${PRODUCT[@]}" "${OLD[@]}"
run hicache-tracelab-r1 "${TRACELAB[@]}" --policy lru
run product-tracelab-r1 "${TRACELAB[@]}" "${PRODUCT[@]}"
run rule-2026-12-01-tracelab-r1 "${TRACELAB[@]}" "${PRODUCT[@]}" "${OLD[@]}"
