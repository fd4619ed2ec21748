#!/usr/bin/env bash
# The second H200 sitting of 2026-12-03 (30 min of device time): issue 24's ratio-3 no-harm pairs on the
# reference trace (0.5 s and 5 s tool gaps) with the door of round g (a shared prefix counted once, growth
# learned with the prior weighing as 48 turns), then, while the clock allows, the ratio-1 overload pair
# (48 agents x 16 turns, host ratio 1). --context-length 65536 for every run; each configuration's runs
# share one engine.
#   bash benchmarks/gpu_session.sh setup && setsid bash benchmarks/scripts/h200-2026-12-03b/session.sh OUT &
# LIMIT_RUN_BEFORE=<epoch seconds>: start the overload pair only before then (default: always).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
OUT=${1:?out dir}
export TOK_DIR=/tmp/qwen3-tok TIME_LIMIT=${TIME_LIMIT:-420} CONTEXT_LENGTH=65536 SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1
export PLUGIN_CONFIG=${PLUGIN_CONFIG:-'{"max_leased_fraction": 0.8}'}
MATRIX=${MATRIX:-$REPO/benchmarks/run_matrix.sh}
bash "$MATRIX" "$OUT" ${RUNS:-hicache-0.5s hicache-5s product-0.5s product-5s}
if [ "$(date +%s)" -lt "${LIMIT_RUN_BEFORE:-9999999999}" ]; then
  bash "$MATRIX" "$OUT" ${RUNS_LATE:-hicache-overload product-overload}
else
  echo "no time for the overload pair"
fi
echo "session done"
