#!/usr/bin/env bash
# How many workers for a trace, and what a worker loss costs with and without a shared L3 store:
# the simulator's --workers / --lose-worker / --shared-l3 on the GPU matrix's "overload" workload:
# 48 agents x 16 turns of the reference trace as the H200 ran it (its trace file), 0.5 s gaps,
# 173,200 GPU KV tokens + host ratio 1 per worker.
#   bash benchmarks/scripts/sim/workers-2026-12-01/run.sh [OUT] [--jobs N]   (from the repo root;
#   ~20-40 s per run, the SGLang import included)
# Each run: <name>.json + <name>-turns.csv (the benchmark's format; per-worker load under "workers",
# the loss's cost under "faults") and <name>.txt (what the command printed); commands.txt lists them.
set -uo pipefail
OUT=${1:-benchmarks/results/sim/workers-2026-12-01}
JOBS=2; [ "${2:-}" = "--jobs" ] && JOBS=${3:-2}
mkdir -p "$OUT"
CMDS=$OUT/commands.txt; : >"$CMDS"
WORKLOAD=(--trace benchmarks/results/h200-2026-12-01/trace-overload.jsonl --tool-wait 0.5 --kv-tokens 173200 --hicache-ratio 1)
PRODUCT=(--policy session_ttl --policy-config '{"max_leased_fraction": 0.8}' --sidecar-config configs/coding-agent.toml)
STOCK=(--policy lru)
sim() {  # NAME ARGS...
  local name=$1; shift
  local cmd=(sglang-sidecar simulate "${WORKLOAD[@]}" --name "$name" --out "$OUT" "$@")
  printf '%q ' "${cmd[@]}" >>"$CMDS"; echo >>"$CMDS"
  ( "${cmd[@]}" 2>&1 | grep -v -e Warning -e warnings.warn -e '^saved ' -e 'simulate' >"$OUT/$name.txt"; cat "$OUT/$name.txt" ) &
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
}
# how many workers: the product and stock HiCache on 1, 2, 3 workers
for n in 1 2 3; do
  sim "product-${n}w" "${PRODUCT[@]}" --workers "$n"
  sim "stock-${n}w" "${STOCK[@]}" --workers "$n"
done
# worker 0 of 3 lost at 30 s: recompute vs the shared L3 store at 0.25, 1, 4 (the default) and 16 GB/s
sim product-3w-lose0        "${PRODUCT[@]}" --workers 3 --lose-worker 0@30
sim product-3w-lose0-l3-0.25 "${PRODUCT[@]}" --workers 3 --lose-worker 0@30 --shared-l3 --l3-read-gbps 0.25
sim product-3w-lose0-l3-1   "${PRODUCT[@]}" --workers 3 --lose-worker 0@30 --shared-l3 --l3-read-gbps 1
sim product-3w-lose0-l3-4   "${PRODUCT[@]}" --workers 3 --lose-worker 0@30 --shared-l3 --l3-read-gbps 4
sim product-3w-lose0-l3-16  "${PRODUCT[@]}" --workers 3 --lose-worker 0@30 --shared-l3 --l3-read-gbps 16
wait
python3 benchmarks/scripts/sim/workers-2026-12-01/table.py "$OUT" > "$OUT/table.md"
