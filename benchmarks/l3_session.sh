#!/usr/bin/env bash
# Issue 14 point 7 on one H200: two SGLang workers sharing HiCache's file L3 storage (SGLang's
# default path /tmp/hicache, the same for both processes), then sidecar_tools.benchmarks.l3_rehome:
# a history served by worker A is sent to worker B, which never saw it. Once per prefetch policy
# (wait_complete: the request waits for its L3 read; best_effort: SGLang's default).
# After `bash benchmarks/gpu_session.sh setup`:   bash benchmarks/l3_session.sh OUT_DIR
# POLICIES="wait_complete" TAG=-page64 EXTRA="--page-size 64" bash benchmarks/l3_session.sh OUT_DIR   # a variant
set -uo pipefail
out=${1:?out dir}; mkdir -p "$out"
REPO=$(cd "$(dirname "$0")/.." && pwd); KIT=${KIT:-/tmp/kit}
cd "$REPO" || exit 1
source /tmp/sglang-env.sh
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
# KV fixed per worker; each sizes its slack from the GPU memory free at its own start
COMMON=(--max-total-tokens 100000 --mem-fraction-static 0.5 --disable-cuda-graph
        --enable-hierarchical-cache --hicache-size 16 --hicache-storage-backend file)
for policy in ${POLICIES:-wait_complete best_effort}; do
  name=$policy${TAG:-}
  rm -rf /tmp/hicache
  for port in 30000 30001; do
    echo "PORT=$port serve.sh ${COMMON[*]} --hicache-storage-prefetch-policy $policy ${EXTRA:-}" >>"$out/commands.txt"
    # shellcheck disable=SC2086
    PORT=$port bash "$KIT/part01/serve.sh" "${COMMON[@]}" --hicache-storage-prefetch-policy "$policy" ${EXTRA:-} || exit 1
  done
  cmd=(python3 -m sidecar_tools.benchmarks.l3_rehome --worker-a http://127.0.0.1:30000 --worker-b http://127.0.0.1:30001
       --settle-s "${SETTLE_S:-10}" --out "$out/l3-rehome-$name.json")
  echo "${cmd[*]}" >>"$out/commands.txt"
  "${cmd[@]}" 2>&1 | tee "$out/l3-rehome-$name.txt"
  du -sh /tmp/hicache >>"$out/l3-rehome-$name.txt" 2>&1
  curl -s 127.0.0.1:30001/metrics | grep -E "^sglang:(cached_tokens_total|hicache_storage|prefetch|load_back_tokens)" >"$out/metrics-b-$name.txt"
  for port in 30000 30001; do
    cp /tmp/sglang-$port.log "$out/sglang-$port-$name.log"
    kill -- "-$(cat /tmp/sglang-$port.pid)" 2>/dev/null; rm -f /tmp/sglang-$port.pid
  done
  sleep 8
done
echo done >"$out/DONE${TAG:-}"
