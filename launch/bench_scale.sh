#!/usr/bin/env bash
# Full-scale measurements recorded in docs/scale.md (one at a time; nothing else should run).
#   bash launch/bench_scale.sh data           # generate + cache the full Amazon-670K and
#                                             # Delicious-200K shapes: seconds, cached load, peak memory
#   bash launch/bench_scale.sh train [BUDGET] # Amazon-670K shape, 2 ranks, sampled output layer:
#                                             # adaptive and sync for BUDGET training seconds (default 1 epoch)
#   bash launch/bench_scale.sh sampled        # 67,009 labels: sampled vs full softmax (sync, 2 ranks),
#                                             # time per epoch and P@1, via the side-by-side benchmark
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${HVD_ADAPTIVE_VENV:-$REPO/.venv}
OUT=${OUT:-runs/scale}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 TF_CPP_MIN_LOG_LEVEL=2
cd "$REPO"
mkdir -p "$OUT"
case "${1:-}" in
  data)
    for p in amazon670k delicious200k; do
      for pass in generate cached; do
        "$VENV/bin/python" - "$p" "$pass" <<'PY'
import resource, sys, time
from hvd_adaptive.data import preset, synthesize_cached
name, what = sys.argv[1], sys.argv[2]
t = time.perf_counter()
train, test = synthesize_cached(preset(name, scale=1.0), "data/cache")
s = time.perf_counter() - t
print(f"{name} {what}: {train.n_rows:,} + {test.n_rows:,} rows, {len(train.indices) + len(test.indices):,} "
      f"non-zeros, {train.n_labels:,} labels: {s:.2f} s, peak memory "
      f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB", flush=True)
PY
      done
    done | tee "$OUT/data.txt" ;;
  train)
    budget=${2:-}
    extra=(); [ -n "$budget" ] && extra=(--set "train.time_budget_s=$budget")
    for algo in adaptive sync; do
      mpirun -np 2 --bind-to none "$VENV/bin/hvd-adaptive" train --config configs/amazon670k_synth.yaml \
        --run-dir "$OUT/670k-$algo" --set "train.algorithm=$algo" "${extra[@]}"
    done
    "$VENV/bin/python" - "$OUT" <<'PY' | tee "$OUT/train.txt"
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
print("| algorithm | epochs | train s | s per epoch | P@1 | merge MB/window (dense) | comm s/window | peak RSS MB/rank |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for algo in ("adaptive", "sync"):
    d = out / f"670k-{algo}"
    s = json.loads((d / "summary.json").read_text())
    rounds = [json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines()]
    rounds = [r for r in rounds if r["event"] == "round"]
    mb = [r["ranks"][0].get("merge_mb", 0.0) for r in rounds]
    full = rounds[-1]["ranks"][0].get("merge_full_mb", 0.0)
    comm = [max(x["comm_s"] for x in r["ranks"]) for r in rounds]
    ep = s["final"]["epoch"]
    print(f"| {algo} | {ep:.2f} | {s['train_wall_s']:.1f} | {s['train_wall_s'] / ep:.1f} | "
          f"{s['final']['p_at_1']:.4f} | {statistics.median(mb):.1f} ({full:.0f}) | {statistics.median(comm):.2f} | "
          + "/".join(f"{r['peak_rss_mb']:.0f}" for r in s["per_rank"]) + " |")
PY
    ;;
  sampled)
    "$VENV/bin/python" -m hvd_adaptive.bench --config configs/bench.yaml --repeats "${REPEATS:-1}" \
      --out "$OUT/sampled" --scenarios even --algorithms sync \
      --variant "sync_sampled=train.algorithm=sync,model.output=sampled,model.negatives=4096" ;;
  *) echo "usage: bash launch/bench_scale.sh data | train [BUDGET_S] | sampled" >&2; exit 2 ;;
esac
