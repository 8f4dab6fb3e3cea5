#!/usr/bin/env bash
# The fair side-by-side benchmark recorded in docs/benchmark.md: sync, sync with the
# re-measured proportional partition, local SGD and adaptive SGD on the same data, seed and
# heterogeneity, without and with rank 1 slowed 2x. Prints the table (medians of REPEATS, ratios
# against sync); writes $OUT/bench.txt and one figure per scenario.
#   bash launch/bench.sh                       # 67,009 labels, 3 repeats: about 40 minutes here
#   bash launch/bench.sh --quick               # 13,402 labels (configs/bench_quick.yaml): ~10 minutes
#   OUT=runs/bench-quota REPEATS=1 bash launch/bench.sh --scenarios quota   # a real cgroup CPU quota
#   bash launch/bench.sh --algorithms sync adaptive --variant "w1k=train.algorithm=adaptive,train.window_samples=1024"
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${HVD_ADAPTIVE_VENV:-$REPO/.venv}
CONFIG=${CONFIG:-configs/bench.yaml}
OUT=${OUT:-runs/bench}
args=()
for a in "$@"; do
  if [ "$a" = --quick ]; then CONFIG=configs/bench_quick.yaml; OUT=${OUT%/}-quick; else args+=("$a"); fi
done
cd "$REPO"
"$VENV/bin/python" -m hvd_adaptive.bench --config "$CONFIG" --repeats "${REPEATS:-3}" --out "$OUT" "${args[@]}"
# One figure per scenario, first repeat only (all repeats would bury the curves).
for scen in even slowed quota; do
  ls -d "$OUT"/$scen-*-r0/ >/dev/null 2>&1 || continue
  "$VENV/bin/hvd-adaptive" report "$OUT"/$scen-*-r0/ --target "$(cat "$OUT/target.txt")" \
    --out "$OUT/report-$scen.png"
done
