#!/usr/bin/env bash
# Admission rule at 0.5 / 5 / 60 s tool gaps: LRU, the product before and after the duty-cycle /
# time-horizon gate, and the plugin alone. Simulator runs (sglang-sidecar simulate), not GPU runs.
#   bash benchmarks/scripts/sim/admission/run.sh [OUT]     (from the repo root; ~12 s per run on 2 cores)
set -uo pipefail
OUT=${1:-benchmarks/results/sim/admission}
mkdir -p "$OUT"; CMDS=$OUT/commands.txt; : >"$CMDS"
sim() {  # NAME ARGS...
  local name=$1; shift
  local cmd=(sglang-sidecar simulate --synthetic reference --kv-tokens 173200 --name "$name" --out "$OUT" "$@")
  printf '%q ' "${cmd[@]}" >>"$CMDS"; echo >>"$CMDS"
  "${cmd[@]}" 2>&1 | grep -v -e Warning -e warnings.warn -e '^saved '
}
PLUGIN=(--policy session_ttl --policy-config '{"max_leased_fraction": 0.8}')
PRODUCT=("${PLUGIN[@]}" --sidecar-config configs/coding-agent.toml)
# the gate as shipped before: 8 turns ahead, idle leased sessions counted in full
BEFORE=(--sidecar-set admission.projection_horizon_s=0 --sidecar-set admission.idle_weight=full)
for seed in 2 3 4; do          # 2 = the reference preset's own seed (the GPU runs)
  for gap in 0.5 5 60; do
    sim "lru-${gap}s-seed$seed"            --seed $seed --tool-wait $gap --policy lru
    sim "before-${gap}s-seed$seed"         --seed $seed --tool-wait $gap "${PRODUCT[@]}" "${BEFORE[@]}"
    sim "after-${gap}s-seed$seed"          --seed $seed --tool-wait $gap "${PRODUCT[@]}"
    [ $seed = 2 ] && sim "plugin-${gap}s-seed$seed" --seed $seed --tool-wait $gap "${PLUGIN[@]}" --lease-ttl 30
    # ablations (reference seed): each half of the change alone
    [ $seed = 2 ] && sim "horizon-only-${gap}s-seed$seed" --seed $seed --tool-wait $gap "${PRODUCT[@]}" --sidecar-set admission.idle_weight=full
    [ $seed = 2 ] && sim "dutycycle-only-${gap}s-seed$seed" --seed $seed --tool-wait $gap "${PRODUCT[@]}" --sidecar-set admission.projection_horizon_s=0
  done
done
python3 benchmarks/scripts/sim/admission/table.py "$OUT" > "$OUT/table.md"
