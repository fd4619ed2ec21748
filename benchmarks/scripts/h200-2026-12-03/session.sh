#!/usr/bin/env bash
# The H200 session of 2026-12-03 (30 min of device time): issue 24's ratio-3 no-harm pairs on the reference
# trace (0.5 s and 5 s tool gaps) on one machine in one sitting, then, while the clock allows, the
# unconstrained limit of the TraceLab x7 workload (600,000 KV tokens, nothing evicted), which no sitting has
# measured yet. --context-length 65536 for every run, as the issue's runs had; each configuration's runs
# share one engine.
#   bash benchmarks/gpu_session.sh setup && setsid bash benchmarks/scripts/h200-2026-12-03/session.sh OUT &
# LIMIT_RUN_BEFORE=<epoch seconds>: start the unconstrained run only before then (default: always).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
OUT=${1:?out dir}
export TOK_DIR=/tmp/qwen3-tok TIME_LIMIT=${TIME_LIMIT:-420} CONTEXT_LENGTH=65536 SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1
export PLUGIN_CONFIG=${PLUGIN_CONFIG:-'{"max_leased_fraction": 0.8}'}
MATRIX=${MATRIX:-$REPO/benchmarks/run_matrix.sh}
bash "$MATRIX" "$OUT" ${RUNS:-hicache-0.5s hicache-5s product-0.5s product-5s}
if [ "$(date +%s)" -lt "${LIMIT_RUN_BEFORE:-9999999999}" ]; then
  bash "$MATRIX" "$OUT" ${RUNS_LIMIT:-unconstrained-tracelab}
else
  echo "no time for the unconstrained run"
fi
echo "session done"
