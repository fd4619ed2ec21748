#!/usr/bin/env bash
# Simulated runs of the reference workload (24 sessions x 16 turns, 173,200 KV tokens): one per
# GPU run we have (same config, same name once -generate/-openai is dropped), predictions for the
# current product, the fidelity table and the what-if tables.
#   bash benchmarks/scripts/sim/run.sh [OUT]      (from the repo root; ~12 s per run on 2 cores)
# Each run: <name>.json + <name>-turns.csv (sidecar_tools.benchmarks.replay's format); timings.tsv: wall seconds
# of the whole command (SGLang import included) and of the replay loop alone.
set -uo pipefail
OUT=${1:-benchmarks/results/sim}
mkdir -p "$OUT"
CMDS=$OUT/commands.txt; : >"$CMDS"
printf "run\tcommand_wall_s\treplay_wall_s\n" >"$OUT/timings.tsv"
sim() {  # NAME ARGS...
  local name=$1; shift
  local cmd=(sglang-sidecar simulate --synthetic reference --name "$name" --out "$OUT" "$@")
  printf '%q ' "${cmd[@]}" >>"$CMDS"; echo >>"$CMDS"
  local t0; t0=$(date +%s.%N)
  "${cmd[@]}" 2>&1 | grep -v -e Warning -e warnings.warn -e '^saved '
  local wall; wall=$(python3 -c "print(round($(date +%s.%N) - $t0, 1))")
  local replay; replay=$(python3 -c "import json; print(json.load(open('$OUT/$name.json'))['simulator']['wall_s'])")
  printf "%s\t%s\t%s\n" "$name" "$wall" "$replay" >>"$OUT/timings.tsv"
}
OLD_PLUGIN=', "prefer_leased_requests": false'   # the plugin as run on the H200 (f693d7f)
OLD_SIDECAR=(--sidecar-config configs/coding-agent.toml --sidecar-set admission.projection_turns=1)

# the offline kit's reference table (docs/gpu-kit.md; simulator/calibration/gpu-readme-runs.json)
sim lru-0.5s             --kv-tokens 173200 --policy lru
sim unconstrained-0.5s   --kv-tokens 600000 --policy lru
sim tlru-0.5s            --kv-tokens 173200 --policy tlru --policy-config '{"threshold": 4096, "next_prompt_estimate": 1024}'
sim session-radix-0.5s   --kv-tokens 173200 --policy lru --session-radix-cache
sim cap12-0.5s           --kv-tokens 173200 --policy lru --max-concurrent-sessions 12
sim cap8-0.5s            --kv-tokens 173200 --policy lru --max-concurrent-sessions 8
sim lru-5s               --kv-tokens 173200 --policy lru --tool-wait 5
# benchmarks/results/h200-2026-11-30 (lru and unconstrained above are the same configs)
sim plugin-0.5s          --kv-tokens 173200 --policy session_ttl --lease-ttl 30 --policy-config "{\"max_leased_fraction\": 0.8$OLD_PLUGIN}"
sim plugin-0.5s-bound1.0 --kv-tokens 173200 --policy session_ttl --lease-ttl 30 --policy-config "{\"max_leased_fraction\": 1.0$OLD_PLUGIN}"
sim sidecar-0.5s         --kv-tokens 173200 --policy session_ttl --policy-config "{\"max_leased_fraction\": 1.0$OLD_PLUGIN}" \
                         "${OLD_SIDECAR[@]}"
sim sidecar-0.5s-growth9k --kv-tokens 173200 --policy session_ttl --policy-config "{\"max_leased_fraction\": 0.8$OLD_PLUGIN}" \
                         "${OLD_SIDECAR[@]}" --sidecar-set admission.expected_growth_tokens=9000 \
                         --sidecar-set admission.learn_growth=false --sidecar-set admission.max_wait=0
# predictions for the product as it is now (plugin prefer_leased_requests on, admission 8 turns ahead)
sim now-plugin-0.5s      --kv-tokens 173200 --policy session_ttl --lease-ttl 30 --policy-config '{"max_leased_fraction": 0.8}'
sim now-sidecar-0.5s     --kv-tokens 173200 --policy session_ttl --policy-config '{"max_leased_fraction": 0.8}' \
                         --sidecar-config configs/coding-agent.toml
sim now-sidecar-5s       --kv-tokens 173200 --policy session_ttl --policy-config '{"max_leased_fraction": 0.8}' \
                         --sidecar-config configs/coding-agent.toml --tool-wait 5

# GPU numbers: the targets files in simulator/calibration/ (README table + the 2026-11-30 session)
echo "sglang-sidecar simulate fidelity $OUT --md $OUT/fidelity.md" >>"$CMDS"
sglang-sidecar simulate fidelity "$OUT" --md "$OUT/fidelity.md"
# (WHATIF=0 skips the what-if tables, ~1-2 min: the scripts' smoke test does)
if [ "${WHATIF:-1}" != 0 ]; then
  echo "python3 benchmarks/scripts/sim/whatif.py > $OUT/whatif.md" >>"$CMDS"
  python3 benchmarks/scripts/sim/whatif.py 2>/dev/null >"$OUT/whatif.md"
fi
