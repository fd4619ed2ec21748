#!/usr/bin/env bash
# The simulator on every GPU run of benchmarks/results/h200-2026-11-30b (same trace file, same
# configs, same names once -generate/-openai is dropped), then the fidelity table against them.
#   bash benchmarks/scripts/sim/h200-2026-11-30b/run.sh [OUT]     (repo root; ~15 s per run on 2 cores)
set -uo pipefail
OUT=${1:-benchmarks/results/sim/h200-2026-11-30b}
GPU=benchmarks/results/h200-2026-11-30b
mkdir -p "$OUT"
CMDS=$OUT/commands.txt; : >"$CMDS"
sim() {  # NAME ARGS...
  local name=$1; shift
  local cmd=(sglang-sidecar simulate --trace "$GPU/trace.jsonl" --name "$name" --out "$OUT" "$@")
  printf '%q ' "${cmd[@]}" >>"$CMDS"; echo >>"$CMDS"
  "${cmd[@]}" 2>&1 | grep -v -e Warning -e warnings.warn -e '^saved '
}
PLUGIN=(--policy session_ttl --policy-config '{"max_leased_fraction": 0.8}')
F10=(--policy session_ttl --policy-config '{"max_leased_fraction": 0.95}' --sidecar-policy fixed:10 --no-admission)
for gap in 0.5 5; do
  sim lru-${gap}s            --kv-tokens 173200 --policy lru --tool-wait $gap
  sim unconstrained-${gap}s  --kv-tokens 600000 --policy lru --tool-wait $gap
  sim tlru-${gap}s           --kv-tokens 173200 --policy tlru --policy-config '{"threshold": 4096, "next_prompt_estimate": 1024}' --tool-wait $gap
  sim session-radix-${gap}s  --kv-tokens 173200 --policy lru --session-radix-cache --tool-wait $gap
  sim sidecar-${gap}s        --kv-tokens 173200 "${PLUGIN[@]}" --sidecar-config configs/coding-agent.toml --tool-wait $gap
  sim sidecar-${gap}s-f10    --kv-tokens 173200 "${F10[@]}" --sidecar-config configs/coding-agent.toml --tool-wait $gap
done
sim plugin-0.5s --kv-tokens 173200 "${PLUGIN[@]}" --lease-ttl 30 --tool-wait 0.5
echo "sglang-sidecar simulate fidelity $OUT --gpu $GPU --md $OUT/fidelity.md" >>"$CMDS"
sglang-sidecar simulate fidelity "$OUT" --gpu "$GPU" --md "$OUT/fidelity.md"
