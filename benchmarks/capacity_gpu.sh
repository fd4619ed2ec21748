#!/usr/bin/env bash
# The capacity knee on the GPU: one configuration at given arrival rates, through the official
# client path (the openai client's request shape, through the sidecar in front of real SGLang),
# with the same driver, trace and SLO verdict as the simulator's search (sglang-sidecar capacity).
#
#   bash benchmarks/capacity_gpu.sh OUT_DIR CONFIG DIST RATIO RATE [RATE ...]
#     CONFIG hicache|product   DIST reference|traces   RATIO SGLang's --hicache-ratio   RATE sessions/min
#   e.g. bash benchmarks/capacity_gpu.sh /tmp/res product traces 1 14 16    (the simulator's capacity and one above)
#
# SGLang starts once with the configuration's flags (`capacity flags --part engine`: --max-total-tokens
# 173200, --enable-hierarchical-cache --hicache-ratio RATIO, the config's policy; the traces get
# --context-length 65536 with SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1); every rate gets a fresh
# sidecar (`--part sidecar`), --flush-cache and its own salt. Points merge into
# OUT_DIR/capacity-CONFIG-DIST-rRATIO.json (source "gpu"), each rate's run JSON + per-turn CSV next
# to it, commands.txt, logs/ (SGLang's log: engine_timeline reads it).
#
# Environment (run_matrix.sh's conventions):
#   SERVE=/tmp/kit/part01/serve.sh   MODEL=/tmp/qwen3-8b   TOK_DIR=/tmp/qwen3-tok   PORT=30000  SIDECAR_PORT=8000
#     (SERVE=benchmarks/sim_serve.sh: the simulator stands in for SGLang, a dry run on any machine)
#   CAPACITY_ARGS="--warmup 40 --measure 80 ..."   window / SLO flags of `capacity run` (default: its own)
#   ENGINE_FLAGS="..." / SIDECAR_FLAGS="..."         replace the configuration's own flags (as --engine-flags)
#   EXTRA_SGLANG_ARGS="..."                          appended to the SGLang start only
#   SOURCE=gpu  recorded as the results' source (default: sim-serve when SERVE is benchmarks/sim_serve.sh)
#   DEADLINE=<epoch seconds>  when the lent machine goes: a rate whose run could end later (its last arrival
#     + the drain, 30 s before DEADLINE) is skipped, not cut into a point that reads as a missed SLO
set -uo pipefail

OUT=${1:?usage: capacity_gpu.sh OUT_DIR CONFIG DIST RATIO RATE [RATE ...]}
CONFIG=${2:?config: hicache or product}; DIST=${3:?dist: reference or traces}; RATIO=${4:?hicache ratio}
shift 4
[ $# -gt 0 ] || { echo "give at least one rate (sessions/min)"; exit 2; }
RATES=("$@")
REPO=$(cd "$(dirname "$0")/.." && pwd)
SERVE=${SERVE:-/tmp/kit/part01/serve.sh}
MODEL=${MODEL:-/tmp/qwen3-8b}
TOK_DIR=${TOK_DIR:-/tmp/qwen3-tok}
PORT=${PORT:-30000}
SIDECAR_PORT=${SIDECAR_PORT:-8000}
ENGINE=http://127.0.0.1:$PORT
SIDECAR=http://127.0.0.1:$SIDECAR_PORT
EXTRA_SGLANG_ARGS=${EXTRA_SGLANG_ARGS:-}
# shellcheck disable=SC2206
CAPACITY_ARGS=(${CAPACITY_ARGS:-})
# what ran the points: a dry run against the simulator's HTTP server is no GPU result
SOURCE=${SOURCE:-$(case $SERVE in *sim_serve.sh) echo sim-serve ;; *) echo gpu ;; esac)}
OVERRIDES=()
[ -n "${ENGINE_FLAGS+x}" ] && OVERRIDES+=(--engine-flags "$ENGINE_FLAGS")
[ -n "${SIDECAR_FLAGS+x}" ] && OVERRIDES+=(--sidecar-flags "$SIDECAR_FLAGS")
NOT_AFTER=(); [ -n "${DEADLINE:-}" ] && NOT_AFTER=(--not-after $((DEADLINE - 30)))

# shellcheck source=lib/sidecar.sh
source "$REPO/benchmarks/lib/sidecar.sh"
bench_setup "$REPO" "$OUT" capacity.log
[ "$DIST" = traces ] && export SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1

flags() {  # PART -> the configuration's flags, one per line (the capacity module is their one source)
  python3 -m sidecar_tools.benchmarks.capacity flags --config "$CONFIG" --hicache-ratio "$RATIO" --dist "$DIST" \
    --part "$1" "${OVERRIDES[@]}" | python3 -c 'import shlex, sys; print("\n".join(shlex.split(sys.stdin.read())))'
}
mapfile -t ENGINE_ARGS < <(flags engine) || exit 1
mapfile -t SIDECAR_ARGS < <(flags sidecar) || exit 1
[ ${#ENGINE_ARGS[@]} -gt 0 ] || { log "no engine flags for $CONFIG"; exit 1; }
fetch_tokenizer || exit 1

NAME=capacity-$CONFIG-$DIST-r$RATIO
log "$NAME: serve ${ENGINE_ARGS[*]} $EXTRA_SGLANG_ARGS"
echo "MODEL=$MODEL PORT=$PORT bash $(quoted "$SERVE" "${ENGINE_ARGS[@]}") $EXTRA_SGLANG_ARGS" >>"$CMDS"
# shellcheck disable=SC2086
MODEL=$MODEL PORT=$PORT bash "$SERVE" "${ENGINE_ARGS[@]}" $EXTRA_SGLANG_ARGS || {
  log "SGLang did not start"; cp "/tmp/sglang-$PORT.log" "$OUT/logs/sglang-$NAME.log" 2>/dev/null; exit 1; }
status=0
for rate in "${RATES[@]}"; do
  log "$NAME: rate $rate/min"
  start_sidecar "$NAME-at-$rate" "${SIDECAR_ARGS[@]}" || { status=1; continue; }
  run python3 -m sidecar_tools.benchmarks.capacity run --config "$CONFIG" --dist "$DIST" --hicache-ratio "$RATIO" \
    "${OVERRIDES[@]}" "${CAPACITY_ARGS[@]}" "${NOT_AFTER[@]}" --rate "$rate" --url "$SIDECAR" --engine-url "$ENGINE" \
    --tokenizer "$TOK_DIR" --source "$SOURCE" --out "$OUT" 2>&1 | tee -a "$OUT/logs/capacity.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  curl -s "$SIDECAR/metrics" >"$OUT/logs/sidecar-metrics-$NAME-at-$rate.txt"
  stop_sidecar
done
cp "/tmp/sglang-$PORT.log" "$OUT/logs/sglang-$NAME.log" 2>/dev/null
stop_engine
run python3 -m sidecar_tools.benchmarks.capacity report "$OUT" --md "$OUT/capacity-table.md" --png "$OUT/capacity-plot.png" \
  | tee -a "$OUT/logs/capacity.log"
exit $status
