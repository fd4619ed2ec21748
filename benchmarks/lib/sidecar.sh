# Sourced by the GPU benchmark scripts (benchmarks/run_matrix.sh, benchmarks/capacity_gpu.sh): the
# steps they share, written once. Not a script of its own.
#
#   source "$REPO/benchmarks/lib/sidecar.sh"
#   bench_setup "$REPO" "$OUT" matrix.log   # OUT made absolute, OUT/logs/, CMDS, the kit's env, cd REPO
#   run CMD...                  # record CMD (shell-quoted) in OUT/commands.txt, then run it
#   log TEXT...                 # timestamped, to stdout and OUT/logs/LOG_NAME
#   start_sidecar NAME FLAGS... # a fresh `python3 -m sidecar serve` in front of SGLang, up or an error
#   stop_sidecar; stop_engine   # both run on exit (bench_setup sets the trap)
#
# Reads ENGINE (SGLang's URL), PORT (SGLang's port: /tmp/sglang-PORT.pid from the kit's serve.sh),
# SIDECAR_PORT and TOK_DIR; the sidecar's log goes to OUT/logs/sidecar-NAME.log.

quoted() { printf "%q " "$@"; }

log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/logs/$LOG_NAME"; }

run() { echo "$(quoted "$@")" >>"$CMDS"; "$@"; }

bench_setup() {  # REPO OUT LOG_NAME
  mkdir -p "$2/logs" || exit 1
  OUT=$(cd "$2" && pwd)
  CMDS=$OUT/commands.txt
  LOG_NAME=$3
  # shellcheck disable=SC1091
  [ -f /tmp/sglang-env.sh ] && source /tmp/sglang-env.sh
  export PYTHONPATH="$1${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
  cd "$1" || exit 1
  trap 'stop_sidecar; stop_engine' EXIT
}

fetch_tokenizer() {  # the Qwen3 tokenizer folder the sidecar loads, built once into TOK_DIR
  [ -f "$TOK_DIR/tokenizer.json" ] || run python3 -m sidecar_tools.benchmarks.qwen3_tokenizer "$TOK_DIR"
}

SIDECAR_PID=
stop_sidecar() {
  [ -n "$SIDECAR_PID" ] || return 0
  kill "$SIDECAR_PID" 2>/dev/null; wait "$SIDECAR_PID" 2>/dev/null; SIDECAR_PID=
}

start_sidecar() {  # NAME SIDECAR_FLAGS...
  local name=$1; shift
  local cmd=(python3 -m sidecar serve --sglang-url "$ENGINE" --port "$SIDECAR_PORT" --tokenizer "$TOK_DIR" "$@")
  echo "$(quoted "${cmd[@]}")&" >>"$CMDS"
  "${cmd[@]}" >"$OUT/logs/sidecar-$name.log" 2>&1 &
  SIDECAR_PID=$!
  for _ in $(seq "${SIDECAR_WAIT_S:-90}"); do
    curl -sf -o /dev/null "http://127.0.0.1:$SIDECAR_PORT/health" && return 0
    kill -0 "$SIDECAR_PID" 2>/dev/null || break
    sleep 1
  done
  log "sidecar did not come up; last lines:"; tail -20 "$OUT/logs/sidecar-$name.log"
  stop_sidecar; return 1
}

stop_engine() { [ -f "/tmp/sglang-$PORT.pid" ] && kill -- "-$(cat "/tmp/sglang-$PORT.pid")" 2>/dev/null; }
