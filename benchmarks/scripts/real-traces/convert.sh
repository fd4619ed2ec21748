#!/usr/bin/env bash
# Converts the public recorded traces into agent-trace-v1 and replays their gaps (no GPU, ~30 s).
#   bash benchmarks/scripts/real-traces/convert.sh TRACELAB_GIT_DIR LMCACHE_GIT_DIR
# Each argument is a clone (or a bare mirror) of github.com/uw-syfi/TraceLab and
# github.com/LMCache/lmcache-agent-trace; the files are read at the pinned commits below.
set -euo pipefail
TRACELAB=$(realpath "$1")
LMCACHE=$(realpath "$2")
TRACELAB_COMMIT=0b8a262ba69602869133b65972d51a388bde45e1
LMCACHE_COMMIT=16a14adaad43e1a7213f17277726e0abb66ece11
cd "$(dirname "$0")/../../.."
OUT=benchmarks/results/real-traces
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

git -C "$TRACELAB" show "$TRACELAB_COMMIT:example_sessions/derived/round_trace.jsonl" > "$TMP/round_trace.jsonl"
for f in $(git -C "$LMCACHE" ls-tree --name-only "$LMCACHE_COMMIT" miniswe/ | grep '\.jsonl$'); do
  git -C "$LMCACHE" show "$LMCACHE_COMMIT:$f"
done > "$TMP/miniswe.jsonl"

CONVERT="python -m sidecar_tools.benchmarks.traces convert"
# The two TraceLab sessions were recorded 72 days apart: start them together.
$CONVERT "$TMP/round_trace.jsonl" --name tracelab-examples --start-spacing 0 \
    --source-label "github.com/uw-syfi/TraceLab@$TRACELAB_COMMIT:example_sessions/derived/round_trace.jsonl" \
    --out $OUT/tracelab-examples.jsonl > $OUT/tracelab-examples-stats.json
# mini-swe-agent on SWE-bench: 20 sessions as recorded (one after the other), Qwen3 token counts.
$CONVERT "$TMP/miniswe.jsonl" --name lmcache-miniswe --tokenizer qwen3 \
    --source-label "github.com/LMCache/lmcache-agent-trace@$LMCACHE_COMMIT:miniswe/*.jsonl" \
    --out $OUT/lmcache-miniswe.jsonl > $OUT/lmcache-miniswe-stats.json

GR="python -m sidecar gap-replay"  # = sglang-sidecar gap-replay
SWEEP="--fixed-ttl 2 --fixed-ttl 10 --fixed-ttl 30 --fixed-ttl 120 --fixed-ttl 300"
for name in tracelab-examples lmcache-miniswe; do
  { echo "\$ sglang-sidecar gap-replay $OUT/$name.jsonl --config configs/coding-agent.toml $SWEEP"; echo
    $GR $OUT/$name.jsonl --config configs/coding-agent.toml $SWEEP --json-out $OUT/$name-gap-replay.json
  } > $OUT/$name-gap-replay.txt
done
