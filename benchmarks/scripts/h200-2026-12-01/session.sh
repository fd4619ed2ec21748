#!/usr/bin/env bash
# The H200 session of 2026-12-01 (one GPU): the benchmark matrix of the host-tier issue, in the
# order that needs the fewest SGLang starts and keeps the main comparison first (device time may
# run out before the last runs).   bash benchmarks/scripts/h200-2026-12-01/session.sh OUT
# (after benchmarks/gpu_session.sh setup; started in the background, the next calls only wait.)
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
OUT=${1:?out dir}
export TOK_DIR=/tmp/qwen3-tok TIME_LIMIT=${TIME_LIMIT:-240}
bash "${MATRIX:-$REPO/benchmarks/run_matrix.sh}" "$OUT" \
  hicache-0.5s hicache-5s product-0.5s product-5s unconstrained-0.5s hicache-overload product-overload
echo "session done"
