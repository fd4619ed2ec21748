#!/usr/bin/env bash
# Regenerates the gap-replay results in this folder (deterministic: fixed seeds, no GPU needed).
# Until the sglang-sidecar click group registers gap-replay, the command runs as a module;
# afterwards `sglang-sidecar gap-replay ...` takes the same arguments.
set -euo pipefail
cd "$(dirname "$0")/../../.."
GR="python -m sidecar_tools.gaps.gap_replay"
OUT=benchmarks/results/gap-replay
SWEEP="--fixed-ttl 2 --fixed-ttl 10 --fixed-ttl 30 --fixed-ttl 120 --fixed-ttl 300"

# The committed trace: 100 coding-agent sessions, execute_bash 10x slower from session 50 on.
$GR --synthetic coding-agent --sessions 100 --seed 7 --regime-change-at 0.5 \
    --write-trace benchmarks/data/synthetic-coding-agent-regime.jsonl > /dev/null

run() {  # name, args...
  local name=$1; shift
  { echo "\$ sglang-sidecar gap-replay $*"; echo; $GR "$@" --json-out "$OUT/$name.json"; } > "$OUT/$name.txt"
}
run coding-agent-regime-trace benchmarks/data/synthetic-coding-agent-regime.jsonl \
    --config configs/coding-agent.toml $SWEEP --segments 4
run coding-agent-regime --synthetic coding-agent --sessions 400 --seed 0 --regime-change-at 0.5 \
    --config configs/coding-agent.toml $SWEEP --segments 4
run coding-agent --synthetic coding-agent --sessions 400 --seed 1 \
    --config configs/coding-agent.toml $SWEEP
run interactive-chat --synthetic interactive-chat --sessions 1000 --seed 0 \
    --config configs/interactive-chat.toml $SWEEP
