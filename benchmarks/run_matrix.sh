#!/usr/bin/env bash
# Benchmark matrix on the H200 host: one trace, one KV budget, several engine configs x tool gaps.
#
#   bash benchmarks/run_matrix.sh OUT_DIR [CONFIG ...]
#
# Needs the offline kit installed (/tmp/sglang-env.sh, serve.sh; see /work/shared/gpu/README.md).
# Every (config, gap) run is capped at TIME_LIMIT seconds. SGLang is restarted once per config;
# between gaps the cache is flushed and session ids/content get a fresh salt.
#
# Configs (NAME:MODE; MODE = generate -> raw /generate with ids, openai -> /v1/chat/completions):
#   lru:openai          SGLang default LRU through its own OpenAI API (model dir with a tokenizer)
#   lru:generate        SGLang default LRU, raw /generate (the README's reference row)
#   tlru:generate       --radix-eviction-policy tlru (threshold 4096, next 1024)
#   session-radix:generate   --enable-session-radix-cache + session_id on every request
#   sidecar:openai      our sidecar + plugin (--radix-eviction-policy session_ttl), default policy
#   plugin:generate     plugin only, the client sends the lease (LEASE_TTL s) on every /generate
#   cap12:generate      LRU, client lets only 12 sessions run at once
#   unconstrained:generate   --max-total-tokens 600000 (nothing evicted: the limit)
#
# Environment knobs (GPU time is scarce: pick a subset):
#   CONFIGS="lru:openai tlru:generate ..."   (or pass them as arguments after OUT_DIR)
#   GAPS="0.5 5"        tool waits in seconds (add 60 when there is time)
#   KV=173200           KV budget in tokens;  TIME_LIMIT=240 per run
#   TRACE=path          trace file (default: the reference preset, saved to OUT_DIR/trace.jsonl)
#   LEASE_TTL=10        lease for plugin:generate
#   SERVE=/tmp/kit/part01/serve.sh   MODEL=/tmp/qwen3-8b   TOK_DIR=/tmp/qwen3-tokenizer
#     (SERVE=benchmarks/sim_serve.sh: the simulator stands in for SGLang, a dry run on any machine)
#   SIDECAR_CONFIG=configs/coding-agent.toml   SIDECAR_PORT=8000   PORT=30000
#   SIDECAR_ARGS="..."       extra sidecar flags (e.g. --policy-mode fixed --policy-fixed-ttl 10)
#   PLUGIN_CONFIG='{"max_leased_fraction": 0.8}'   --radix-eviction-policy-config of sidecar/plugin
#   RUN_TAG=-f10             appended to every run name (variants of one config side by side)
#   EXTRA_SGLANG_ARGS="..."  appended to every serve.sh call
#   CUDA_VISIBLE_DEVICES=1 PORT=30001 SIDECAR_PORT=8001  a second matrix on a second GPU at once
set -uo pipefail

OUT=${1:?usage: run_matrix.sh OUT_DIR [CONFIG ...]}; shift
REPO=$(cd "$(dirname "$0")/.." && pwd)
[ $# -gt 0 ] && CONFIGS="$*"
CONFIGS=${CONFIGS:-"lru:openai lru:generate tlru:generate session-radix:generate sidecar:openai unconstrained:generate"}
GAPS=${GAPS:-"0.5 5"}
KV=${KV:-173200}
TIME_LIMIT=${TIME_LIMIT:-240}
LEASE_TTL=${LEASE_TTL:-10}
SERVE=${SERVE:-/tmp/kit/part01/serve.sh}
MODEL=${MODEL:-/tmp/qwen3-8b}
TOK_DIR=${TOK_DIR:-/tmp/qwen3-tokenizer}
MODEL_TOK=${MODEL_TOK:-/tmp/qwen3-8b-tok}
PORT=${PORT:-30000}
SIDECAR_PORT=${SIDECAR_PORT:-8000}
SIDECAR_CONFIG=${SIDECAR_CONFIG:-$REPO/configs/coding-agent.toml}
SIDECAR_ARGS=${SIDECAR_ARGS:-}
PLUGIN_CONFIG=${PLUGIN_CONFIG:-'{"max_leased_fraction": 0.8}'}
RUN_TAG=${RUN_TAG:-}
EXTRA_SGLANG_ARGS=${EXTRA_SGLANG_ARGS:-}
ENGINE=http://127.0.0.1:$PORT

mkdir -p "$OUT/logs"
OUT=$(cd "$OUT" && pwd)
CMDS=$OUT/commands.txt
# shellcheck disable=SC1091
[ -f /tmp/sglang-env.sh ] && source /tmp/sglang-env.sh
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
cd "$REPO" || exit 1

log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/logs/matrix.log"; }
quoted() { printf "%q " "$@"; }
run() { echo "$(quoted "$@")" >>"$CMDS"; "$@"; }

if [ -z "${TRACE:-}" ]; then
  TRACE=$OUT/trace.jsonl
  [ -f "$TRACE" ] || run python3 -m sidecar_tools.benchmarks.traces generate --preset reference --out "$TRACE" >"$OUT/trace-stats.json"
fi

need_tokenizer() {  # tokenizer folder, and a model folder holding it (for SGLang's OpenAI routes)
  [ -f "$TOK_DIR/tokenizer.json" ] || run python3 -m sidecar_tools.benchmarks.qwen3_tokenizer "$TOK_DIR" || return 1
  if [ ! -f "$MODEL_TOK/tokenizer.json" ]; then
    mkdir -p "$MODEL_TOK" && cp "$MODEL"/*.json "$MODEL_TOK"/ && cp "$TOK_DIR"/* "$MODEL_TOK"/
  fi
}

serve() {  # serve.sh [sglang args]; MODEL_DIR selects the model folder
  log "serve: $*"
  echo "MODEL=${MODEL_DIR:-$MODEL} PORT=$PORT bash $(quoted "$SERVE" "$@") $EXTRA_SGLANG_ARGS" >>"$CMDS"
  # shellcheck disable=SC2086
  MODEL=${MODEL_DIR:-$MODEL} PORT=$PORT bash "$SERVE" "$@" $EXTRA_SGLANG_ARGS
}

SIDECAR_PID=
stop_sidecar() {
  [ -n "$SIDECAR_PID" ] || return 0
  kill "$SIDECAR_PID" 2>/dev/null; wait "$SIDECAR_PID" 2>/dev/null; SIDECAR_PID=
}
start_sidecar() {  # RUN_NAME (names its log)
  local cmd=(python3 -m sidecar serve --sglang-url "$ENGINE" --port "$SIDECAR_PORT" --tokenizer "$TOK_DIR")
  [ -f "$SIDECAR_CONFIG" ] && cmd+=(--config "$SIDECAR_CONFIG")
  # shellcheck disable=SC2206
  cmd+=($SIDECAR_ARGS)
  echo "$(quoted "${cmd[@]}")&" >>"$CMDS"
  "${cmd[@]}" >"$OUT/logs/sidecar-$1.log" 2>&1 &
  SIDECAR_PID=$!
  for _ in $(seq 60); do
    curl -s -o /dev/null "127.0.0.1:$SIDECAR_PORT/health" && return 0  # any HTTP answer: it listens
    kill -0 "$SIDECAR_PID" 2>/dev/null || break
    sleep 1
  done
  log "sidecar did not come up; last lines:"; tail -20 "$OUT/logs/sidecar-$1.log"; return 1
}
trap stop_sidecar EXIT

plugin_installed() {  # SGLang finds plugins through the sglang.srt.plugins entry point
  python3 -c 'import importlib.metadata as m, sys; sys.exit(not any(e.name == "session_ttl" for e in m.entry_points(group="sglang.srt.plugins")))'
}

stop_engine() { [ -f "/tmp/sglang-$PORT.pid" ] && kill -- "-$(cat "/tmp/sglang-$PORT.pid")" 2>/dev/null; }

for cfg in $CONFIGS; do
  name=${cfg%%:*}; mode=${cfg##*:}
  [ "$mode" = "$cfg" ] && mode=generate
  url=$ENGINE; args=(); MODEL_DIR=$MODEL; kv=$KV; sglang=()
  case $name in
    lru) ;;
    tlru) sglang=(--radix-eviction-policy tlru --radix-eviction-policy-config '{"threshold": 4096, "next_prompt_estimate": 1024}') ;;
    session-radix) sglang=(--enable-session-radix-cache) ;;
    sidecar|plugin) sglang=(--radix-eviction-policy session_ttl --radix-eviction-policy-config "$PLUGIN_CONFIG") ;;
    cap12) args=(--max-concurrent-sessions 12) ;;
    cap8) args=(--max-concurrent-sessions 8) ;;
    unconstrained) kv=600000 ;;
    *) log "unknown config $cfg; skipped"; continue ;;
  esac
  [ "$name" = plugin ] && args+=(--lease-ttl "$LEASE_TTL")
  if [ "${sglang[1]:-}" = session_ttl ] && ! plugin_installed; then
    log "WARNING: no session_ttl entry point; install the plugin into SGLang's env first, e.g."
    log "  pip install --no-deps --no-build-isolation --target /tmp/site $REPO"
  fi
  if [ "$mode" = openai ]; then
    need_tokenizer || { log "no tokenizer; $cfg skipped"; continue; }
    args+=(--tokenizer "$TOK_DIR")
    if [ "$name" = sidecar ]; then
      url=http://127.0.0.1:$SIDECAR_PORT; args+=(--engine-url "$ENGINE")
    else
      MODEL_DIR=$MODEL_TOK; args+=(--body-session-id)
    fi
  fi
  if ! serve --max-total-tokens "$kv" "${sglang[@]}"; then
    log "SGLang did not start for $cfg; skipped"; cp "/tmp/sglang-$PORT.log" "$OUT/logs/sglang-$name-$mode.log" 2>/dev/null
    continue
  fi
  for gap in $GAPS; do
    run_name="$name-$mode-${gap}s$RUN_TAG"
    # a fresh sidecar per run: what its predictor learned at one gap must not carry into the next
    if [ "$name" = sidecar ]; then start_sidecar "$run_name" || { stop_sidecar; continue; }; fi
    log "run $run_name"
    run timeout $((TIME_LIMIT + 120)) python3 -m sidecar_tools.benchmarks.replay --mode "$mode" --url "$url" \
      --trace "$TRACE" --tool-wait "$gap" --time-limit "$TIME_LIMIT" --close-sessions --flush-cache \
      --salt "$run_name" --name "$run_name" --out "$OUT" "${args[@]}" 2>&1 | tee -a "$OUT/logs/matrix.log"
    if [ "$name" = sidecar ]; then
      curl -s "127.0.0.1:$SIDECAR_PORT/metrics" >"$OUT/logs/sidecar-metrics-$run_name.txt"
    fi
    stop_sidecar
  done
  cp "/tmp/sglang-$PORT.log" "$OUT/logs/sglang-$name-$mode$RUN_TAG.log" 2>/dev/null
done
stop_engine

# One table + plot per gap (speed-up vs the first config at that gap), and one over everything.
first_cfg=${CONFIGS%% *}; first_name=${first_cfg%%:*}; first_mode=${first_cfg##*:}
[ "$first_mode" = "$first_cfg" ] && first_mode=generate
for gap in $GAPS; do
  ls "$OUT"/*-"${gap}"s*.json >/dev/null 2>&1 || continue
  run python3 -m sidecar_tools.benchmarks.report "$OUT"/*-"${gap}"s*.json --baseline "$first_name-$first_mode-${gap}s" \
    --md "$OUT/table-${gap}s.md" --png "$OUT/plot-${gap}s.png" \
    --title "agent-trace replay, ${gap} s tool wait, KV $KV tokens" | tee -a "$OUT/logs/matrix.log"
done
run python3 -m sidecar_tools.benchmarks.report "$OUT" --md "$OUT/table.md" --png "$OUT/plot.png" \
  --title "agent-trace replay, KV $KV tokens" >/dev/null
