#!/usr/bin/env bash
# Stand-in for the GPU kit's serve.sh: (re)start `sglang-sidecar simulate --serve` on
# 127.0.0.1:${PORT:-30000} with the SGLang flags translated, and wait until /health answers.
# Lets run_matrix.sh be dry-run on any machine (SERVE=benchmarks/sim_serve.sh) before GPU time is
# spent on it; timings are the simulator's, not an engine's. Translated: --max-total-tokens,
# --radix-eviction-policy(-config), --enable-session-radix-cache, and the host tier
# (--enable-hierarchical-cache, --hicache-ratio, --hicache-size, --hicache-write-policy).
# Other SGLang flags are ignored.
set -uo pipefail
port=${PORT:-30000}; log=/tmp/sglang-$port.log; pidfile=/tmp/sglang-$port.pid
args=()
while [ $# -gt 0 ]; do
  case $1 in
    --max-total-tokens) args+=(--kv-tokens "$2"); shift 2 ;;
    --radix-eviction-policy) args+=(--policy "$2"); shift 2 ;;
    --radix-eviction-policy-config) args+=(--policy-config "$2"); shift 2 ;;
    --enable-session-radix-cache) args+=(--session-radix-cache); shift ;;
    --enable-hierarchical-cache|--enable-hicache) args+=(--enable-hierarchical-cache); shift ;;
    --hicache-ratio|--hicache-size|--hicache-write-policy) args+=("$1" "$2"); shift 2 ;;
    *) shift ;;
  esac
done
if [ -f "$pidfile" ]; then kill -- "-$(cat "$pidfile")" 2>/dev/null; sleep 1; fi
setsid python3 -m sidecar simulate --serve --port "$port" "${args[@]}" >"$log" 2>&1 </dev/null &
echo $! >"$pidfile"
for _ in $(seq 120); do
  curl -sf "127.0.0.1:$port/health" >/dev/null && { echo "simulated SGLang up on port $port: ${args[*]}"; exit 0; }
  kill -0 "$(cat "$pidfile")" 2>/dev/null || break
  sleep 1
done
echo "simulated SGLang did not start; last lines of $log:"; tail -20 "$log"; exit 1
