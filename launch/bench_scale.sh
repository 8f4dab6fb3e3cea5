#!/usr/bin/env bash
# Full-scale measurements recorded in docs/scale.md (one at a time; nothing else should run).
#   bash launch/bench_scale.sh data           # generate + cache the full Amazon-670K and
#                                             # Delicious-200K shapes: seconds, cached load, peak memory
#   bash launch/bench_scale.sh train [BUDGET] [SHAPE]
#                                             # SHAPE 670k (default) or 200k (Delicious-200K), 2 ranks,
#                                             # sampled output layer: adaptive and sync for BUDGET
#                                             # training seconds ("" or 0: 1 epoch)
#   bash launch/bench_scale.sh sampled        # 67,009 labels: sampled vs full softmax (sync, 2 ranks),
#                                             # time per epoch and P@1 after 1.5 epochs (REPEATS, default 1)
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
    shape=${3:-670k}
    case "$shape" in
      670k) config=configs/amazon670k_synth.yaml ;;
      200k) config=configs/delicious200k_synth.yaml ;;
      *) echo "bench_scale.sh: unknown shape '$shape' (670k or 200k)" >&2; exit 2 ;;
    esac
    extra=(); [ -n "$budget" ] && [ "$budget" != 0 ] && extra=(--set "train.time_budget_s=$budget")
    for algo in adaptive sync; do
      rm -rf "$OUT/$shape-$algo"  # a new run, not appended to an old one's records
      mpirun -np 2 --bind-to none "$VENV/bin/hvd-adaptive" train --config "$config" \
        --run-dir "$OUT/$shape-$algo" --set "train.algorithm=$algo" "${extra[@]}"
    done
    "$VENV/bin/python" - "$OUT" "$shape" <<'PY' | tee "$OUT/train-$shape.txt"
import json, statistics, sys
from pathlib import Path
out, shape = Path(sys.argv[1]), sys.argv[2]
print("| algorithm | epochs | train s | s per epoch | P@1 | merge MB/window (dense) | comm s/window | peak RSS MB/rank |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for algo in ("adaptive", "sync"):
    d = out / f"{shape}-{algo}"
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
    # Same data (configs/bench.yaml: 67,009 labels), seed, algorithm (sync, equal ranks), epochs
    # and clock; only the output layer differs. Alternating order per repeat.
    for r in $(seq 0 $(( ${REPEATS:-1} - 1 ))); do
      for out in full sampled; do
        mpirun -np 2 --bind-to none "$VENV/bin/hvd-adaptive" train --config configs/bench.yaml \
          --run-dir "$OUT/67k-$out-r$r" --set "model.output=$out" --set model.negatives=4096 \
          --set train.eval_every=0.25 --set train.epochs=1.5
      done
    done
    "$VENV/bin/python" - "$OUT" <<'PY' | tee "$OUT/sampled.txt"
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = {}
for kind in ("full", "sampled"):
    runs = [json.loads((d / "summary.json").read_text()) for d in sorted(out.glob(f"67k-{kind}-r*"))]
    per_epoch = statistics.median(s["train_wall_s"] / s["final"]["epoch"] for s in runs)
    p1 = statistics.median(s["final"]["p_at_1"] for s in runs)
    best = statistics.median(s["best_p_at_1"] for s in runs)
    rows[kind] = (per_epoch, p1, best, len(runs))
print("| output layer | s per epoch | final P@1 | best P@1 | runs |")
print("| --- | --- | --- | --- | --- |")
for kind, (e, p1, best, n) in rows.items():
    print(f"| {kind} | {e:.1f} | {p1:.4f} | {best:.4f} | {n} |")
f, s = rows["full"], rows["sampled"]
print(f"sampled: {f[0] / s[0]:.2f}x faster per epoch, final P@1 {100 * (s[1] - f[1]):+.1f} points")
PY
    ;;
  *) echo "usage: bash launch/bench_scale.sh data | train [BUDGET_S] [670k|200k] | sampled" >&2; exit 2 ;;
esac
