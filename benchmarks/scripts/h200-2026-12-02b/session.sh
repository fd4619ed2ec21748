#!/usr/bin/env bash
# The H200 session of 2026-12-02 (second; 644 s of device time left: one engine start, one run): the product
# on miniswe at ratio 3 with the plugin stepping aside while the host tier has room (defer_with_host_room) and
# refreshing queued requests' prefixes as SGLang does for lru. Its stock pair is hicache-miniswe of the first
# 2026-12-02 sitting (another machine: a cross-sitting comparison, not a pair).
#   bash benchmarks/gpu_session.sh setup && bash benchmarks/scripts/h200-2026-12-02b/session.sh OUT
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
OUT=${1:?out dir}
export TOK_DIR=/tmp/qwen3-tok TIME_LIMIT=${TIME_LIMIT:-240} CONTEXT_LENGTH=65536 SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1
export PLUGIN_CONFIG=${PLUGIN_CONFIG:-'{"max_leased_fraction": 0.8, "defer_with_host_room": true}'}
bash "${MATRIX:-$REPO/benchmarks/run_matrix.sh}" "$OUT" ${RUNS:-product-miniswe}
echo "session done"
