#!/usr/bin/env bash
# Regenerates the gap-replay results of benchmarks/results/gap-replay (deterministic: fixed seeds, no GPU needed).
#   bash benchmarks/scripts/gap-replay/run.sh [OUT]     (OUT defaults to that folder; TRACE= where the
#   committed trace is written, default benchmarks/data/synthetic-coding-agent-regime.jsonl)
# Until the sglang-sidecar click group registers gap-replay, the command runs as a module;
# afterwards `sglang-sidecar gap-replay ...` takes the same arguments.
set -euo pipefail
cd "$(dirname "$0")/../../.."
GR=${GR:-python3 -m sidecar_tools.gaps.gap_replay}   # GR= another command line (the smoke test parses only)
OUT=${1:-benchmarks/results/gap-replay}
TRACE=${TRACE:-benchmarks/data/synthetic-coding-agent-regime.jsonl}
mkdir -p "$OUT"
SWEEP="--fixed-ttl 2 --fixed-ttl 10 --fixed-ttl 30 --fixed-ttl 120 --fixed-ttl 300"

# The committed trace: 100 coding-agent sessions, execute_bash 10x slower from session 50 on.
$GR --synthetic coding-agent --sessions 100 --seed 7 --regime-change-at 0.5 \
    --write-trace "$TRACE" > /dev/null

run() {  # name, args...
  local name=$1; shift
  { echo "\$ sglang-sidecar gap-replay $*"; echo; $GR "$@" --json-out "$OUT/$name.json"; } > "$OUT/$name.txt"
}
run coding-agent-regime-trace "$TRACE" \
    --config configs/coding-agent.toml $SWEEP --segments 4
run coding-agent-regime --synthetic coding-agent --sessions 400 --seed 0 --regime-change-at 0.5 \
    --config configs/coding-agent.toml $SWEEP --segments 4
run coding-agent --synthetic coding-agent --sessions 400 --seed 1 \
    --config configs/coding-agent.toml $SWEEP
run interactive-chat --synthetic interactive-chat --sessions 1000 --seed 0 \
    --config configs/interactive-chat.toml $SWEEP
