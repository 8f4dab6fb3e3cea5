#!/usr/bin/env bash
# The side-by-side benchmark recorded in docs/benchmark.md: sync, sync+proportional, local, sma,
# adaptive, hogbatch and adaptive_hogbatch on the same data and seed, with and without a 2x
# slowed rank, then the merge cost. Prints the table; writes runs/bench/bench.txt and
# runs/bench/report-even.png and report-slowed.png.
#   bash launch/bench.sh                          # about 7-8 minutes a repeat on 2 cores
#   REPEATS=3 bash launch/bench.sh --algorithms sync adaptive
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${HVD_ADAPTIVE_VENV:-$REPO/.venv}
OUT=${OUT:-runs/bench}
cd "$REPO"
"$VENV/bin/python" -m hvd_adaptive.bench --config "${CONFIG:-configs/bench.yaml}" \
  --repeats "${REPEATS:-1}" --out "$OUT" "$@"
# One figure per scenario, first repeat only (all repeats would bury the curves).
for scen in even slowed; do
  "$VENV/bin/hvd-adaptive" report "$OUT"/$scen-*-r0/ --out "$OUT/report-$scen.png"
done
