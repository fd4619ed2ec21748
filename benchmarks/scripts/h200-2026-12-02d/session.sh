#!/usr/bin/env bash
# The H200 session of 2026-12-02 (fourth; 30 min of device time): issue 24's ratio-3 no-harm pairs on the
# reference trace (0.5 s and 5 s tool gaps) with main's door budget (hierarchy - (1 - headroom) x GPU pool) and
# the plugin's default defer_with_host_room, the unconstrained limit of the 0.5 s run, then, while the clock
# allows, a second 0.5 s pair (-b) on fresh engines to show how far two pairs of one sitting differ.
# Each configuration's runs share one engine; --context-length 65536 everywhere, as the issue's runs had.
#   bash benchmarks/gpu_session.sh setup && setsid bash benchmarks/scripts/h200-2026-12-02d/session.sh OUT &
# SECOND_PASS_BEFORE=<epoch seconds>: start the second pass only before then (default: always).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
OUT=${1:?out dir}
export TOK_DIR=/tmp/qwen3-tok TIME_LIMIT=${TIME_LIMIT:-300} CONTEXT_LENGTH=65536 SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1
export PLUGIN_CONFIG=${PLUGIN_CONFIG:-'{"max_leased_fraction": 0.8}'}
MATRIX=${MATRIX:-$REPO/benchmarks/run_matrix.sh}
bash "$MATRIX" "$OUT" ${RUNS:-hicache-0.5s hicache-5s product-0.5s product-5s unconstrained-0.5s}
if [ "$(date +%s)" -lt "${SECOND_PASS_BEFORE:-9999999999}" ]; then
  echo "second pass"
  RUN_TAG=-b bash "$MATRIX" "$OUT" ${RUNS_B:-hicache-0.5s product-0.5s}
else
  echo "no time for the second pass"
fi
echo "session done"
