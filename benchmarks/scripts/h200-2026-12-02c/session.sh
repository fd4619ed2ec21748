#!/usr/bin/env bash
# The H200 session of 2026-12-02 (third; 30 min of device time): the ratio-3 no-harm pairs of issue 24 on the
# two real-trace workloads in one sitting, with the plugin's default since 6acfe93 (defer_with_host_room: SGLang's
# LRU order while the host tier has room). Each configuration's runs share one engine, --context-length 65536
# for both; miniswe first so that a sitting cut short still holds one whole pair.
#   bash benchmarks/gpu_session.sh setup && setsid bash benchmarks/scripts/h200-2026-12-02c/session.sh OUT &
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
OUT=${1:?out dir}
export TOK_DIR=/tmp/qwen3-tok TIME_LIMIT=${TIME_LIMIT:-420} CONTEXT_LENGTH=65536 SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1
export PLUGIN_CONFIG=${PLUGIN_CONFIG:-'{"max_leased_fraction": 0.8}'}
bash "${MATRIX:-$REPO/benchmarks/run_matrix.sh}" "$OUT" ${RUNS:-hicache-miniswe hicache-tracelab product-miniswe product-tracelab}
echo "session done"
