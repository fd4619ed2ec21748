#!/usr/bin/env bash
# Per-request timelines of miniswe (ratio 3): stock HiCache, the product (round b's rule), the product
# with lock_due_backed_up false, and host_short with plain LRU eviction order (what-if, evict_order.py).
#   bash benchmarks/scripts/sim/no-harm-2026-12-02-c/timelines.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/../../../.."
OUT=${1:-benchmarks/results/sim/no-harm-2026-12-02-c/timelines}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1
HERE=benchmarks/scripts/sim/no-harm-2026-12-02-c
MS=(--trace benchmarks/results/real-traces/lmcache-miniswe.jsonl --start-spacing 1 --replicate 2 --replicate-offset 0.5
    --context-length 65536 --kv-tokens 173200 --hicache-ratio 3)
P=(--policy session_ttl --sidecar-config configs/coding-agent.toml)
TMP=$(mktemp -d)
python3 $HERE/req_timeline.py "$OUT/hicache-miniswe-requests.tsv" -- "${MS[@]}" --policy lru --name t --out "$TMP"
python3 $HERE/req_timeline.py "$OUT/product-b-miniswe-requests.tsv" -- "${MS[@]}" "${P[@]}" \
    --policy-config '{"max_leased_fraction": 0.8, "lock_due_backed_up": true}' --name t --out "$TMP"
python3 $HERE/req_timeline.py "$OUT/cand-nolock-miniswe-requests.tsv" -- "${MS[@]}" "${P[@]}" \
    --policy-config '{"max_leased_fraction": 0.8, "lock_due_backed_up": false}' --name t --out "$TMP"
EVKEY=lru python3 $HERE/evict_order.py $HERE/req_timeline.py "$OUT/hostshort-lru-order-miniswe-requests.tsv" -- "${MS[@]}" "${P[@]}" \
    --policy-config '{"max_leased_fraction": 0.8, "lock_due_backed_up": "host_short"}' --name t --out "$TMP"
