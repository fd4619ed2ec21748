#!/usr/bin/env bash
# The third H200 sitting of 2026-12-03 (30 min of device time): issue 24's ratio-1 pairs, the first GPU run of
# pacing (a session let in at max_wait without room runs its later turns when they fit): the overload
# (48 agents x 16 turns) and the TraceLab x7 trace, both at host ratio 1. Stock runs first on one engine,
# then the product's on one engine (two engine starts); --context-length 65536 for every run.
#   bash benchmarks/gpu_session.sh setup && setsid bash benchmarks/scripts/h200-2026-12-03c/session.sh OUT &
# RUNS="..." replaces the four runs; DEADLINE=<epoch s> (run_matrix.sh's) ends the last run before the machine goes.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
OUT=${1:?out dir}
export TOK_DIR=/tmp/qwen3-tok TIME_LIMIT=${TIME_LIMIT:-420} CONTEXT_LENGTH=65536 SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1
export PLUGIN_CONFIG=${PLUGIN_CONFIG:-'{"max_leased_fraction": 0.8}'}
bash "${MATRIX:-$REPO/benchmarks/run_matrix.sh}" "$OUT" \
  ${RUNS:-hicache-overload hicache-tracelab-r1 product-overload product-tracelab-r1}
echo "session done"
