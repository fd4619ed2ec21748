#!/usr/bin/env bash
# Simulator capacity of the product (configs/coding-agent.toml of round 2026-12-02-b: admission by
# measured residency) on both distributions at host ratios 1 and 3 (4 searches), then the table and
# the plot. Stock HiCache's searches are not re-run: its path (policy off, admission off) did not
# change, so its results are copied from capacity-2026-12-01 (COPY_STOCK=0 to run them too, with
# COMBOS naming them). SIMULATOR results: the knee is to be confirmed on the GPU with
# benchmarks/capacity_gpu.sh at the capacities found.
#   bash benchmarks/scripts/sim/capacity-2026-12-02-b/run.sh [COMBO ...]     COMBO = CONFIG-DIST-rRATIO
#   JOBS=2 (searches at once)   WINDOW="--warmup 40 ..." (default: capacity's own window)
# Each search starts where the distribution's knee was seen (reference ~18-24/min, traces ~16/min),
# steps x/÷ 1.5 until the verdict flips, then bisects to 10 % (at most 6 rates). Writes
# capacity-CONFIG-DIST-rRATIO.json, logs/COMBO.log, commands.txt, table.md, plot.png.
set -uo pipefail
cd "$(dirname "$0")/../../../.." || exit 1
OUT=${OUT:-benchmarks/results/sim/capacity-2026-12-02-b}  # OUT=... for a later round with the same searches
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1 OUT
JOBS=${JOBS:-2}
export WINDOW=${WINDOW:-}
ALL="product-reference-r1 product-traces-r1 product-reference-r3 product-traces-r3"
COMBOS=${*:-$ALL}
mkdir -p "$OUT/logs"
if [ "${COPY_STOCK:-1}" = 1 ]; then
  cp benchmarks/results/sim/capacity-2026-12-01/capacity-hicache-*.json "$OUT/"
fi
[ $# -gt 0 ] || : >"$OUT/commands.txt"
one() {
  local combo=$1 config dist ratio start
  config=${combo%%-*}; dist=${combo#*-}; dist=${dist%-r*}; ratio=${combo##*-r}
  case $dist-$ratio in reference-3) start=24 ;; reference-1) start=18 ;; *) start=16 ;; esac
  # shellcheck disable=SC2206
  local cmd=(python3 -m sidecar_tools.benchmarks.capacity search --config "$config" --dist "$dist" --hicache-ratio "$ratio"
             $WINDOW --start "$start" --factor 1.5 --tolerance 0.1 --max-points 6 --out "$OUT")
  echo "$(printf '%q ' "${cmd[@]}")" >>"$OUT/commands.txt"
  nice -n 10 "${cmd[@]}" >"$OUT/logs/$combo.log" 2>&1
  tail -1 "$OUT/logs/$combo.log"
}
export -f one
for c in $COMBOS; do echo "$c"; done | xargs -P "$JOBS" -I{} bash -c 'one {}'
report=(python3 -m sidecar_tools.benchmarks.capacity report "$OUT" --md "$OUT/table.md" --png "$OUT/plot.png"
        --title "open-loop capacity at the TTFT SLO - SIMULATOR (H200 calibration), 173,200 GPU KV tokens")
grep -q "capacity report" "$OUT/commands.txt" || echo "$(printf '%q ' "${report[@]}")" >>"$OUT/commands.txt"
"${report[@]}"
