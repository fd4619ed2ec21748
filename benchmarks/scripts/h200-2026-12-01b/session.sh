#!/usr/bin/env bash
# The second H200 session of 2026-12-01 (one GPU): the overload pair of the host-tier issue (the
# first session ran out of device time before it), then the reference 0.5 s pair again, so the
# 0.5 s ratio is seen twice on two machines.   bash benchmarks/scripts/h200-2026-12-01b/session.sh OUT
# (after benchmarks/gpu_session.sh setup; started in the background, the next calls only wait.)
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
OUT=${1:?out dir}
export TOK_DIR=/tmp/qwen3-tok TIME_LIMIT=${TIME_LIMIT:-420}
bash "${MATRIX:-$REPO/benchmarks/run_matrix.sh}" "$OUT" hicache-overload product-overload hicache-0.5s product-0.5s
echo "session done"
