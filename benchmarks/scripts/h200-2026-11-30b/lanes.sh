#!/usr/bin/env bash
# The second H200 session of 2026-11-30: the benchmark matrix as two lanes, one per GPU of an
# nvidia-h200-x2 machine (each lane its own SGLang, ports and sidecar; same trace, same KV budget).
#   bash benchmarks/scripts/h200-2026-11-30b/lanes.sh OUT 0|1      (after gpu_session.sh setup)
# Lane order = priority: the last runs of a lane are the first to drop when device time runs out.
# Its NAME:MODE specs are run_matrix.sh's interface at commit e506f47 (the code of that session):
#   git show e506f47:benchmarks/run_matrix.sh > /tmp/run_matrix.sh; MATRIX=/tmp/run_matrix.sh bash ...lanes.sh OUT 0|1
set -uo pipefail
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
OUT=${1:?out dir}; lane=${2:?lane 0 or 1}
export TOK_DIR=/tmp/qwen3-tok TIME_LIMIT=240 TRACE=$OUT/trace.jsonl
m() { bash "${MATRIX:-$REPO/benchmarks/run_matrix.sh}" "$OUT/lane$lane" "$@"; }
F10_SIDECAR="--policy-mode fixed --policy-fixed-ttl 10 --no-admission-enabled"
case $lane in
  0) export CUDA_VISIBLE_DEVICES=0 PORT=30000 SIDECAR_PORT=8000
     LEASE_TTL=30 GAPS=0.5 m plugin:generate            # issue 3.6: plugin + client with fixed 30 s leases
     GAPS="0.5 5" m sidecar:openai                      # the product: sidecar (coding-agent preset) + plugin
     RUN_TAG=-f10 PLUGIN_CONFIG='{"max_leased_fraction": 0.95}' SIDECAR_ARGS=$F10_SIDECAR \
       GAPS="0.5 5" m sidecar:openai                    # the simulator's best robust candidate "F10"
     GAPS="0.5 5" m tlru:generate ;;
  1) export CUDA_VISIBLE_DEVICES=1 PORT=30001 SIDECAR_PORT=8001
     GAPS="0.5 5" m lru:generate
     GAPS="5 0.5" m unconstrained:generate
     GAPS="0.5 5" m session-radix:generate ;;
  *) echo "lane 0 or 1"; exit 2 ;;
esac
echo "lane $lane done"
