#!/usr/bin/env bash
# Single-rate probes of product-side settings at ratio 1 (stock's engine flags: 173,200 GPU tokens, host
# ratio 1, write-through; only the plugin's config and the sidecar's settings change). Each probe's
# capacity JSON goes to $OUT/probes/NAME/ (one folder per setting, the capacity benchmark's own run).
#   bash benchmarks/scripts/sim/capacity-r1-bound-2026-12-03/probes.sh NAME ...     (JOBS=2 at once)
set -uo pipefail
cd "$(dirname "$0")/../../../.." || exit 1
OUT=${OUT:-benchmarks/results/sim/capacity-r1-bound-2026-12-03}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1 OUT
PLUGIN='--enable-hierarchical-cache --radix-eviction-policy session_ttl --radix-eviction-policy-config'
TOML='--config configs/coding-agent.toml'
probe() {  # NAME DIST RATES CONFIG [capacity run flags...]
  local name=$1 dist=$2 rates=$3 config=$4; shift 4
  local r=() ; for x in $rates; do r+=(--rate "$x"); done
  local cmd=(python3 -m sidecar_tools.benchmarks.capacity run --config "$config" --dist "$dist" --hicache-ratio 1 "${r[@]}"
             --out "$OUT/probes/$name" "$@")
  mkdir -p "$OUT/probes/$name"
  echo "$(printf '%q ' "${cmd[@]}")" >"$OUT/probes/$name/command.txt"
  flock -s /tmp/bench.lock nice -n 10 "${cmd[@]}" 2>&1 | grep 'λ' | sed "s/^/$name: /"
}
one() {
  case $1 in
    product-ref)  probe "$1" reference "24.4 26.56" product ;;
    product-tr)   probe "$1" traces "12 14.46" product ;;
    mlf1-ref)     probe "$1" reference "24.4" product --engine-flags "$PLUGIN '{\"max_leased_fraction\": 1.0}'" ;;
    mlf1-tr)      probe "$1" traces "12" product --engine-flags "$PLUGIN '{\"max_leased_fraction\": 1.0}'" ;;
    mlf05-ref)    probe "$1" reference "24.4" product --engine-flags "$PLUGIN '{\"max_leased_fraction\": 0.5}'" ;;
    mlf05-tr)     probe "$1" traces "12" product --engine-flags "$PLUGIN '{\"max_leased_fraction\": 0.5}'" ;;
    wait10-ref)   probe "$1" reference "24.4" product --sidecar-flags "$TOML --admission-max-wait 8" ;;
    nolease-tr)   probe "$1" traces "12" product --sidecar-flags "$TOML --policy-mode off" ;;
    noadm-tr)     probe "$1" traces "12" product --sidecar-flags "$TOML --no-admission-enabled" ;;
    share1-tr)    probe "$1" traces "12" product --sidecar-flags "$TOML --admission-host-tier-recompute-share 1.0 --admission-headroom 1.0" ;;
    longlease-tr) probe "$1" traces "12" product --sidecar-flags "$TOML --policy-kv-cost-weight 1e-7" ;;
    shortlease-tr) probe "$1" traces "12" product --sidecar-flags "$TOML --policy-kv-cost-weight 1e-5" ;;
    longlease-ref) probe "$1" reference "24.4" product --sidecar-flags "$TOML --policy-kv-cost-weight 1e-7" ;;
    shortlease-ref) probe "$1" reference "24.4" product --sidecar-flags "$TOML --policy-kv-cost-weight 1e-5" ;;
    *) echo "unknown probe $1" >&2 ;;
  esac
}
export -f probe one
export PLUGIN TOML
printf '%s\n' "$@" | xargs -P "${JOBS:-2}" -I{} bash -c 'one {}'
