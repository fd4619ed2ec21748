#!/usr/bin/env bash
# The sidecar's CPU per turn beside a bare Python relay and smg 1.13, one command (issue 28.4):
# 256 agents x ~20K-token histories, 500 agents, and 50 / 250 / 500 / 2,000 open sessions, each
# three times with the three proxies interleaved. About 35 min at --duration 15 (54 phases of
# ~40 s on the 2-vCPU box), ~55 min at the default 30. Run it on an otherwise idle machine
# (see `uptime`); results: benchmarks/results/load/cost/proxy-cost.{json,md,png}.
#   benchmarks/scripts/load/proxy_cost.sh [--duration 30] [--reps 3] [--only long-256,open-50,...]
set -euo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
out=benchmarks/results/load/cost
mkdir -p "$out"
uptime | tee "$out/uptime-before.txt"
python3 -m sidecar_tools.benchmarks.proxy_cost --out "$out" "$@"
uptime | tee "$out/uptime-after.txt"
