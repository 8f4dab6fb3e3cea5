#!/usr/bin/env bash
# The side-by-side benchmark recorded in docs/benchmark.md: sync, sync+proportional, local, sma,
# adaptive, hogbatch and adaptive_hogbatch on the same data and seed, with and without a 2x
# slowed rank, then the merge cost. Prints the table; writes runs/bench/bench.txt and
# runs/bench/report.png.
#   bash launch/bench.sh                          # about 12 minutes a repeat on 2 cores
#   REPEATS=3 bash launch/bench.sh --algorithms sync adaptive
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${HVD_ADAPTIVE_VENV:-$REPO/.venv}
OUT=${OUT:-runs/bench}
cd "$REPO"
"$VENV/bin/python" -m hvd_adaptive.bench --config "${CONFIG:-configs/bench.yaml}" \
  --repeats "${REPEATS:-1}" --out "$OUT" "$@"
"$VENV/bin/hvd-adaptive" report "$OUT"/*/ --out "$OUT/report.png"
