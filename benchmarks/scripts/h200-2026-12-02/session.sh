#!/usr/bin/env bash
# The H200 session of 2026-12-02 (one GPU, 30 min of device time): the ratio-3 no-harm pairs of issue 24 on
# the two real-trace workloads in one sitting (miniswe, not yet run on the GPU; TraceLab x7 again), each
# configuration's runs on one engine, --context-length 65536 for both. The product's plugin runs with
# PLUGIN_CONFIG: here lock_due_backed_up = "host_short" (backed-up KV locked only while leased KV leaves the
# host less than a GPU pool of room), the candidate for the ratio-3 rows.
#   bash benchmarks/scripts/h200-2026-12-02/session.sh OUT   (after benchmarks/gpu_session.sh setup;
#   started in the background with setsid; the next calls only wait for "session done")
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
OUT=${1:?out dir}
export TOK_DIR=/tmp/qwen3-tok TIME_LIMIT=${TIME_LIMIT:-480} CONTEXT_LENGTH=65536 SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1
export PLUGIN_CONFIG=${PLUGIN_CONFIG:-'{"max_leased_fraction": 0.8, "lock_due_backed_up": "host_short"}'}
bash "${MATRIX:-$REPO/benchmarks/run_matrix.sh}" "$OUT" ${RUNS:-hicache-miniswe hicache-tracelab product-miniswe product-tracelab}
echo "session done"
