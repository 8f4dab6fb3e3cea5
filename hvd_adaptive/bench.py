"""Side-by-side benchmark: every algorithm on the same data and seed, with and without a slowed rank.

Usage:
  bash launch/bench.sh                                  # the recorded benchmark (docs/benchmark.md)
  python -m hvd_adaptive.bench --config configs/bench.yaml --ranks 2 --slowdown 2.0 \
      --algorithms sync sync_prop local sma adaptive hogbatch adaptive_hogbatch --out runs/bench

Each contender is a separate `mpirun -np N hvd-adaptive train` run into its own folder, one after
the other, so they share the machine's state as fairly as a shared machine allows. The table
gives time to a target P@1 (training seconds, evaluation excluded), P@1 reached within a fixed
time budget, cluster efficiency, and the time-to-target ratio of `sync` over each algorithm
(> 1: faster than sync), and for hogbatch the share of updates made by the CPU worker (in the
slowed scenario the slowed rank stands in for the CPU). `--repeats` runs everything several
times and reports medians.
A second part times the merge: the weighted allreduce against a plain Horovod allreduce of the
same tensors.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

# name -> config overrides; "sync_prop" is sync with LB-BSP's proportional partition.
CONTENDERS = {
    "sync": ["train.algorithm=sync"],
    "sync_prop": ["train.algorithm=sync", "sync.partition=proportional"],
    "local": ["train.algorithm=local"],
    "sma": ["train.algorithm=sma"],
    "adaptive": ["train.algorithm=adaptive"],
    "hogbatch": ["train.algorithm=hogbatch"],
    "adaptive_hogbatch": ["train.algorithm=adaptive_hogbatch"],
}


def mpi_command(ranks: int, args: list[str]) -> tuple[list[str], dict]:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               TF_CPP_MIN_LOG_LEVEL="2")
    return ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none",
            sys.executable, *args], env


def run_one(config: str, ranks: int, sets: list[str], run_dir: Path) -> dict:
    """Trains one contender; returns its summary and eval records."""
    args = ["-m", "hvd_adaptive.cli", "train", "--config", config, "--run-dir", str(run_dir)]
    for s in sets:
        args += ["--set", s]
    cmd, env = mpi_command(ranks, args)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{run_dir.name} failed (exit {p.returncode}):\n{p.stderr[-2000:]}")
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"summary": json.loads((run_dir / "summary.json").read_text()),
            "evals": [r for r in recs if r["event"] == "eval"]}


def time_to(evals: list[dict], target: float) -> float | None:
    """Training seconds of the first evaluation reaching the target P@1 (None: never)."""
    return next((e["wall_s"] for e in evals if e["p_at_1"] >= target), None)


def p1_within(evals: list[dict], budget: float) -> float:
    """Best P@1 among evaluations done within the time budget."""
    return max((e["p_at_1"] for e in evals if e["wall_s"] <= budget), default=0.0)


def _median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def table(results: dict, target: float, budget: float) -> str:
    """Formats {scenario: {algorithm: [run, ...]}} as the benchmark's table (medians)."""
    lines = []
    for scenario, algos in results.items():
        lines.append(f"\n{scenario}  (target P@1 {target:.3f}, budget {budget:.0f} s; medians over "
                     f"{max(len(v) for v in algos.values())} repeat(s))")
        lines.append(f"{'algorithm':<18} {'t->target s':>11} {'P@1@budget':>10} {'final P@1':>9} "
                     f"{'train s':>8} {'effic.':>6} {'sync/this':>9} {'CPU upd.':>8}")
        ref = _median([time_to(r["evals"], target) for r in algos.get("sync", [])])
        for name, runs in algos.items():
            tt = _median([time_to(r["evals"], target) for r in runs])
            pb = _median([p1_within(r["evals"], budget) for r in runs])
            fin = _median([r["summary"]["final"]["p_at_1"] for r in runs])
            wall = _median([r["summary"]["train_wall_s"] for r in runs])
            eff = _median([r["summary"]["efficiency"] for r in runs])
            ratio = f"{ref / tt:9.2f}" if tt and ref else f"{'-':>9}"
            share = _median([r["summary"]["algorithm_state"].get("cpu_update_share") for r in runs])
            share = f"{share:8.2f}" if share is not None else f"{'-':>8}"
            lines.append(f"{name:<18} {tt if tt is None else round(tt, 1)!s:>11} {pb:10.4f} {fin:9.4f} "
                         f"{wall:8.1f} {eff:6.2f} {ratio} {share}")
    return "\n".join(lines)


def merge_benchmark(ranks: int, config: str, repeats: int) -> str:
    """Weighted allreduce vs plain Horovod allreduce of the model's tensors (parallel run)."""
    cmd, env = mpi_command(ranks, ["-m", "hvd_adaptive.bench_merge", "--config", config,
                                   "--repeats", str(repeats)])
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"merge benchmark failed:\n{p.stderr[-2000:]}")
    return p.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/bench.yaml")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--slowdown", type=float, default=2.0, help="factor of the slowed rank (last rank)")
    ap.add_argument("--algorithms", nargs="+", default=list(CONTENDERS),
                    choices=sorted(CONTENDERS))
    ap.add_argument("--scenarios", nargs="+", default=["even", "slowed"], choices=["even", "slowed"])
    ap.add_argument("--target", type=float, default=None,
                    help="P@1 target (default: 90%% of sync's final P@1 in the even scenario)")
    ap.add_argument("--budget", type=float, default=None,
                    help="time budget in s for P@1@budget (default: half of sync's even training time)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--merge-repeats", type=int, default=20)
    ap.add_argument("--set", action="append", default=[], help="extra overrides for every run")
    ap.add_argument("--out", default="runs/bench")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    slow = [f"hetero.slowdown={{{a.ranks - 1}: {a.slowdown}}}"]
    results: dict = {}
    t0 = time.time()
    for rep in range(a.repeats):
        for scen in a.scenarios:
            label = "no slowdown" if scen == "even" else f"rank {a.ranks - 1} slowed {a.slowdown}x"
            for name in a.algorithms:
                sets = CONTENDERS[name] + a.set + (slow if scen == "slowed" else [])
                if scen == "slowed" and "hogbatch" in name:
                    # the slowed rank stands in for the CPU worker (small batches), as in the paper
                    sets.append(f"hogbatch.cpu_ranks=[{a.ranks - 1}]")
                run_dir = out / f"{scen}-{name}-r{rep}"
                print(f"[bench {time.time() - t0:6.0f} s] {label}: {name} (repeat {rep + 1}/{a.repeats})",
                      flush=True)
                res = run_one(a.config, a.ranks, sets, run_dir)
                results.setdefault(label, {}).setdefault(name, []).append(res)
    first = next(iter(results.values()))
    ref = first.get("sync") or next(iter(first.values()))
    target = a.target or 0.9 * _median([r["summary"]["final"]["p_at_1"] for r in ref])
    budget = a.budget or 0.5 * _median([r["summary"]["train_wall_s"] for r in ref])
    report = table(results, target, budget)
    merge = merge_benchmark(a.ranks, a.config, a.merge_repeats)
    text = (f"benchmark: {a.config}, {a.ranks} ranks, overrides {a.set or 'none'}\n{report}\n\n{merge}\n")
    print(text)
    (out / "bench.txt").write_text(text)
    print(f"runs in {out}/; plot with: hvd-adaptive report {out}/* --out {out}/report.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
