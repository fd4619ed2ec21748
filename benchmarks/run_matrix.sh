#!/usr/bin/env bash
# Benchmark matrix on the H200 host: every configuration through the same client path (the official
# request shape of an OpenAI agent, through the sidecar), one KV budget, several workloads.
#
#   bash benchmarks/run_matrix.sh OUT_DIR [RUN ...]          RUN = CONFIG-WORKLOAD
#
# Needs the offline kit installed (/tmp/sglang-env.sh, serve.sh; see benchmarks/gpu_kit/README.md) and
# this package installed where SGLang finds the plugin (benchmarks/gpu_session.sh setup).
#
# Configs (what a user would run):
#   lru            stock SGLang (LRU radix cache), the sidecar as a plain pass-through
#   hicache        stock SGLang + its host-RAM tier (--enable-hierarchical-cache --hicache-ratio R),
#                  the sidecar as a plain pass-through: the baseline the product must beat
#   product        the product as the README starts it: SGLang + HiCache + the session_ttl plugin,
#                  the sidecar with configs/coding-agent.toml
#   unconstrained  stock SGLang with 600,000 KV tokens (nothing is evicted: the limit), pass-through
# Workloads:
#   0.5s       the reference trace (24 agents x 16 turns), 0.5 s tool gaps, host ratio 3
#   5s         the reference trace, 5 s tool gaps, host ratio 3
#   overload   48 agents x 16 turns (twice the reference), 0.5 s gaps, host ratio 1: even the
#              hierarchy (GPU + host) holds only ~1/3 of the contexts
#   tracelab   the committed TraceLab trace (Claude Code 49K + Codex 12K tokens) x 7 copies, copy k
#              starting 20k s later (0-120 s), recorded gaps and reply lengths, host ratio 3
#              (the simulator's --replicate 7 --replicate-offset 20)
#   miniswe    the committed LMCache mini-swe-agent trace, session i starting at i s, x 2 copies 0.5 s
#              apart, recorded gaps, host ratio 3 (--start-spacing 1 --replicate 2 --replicate-offset 0.5)
#   tracelab-r1  tracelab at host ratio 1
# The real traces reach past 40,960 tokens: their runs start SGLang with --context-length 65536 and
# SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 (dummy weights). Every run also saves an engine timeline
# (sidecar_tools.benchmarks.engine_timeline over the part of SGLang's log the run wrote):
# engine-timeline-RUN.md / .png.
# Runs are named CONFIG-WORKLOAD (e.g. hicache-0.5s); SGLang restarts only when the next run needs
# other engine flags, so keep runs of one engine together. Every run: --flush-cache, a fresh
# --salt, --close-sessions, a fresh sidecar, TIME_LIMIT seconds at most.
#
# Environment knobs (GPU time is scarce: pick a subset):
#   RUNS="hicache-0.5s product-0.5s ..."   (or pass them as arguments after OUT_DIR)
#   KV=173200  HICACHE_RATIO=3  OVERLOAD_RATIO=1  OVERLOAD_SESSIONS=48  TIME_LIMIT=300
#   TRACE=path  (the reference trace; default: generated into OUT_DIR/trace.jsonl)
#   SERVE=/tmp/kit/part01/serve.sh   MODEL=/tmp/qwen3-8b   TOK_DIR=/tmp/qwen3-tok
#     (SERVE=benchmarks/sim_serve.sh: the simulator stands in for SGLang, a dry run on any machine)
#   PRODUCT_CONFIG=configs/coding-agent.toml   PLUGIN_CONFIG='{"max_leased_fraction": 0.8}'
#   SIDECAR_ARGS="..."  extra flags of the product's sidecar;  RUN_TAG=-x  appended to run names
#   CONTEXT_LENGTH=65536  every run's SGLang gets this --context-length (one engine for the reference
#     and the real traces, as the issue's runs had; unset: only the real traces get 65536)
#   EXTRA_SGLANG_ARGS="..."  appended to every SGLang start;  PORT=30000  SIDECAR_PORT=8000
#   DEADLINE=<epoch seconds>  when the machine goes (a session's device time): a run ends by then, 30 s
#     early, with what it has (its JSON says timed_out); a run that would get less than MIN_RUN_S (60) is
#     skipped. Unset: TIME_LIMIT alone.
set -uo pipefail

OUT=${1:?usage: run_matrix.sh OUT_DIR [RUN ...]}; shift
REPO=$(cd "$(dirname "$0")/.." && pwd)
[ $# -gt 0 ] && RUNS="$*"
RUNS=${RUNS:-"hicache-0.5s hicache-5s product-0.5s product-5s unconstrained-0.5s hicache-overload product-overload lru-0.5s"}
KV=${KV:-173200}
HICACHE_RATIO=${HICACHE_RATIO:-3}
OVERLOAD_RATIO=${OVERLOAD_RATIO:-1}
OVERLOAD_SESSIONS=${OVERLOAD_SESSIONS:-48}
TIME_LIMIT=${TIME_LIMIT:-300}
SERVE=${SERVE:-/tmp/kit/part01/serve.sh}
MODEL=${MODEL:-/tmp/qwen3-8b}
TOK_DIR=${TOK_DIR:-/tmp/qwen3-tok}
PORT=${PORT:-30000}
SIDECAR_PORT=${SIDECAR_PORT:-8000}
PRODUCT_CONFIG=${PRODUCT_CONFIG:-$REPO/configs/coding-agent.toml}
PLUGIN_CONFIG=${PLUGIN_CONFIG:-'{"max_leased_fraction": 0.8}'}
SIDECAR_ARGS=${SIDECAR_ARGS:-}
RUN_TAG=${RUN_TAG:-}
EXTRA_SGLANG_ARGS=${EXTRA_SGLANG_ARGS:-}
ENGINE=http://127.0.0.1:$PORT
PASS_THROUGH=(--policy-mode off --no-admission-enabled)

# shellcheck source=lib/sidecar.sh
source "$REPO/benchmarks/lib/sidecar.sh"
bench_setup "$REPO" "$OUT" matrix.log

TRACE=${TRACE:-$OUT/trace.jsonl}
OVERLOAD_TRACE=$OUT/trace-overload.jsonl
REAL_TRACES=$REPO/benchmarks/results/real-traces
LONG_CONTEXT=65536
[ -f "$TRACE" ] || run python3 -m sidecar_tools.benchmarks.traces generate --preset reference --out "$TRACE" >"$OUT/trace-stats.json"
fetch_tokenizer || exit 1

real_trace() {  # SOURCE OUT START_SPACING REPLICATE OFFSET: the simulator's replication, as a trace file
  [ -f "$2" ] && return 0
  echo "python3 -c <replicate $1 spacing=$3 x$4 offset=$5> >$2" >>"$CMDS"
  python3 - "$@" <<'PY'
import sys
from sidecar_tools.benchmarks.traces import load_jsonl, save_jsonl
src, out, spacing, copies, offset = sys.argv[1:6]
trace = load_jsonl(src)
if spacing:
    trace = trace.with_start_spacing(float(spacing))
trace = trace.replicated(int(copies), float(offset))
# the sidecar admits session ids of A-Z a-z 0-9 . _ : @ - only: copy k is <id>@r<k> here (<id>~r<k> in
# the simulator, which takes ids unchecked); same sessions, starts, lengths and gaps
sessions = [s.model_copy(update={"session_id": s.session_id.replace("~r", "@r")}) for s in trace.sessions]
save_jsonl(trace.model_copy(update={"sessions": sessions}), out)
PY
}

plugin_installed() {  # SGLang finds plugins through the sglang.srt.plugins entry point
  python3 -c 'import importlib.metadata as m, sys; sys.exit(not any(e.name == "session_ttl" for e in m.entry_points(group="sglang.srt.plugins")))'
}

run_limit() {  # seconds the next run may take: TIME_LIMIT, or less to end 30 s before DEADLINE (fails under MIN_RUN_S)
  local limit=$TIME_LIMIT
  if [ -n "${DEADLINE:-}" ]; then
    local left=$((DEADLINE - $(date +%s) - 30))
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  [ "$limit" -ge "${MIN_RUN_S:-60}" ] && echo "$limit"
}

ENGINE_FLAGS_UP=  # the flags the running SGLang was started with
RUN_TOTAL=$(wc -w <<<"$RUNS"); RUN_NUMBER=0
for spec in $RUNS; do
  RUN_NUMBER=$((RUN_NUMBER + 1))
  log "run $RUN_NUMBER/$RUN_TOTAL: $spec"
  config=${spec%%-*}; workload=${spec#*-}
  trace=$TRACE; gap=0.5; ratio=$HICACHE_RATIO; kv=$KV; context=()
  case $workload in
    0.5s) ;;
    5s) gap=5 ;;
    tracelab|tracelab-r1)
      [ "$workload" = tracelab-r1 ] && ratio=$OVERLOAD_RATIO
      trace=$OUT/trace-tracelab.jsonl; gap=
      real_trace "$REAL_TRACES/tracelab-examples.jsonl" "$trace" "" 7 20 || continue
      context=(--context-length "$LONG_CONTEXT") ;;
    miniswe)
      trace=$OUT/trace-miniswe.jsonl; gap=
      real_trace "$REAL_TRACES/lmcache-miniswe.jsonl" "$trace" 1 2 0.5 || continue
      context=(--context-length "$LONG_CONTEXT") ;;
    overload)
      ratio=$OVERLOAD_RATIO
      [ -f "$OVERLOAD_TRACE" ] || run python3 -m sidecar_tools.benchmarks.traces generate --preset reference \
        --sessions "$OVERLOAD_SESSIONS" --out "$OVERLOAD_TRACE" >"$OUT/trace-overload-stats.json"
      trace=$OVERLOAD_TRACE ;;
    *) log "unknown workload in $spec; skipped"; continue ;;
  esac
  hicache=(--enable-hierarchical-cache --hicache-ratio "$ratio")
  sidecar=("${PASS_THROUGH[@]}")
  case $config in
    lru) engine=() ;;
    hicache) engine=("${hicache[@]}") ;;
    product)
      engine=("${hicache[@]}" --radix-eviction-policy session_ttl --radix-eviction-policy-config "$PLUGIN_CONFIG")
      # shellcheck disable=SC2206
      sidecar=(--config "$PRODUCT_CONFIG" $SIDECAR_ARGS)
      plugin_installed || log "WARNING: no session_ttl entry point in SGLang's environment (gpu_session.sh setup)" ;;
    unconstrained) engine=(); kv=600000 ;;
    *) log "unknown config in $spec; skipped"; continue ;;
  esac
  [ -n "${CONTEXT_LENGTH:-}" ] && context=(--context-length "$CONTEXT_LENGTH")
  engine+=("${context[@]}")
  if [ ${#context[@]} -gt 0 ]; then export SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1; fi
  flags="--max-total-tokens $kv ${engine[*]} $EXTRA_SGLANG_ARGS"
  if [ "$flags" != "$ENGINE_FLAGS_UP" ]; then
    log "serve: $flags"
    echo "MODEL=$MODEL PORT=$PORT bash $(quoted "$SERVE" --max-total-tokens "$kv" "${engine[@]}") $EXTRA_SGLANG_ARGS" >>"$CMDS"
    # shellcheck disable=SC2086
    if ! MODEL=$MODEL PORT=$PORT bash "$SERVE" --max-total-tokens "$kv" "${engine[@]}" $EXTRA_SGLANG_ARGS; then
      log "SGLang did not start for $spec; skipped"; ENGINE_FLAGS_UP=
      cp "/tmp/sglang-$PORT.log" "$OUT/logs/sglang-$spec.log" 2>/dev/null; continue
    fi
    ENGINE_FLAGS_UP=$flags
  fi
  name=$spec$RUN_TAG
  # a fresh sidecar per run: what its predictor learned in one run must not carry into the next
  start_sidecar "$name" "${sidecar[@]}" || continue
  log "run $name"
  log_from=$(($(wc -l <"/tmp/sglang-$PORT.log" 2>/dev/null || echo 0) + 1))
  gap_flags=(); [ -n "$gap" ] && gap_flags=(--tool-wait "$gap")  # real traces: recorded gaps
  limit=$(run_limit) || { log "no time left before DEADLINE for $name; skipped"; stop_sidecar; continue; }
  grace=120; [ -n "${DEADLINE:-}" ] && grace=20  # a replay past its limit cancels its turns and writes its JSON
  [ "$limit" -lt "$TIME_LIMIT" ] && log "$name gets $limit s (DEADLINE)"
  run timeout $((limit + grace)) python3 -m sidecar_tools.benchmarks.replay --mode openai \
    --url "http://127.0.0.1:$SIDECAR_PORT" --engine-url "$ENGINE" --tokenizer "$TOK_DIR" \
    --trace "$trace" "${gap_flags[@]}" --time-limit "$limit" --close-sessions --flush-cache \
    --salt "$name" --name "$name" --out "$OUT" 2>&1 | tee -a "$OUT/logs/matrix.log"
  # this run's part of SGLang's log, and the engine timeline made from it
  tail -n "+$log_from" "/tmp/sglang-$PORT.log" >"$OUT/logs/sglang-run-$name.log" 2>/dev/null
  run python3 -m sidecar_tools.benchmarks.engine_timeline "$OUT/logs/sglang-run-$name.log" \
    --md "$OUT/engine-timeline-$name.md" --png "$OUT/engine-timeline-$name.png" --title "$name" \
    >>"$OUT/logs/matrix.log" 2>&1 || log "no engine timeline for $name (no scheduler lines in SGLang's log)"
  curl -s "127.0.0.1:$SIDECAR_PORT/metrics" >"$OUT/logs/sidecar-metrics-$name.txt"
  curl -s "$ENGINE/metrics" >"$OUT/logs/engine-metrics-$name.txt"
  stop_sidecar
  cp "/tmp/sglang-$PORT.log" "$OUT/logs/sglang-$config-$workload.log" 2>/dev/null
done
stop_engine

# One table + plot per workload (speed-up against stock HiCache there), and one over everything.
for workload in 0.5s 5s overload tracelab miniswe tracelab-r1; do
  ls "$OUT"/*-"$workload"$RUN_TAG.json >/dev/null 2>&1 || continue
  run python3 -m sidecar_tools.benchmarks.report "$OUT"/*-"$workload"$RUN_TAG.json --baseline "hicache-$workload$RUN_TAG" \
    --md "$OUT/table-$workload.md" --png "$OUT/plot-$workload.png" \
    --title "agent-trace replay, $workload, GPU KV $KV tokens" | tee -a "$OUT/logs/matrix.log"
done
