#!/usr/bin/env bash
# The 48-agent overload at host ratio 1 on other draws of the reference generator (simulator): stock HiCache and
# the product (round h: pacing) with the OpenAI path's template tokens, as no-harm-2026-12-03-h/probes ran the
# committed trace (its seed is the preset's). Single runs swing on single eviction decisions; this is the spread.
#   bash benchmarks/scripts/sim/overload-seeds-2026-12-03/run.sh [SEED ...]     (~2 min a seed on 2 cores)
set -uo pipefail
cd "$(dirname "$0")/../../../.." || exit 1
OUT=${OUT:-benchmarks/results/sim/overload-seeds-2026-12-03}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1
mkdir -p "$OUT"
COMMON=(--tool-wait 0.5 --kv-tokens 173200 --hicache-ratio 1 --template-tokens qwen3-openai)
for seed in ${*:-11 12 13}; do
  trace=$OUT/trace-seed$seed.jsonl
  python3 -m sidecar_tools.benchmarks.traces generate --preset reference --sessions 48 --seed "$seed" --out "$trace" >/dev/null
  python3 -m sidecar simulate --trace "$trace" "${COMMON[@]}" --policy lru --name "hicache-seed$seed" --out "$OUT" &
  python3 -m sidecar simulate --trace "$trace" "${COMMON[@]}" --policy session_ttl \
    --policy-config '{"max_leased_fraction": 0.8}' --sidecar-config configs/coding-agent.toml \
    --name "product-seed$seed" --out "$OUT"
  wait
done
