#!/usr/bin/env bash
# The H200 session of 2026-12-01 (night, one GPU): the no-harm pairs of issue 24 at host ratio 3 in ONE
# sitting, stock HiCache vs the product, on the reference (0.5 s gaps) and on the TraceLab replica set
# (7 copies, 20 s apart), one engine per configuration, --context-length 65536 for both workloads.
# The product's plugin runs with PLUGIN_CONFIG (default: the README's, plus what this session tests).
#   bash benchmarks/scripts/h200-2026-12-01e/session.sh OUT   (after benchmarks/gpu_session.sh setup;
#   started in the background with setsid, the next calls only wait for "session done")
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
OUT=${1:?out dir}
export TOK_DIR=/tmp/qwen3-tok TIME_LIMIT=${TIME_LIMIT:-540} CONTEXT_LENGTH=65536 SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1
export PLUGIN_CONFIG=${PLUGIN_CONFIG:-'{"max_leased_fraction": 0.8}'}
bash "${MATRIX:-$REPO/benchmarks/run_matrix.sh}" "$OUT" ${RUNS:-hicache-0.5s hicache-tracelab product-0.5s product-tracelab}
echo "session done"
