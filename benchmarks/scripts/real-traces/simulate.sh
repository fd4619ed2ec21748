#!/usr/bin/env bash
# The simulator table of the real traces (no GPU, ~10 min on 2 cores): every row + sim/table.md.
#   bash benchmarks/scripts/real-traces/simulate.sh [--jobs N] [--no-hicache] [--only ROW ...]
# See simulate.py for the workloads, the budget and the rows.
set -euo pipefail
cd "$(dirname "$0")/../../.."
exec python3 benchmarks/scripts/real-traces/simulate.py "$@"
