"""Side-by-side benchmark: every contender on the same data, seed and heterogeneity.

Usage:
  bash launch/bench.sh                   # 67,009 labels, 3 repeats (docs/benchmark.md)
  bash launch/bench.sh --quick           # 13,402 labels, the quick mode
  python -m hvd_adaptive.bench --config configs/bench.yaml --repeats 3 \
      --algorithms sync sync_prop adaptive --scenarios even slowed quota --out runs/bench
  python -m hvd_adaptive.bench ... --variant "adaptive_w1024=train.algorithm=adaptive,train.window_samples=1024"

Fairness: each contender is its own `mpirun -np N hvd-adaptive train` run, one after the other
and interleaved per repeat, on the same synthetic data and seed, with the same heterogeneity
(`hetero.slowdown` of the last rank: in sleep mode it multiplies only local computation, the
same span in every algorithm; the `quota` scenario slows the rank's whole process through a
cgroup CPU quota), and the same clock (training seconds on rank 0, evaluation excluded).
Contenders whose defaults are not their own carry their tuned settings in CONTENDERS.

The target P@1 is 90% of sync's final P@1 in the first even run (or --target); later runs stop
once they reach it. Time and samples to target are interpolated linearly between evaluations
(every `train.eval_every` epochs). Columns: time to target; samples to target (statistical
efficiency); samples per second up to then (hardware efficiency); cluster efficiency (rows/s
over the sum of the ranks' standalone rows/s); where the ranks' time went; sync's time to
target over the contender's (> 1: sooner than sync). Medians over repeats.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from hvd_adaptive.algorithms import ALGORITHMS
from hvd_adaptive.report import align, time_to_target
from hvd_adaptive.run import mpirun_command

# name -> config overrides: every algorithm with its defaults, and named variants of them.
CONTENDERS = {
    **{name: [f"train.algorithm={name}"] for name in ALGORITHMS},
    # sync with LB-BSP's partition re-measured every window
    "sync_prop": ["train.algorithm=sync", "sync.partition=proportional"],
    # adaptive SGD as published: per-rank optimizer state, plain weighted average, lr ~ batch
    "adaptive_paper": ["train.algorithm=adaptive", "adaptive.opt_state=local",
                       "adaptive.row_norm=false", "adaptive.lr_scaling=linear"],
}
SCENARIOS = ("even", "slowed", "quota")
PARTS = ("batch_s", "compute_s", "comm_s", "sync_s", "wait_s")


def run_one(config: str, ranks: int, sets: list[str], run_dir: Path) -> dict:
    """Trains one contender; returns its summary and eval records."""
    args = ["-m", "hvd_adaptive.cli", "train", "--config", config, "--run-dir", str(run_dir)]
    for s in sets:
        args += ["--set", s]
    cmd, env = mpirun_command(ranks, args)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{run_dir.name} failed (exit {p.returncode}):\n{p.stderr[-2000:]}")
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"summary": json.loads((run_dir / "summary.json").read_text()),
            "evals": [r for r in recs if r["event"] == "eval"]}


def measures(run: dict, target: float) -> dict:
    """One run's figures: time and samples to target, rates, efficiency, time breakdown."""
    s = run["summary"]
    t = time_to_target(run["evals"], target)
    n = time_to_target(run["evals"], target, key="samples")
    totals = {k: sum(r.get(k, 0.0) for r in s["per_rank"]) for k in PARTS}
    spent = sum(totals.values()) or 1.0
    return {"t": t, "samples": n, "rate": n / t if t and n else None,
            "eff": s["efficiency"], "final": s["final"]["p_at_1"],
            **{k: totals[k] / spent for k in PARTS}}


def _median(xs: list) -> Optional[float]:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


# (header, measure, format) of the table's columns after the contender's name
COLUMNS = (("s->target", "t", "{:.1f}"), ("rows->tgt", "samples", "{:.0f}"),
           ("rows/s", "rate", "{:.0f}"), ("effic.", "eff", "{:.2f}"), ("sync/this", "ratio", "{:.2f}"),
           ("compute", "compute_s", "{:.2f}"), ("comm", "comm_s", "{:.2f}"),
           ("allgat", "sync_s", "{:.2f}"), ("wait", "wait_s", "{:.2f}"), ("batch", "batch_s", "{:.2f}"))


def table(results: dict, target: float) -> str:
    """Formats {scenario: {contender: [run, ...]}} as the benchmark's table (medians)."""
    lines = []
    for scenario, algos in results.items():
        reps = max(len(v) for v in algos.values())
        lines.append(f"\n{scenario}  (target P@1 {target:.4f}; medians over {reps} repeat(s); "
                     "time shares of all ranks)")
        m = {name: [measures(r, target) for r in runs] for name, runs in algos.items()}
        ref = _median([x["t"] for x in m.get("sync", [])])
        cells = [["contender", *(h for h, _, _ in COLUMNS)]]
        for name, ms in m.items():
            med = {k: _median([x[k] for x in ms]) for k in ms[0]}
            med["ratio"] = ref / med["t"] if ref and med["t"] else None
            cells.append([name, *("-" if med[k] is None else fmt.format(med[k]) for _, k, fmt in COLUMNS)])
        lines.append(align(cells, text_columns=1))
    return "\n".join(lines)


def scenario_sets(scen: str, ranks: int, slowdown: float) -> tuple[str, list[str]]:
    """A scenario's label and overrides (the last rank is the slowed one)."""
    slow = f"hetero.slowdown={{{ranks - 1}: {slowdown}}}"
    if scen == "even":
        return "no slowdown", []
    if scen == "slowed":
        return f"rank {ranks - 1} slowed {slowdown:g}x (sleep: local computation only)", [slow]
    return f"rank {ranks - 1} slowed {slowdown:g}x (cgroup CPU quota: whole process)", \
        [slow, "hetero.mode=cpu_quota"]


def parse_variants(items: list[str]) -> dict:
    """--variant NAME=key=value,key=value -> {NAME: [overrides]}."""
    out = {}
    for item in items:
        name, _, sets = item.partition("=")
        if not name or not sets:
            raise SystemExit(f"--variant {item!r}: expected NAME=section.key=value[,section.key=value]")
        out[name] = sets.split(",")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/bench.yaml")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--slowdown", type=float, default=2.0, help="factor of the slowed rank (last rank)")
    ap.add_argument("--algorithms", nargs="*",
                    default=["sync", "sync_prop", "local", "adaptive", "adaptive_paper"],
                    choices=sorted(CONTENDERS))
    ap.add_argument("--variant", action="append", default=[],
                    help="an extra contender: NAME=section.key=value[,section.key=value]")
    ap.add_argument("--scenarios", nargs="+", default=["even", "slowed"], choices=SCENARIOS)
    ap.add_argument("--target", type=float, default=None,
                    help="P@1 target (default: 90%% of sync's final P@1 in the first even run)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], help="extra overrides for every run")
    ap.add_argument("--out", default="runs/bench")
    a = ap.parse_args(argv)
    contenders = {name: CONTENDERS[name] for name in a.algorithms}
    contenders.update(parse_variants(a.variant))
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    target = a.target
    t0 = time.time()
    if target is None:  # sync's full run fixes the target; every other run stops there
        print(f"[bench {time.time() - t0:6.0f} s] reference: sync without slowdown, full length", flush=True)
        ref = run_one(a.config, a.ranks, CONTENDERS["sync"] + a.set, out / "reference-sync")
        target = 0.9 * ref["summary"]["final"]["p_at_1"]
        print(f"[bench] target P@1 {target:.4f} (90% of {ref['summary']['final']['p_at_1']:.4f})", flush=True)
    (out / "target.txt").write_text(f"{target}\n")  # for the figures (launch/bench.sh)
    for rep in range(a.repeats):
        for scen in a.scenarios:
            label, scen_sets = scenario_sets(scen, a.ranks, a.slowdown)
            for name, sets in contenders.items():
                run_sets = sets + a.set + scen_sets + [f"train.target_p_at_1={target}"]
                if scen != "even" and "hogbatch" in " ".join(sets):
                    # the slowed rank stands in for the CPU worker (small batches), as in the paper
                    run_sets.append(f"hogbatch.cpu_ranks=[{a.ranks - 1}]")
                print(f"[bench {time.time() - t0:6.0f} s] {label}: {name} (repeat {rep + 1}/{a.repeats})",
                      flush=True)
                res = run_one(a.config, a.ranks, run_sets, out / f"{scen}-{name}-r{rep}")
                results.setdefault(label, {}).setdefault(name, []).append(res)
                t = time_to_target(res["evals"], target)
                print(f"    time to target {t if t is None else round(t, 1)} s", flush=True)
    text = (f"benchmark: {a.config}, {a.ranks} ranks, overrides {a.set or 'none'}\n"
            f"{table(results, target)}\n")
    print(text)
    (out / "bench.txt").write_text(text)
    print(f"runs in {out}/; plot with: hvd-adaptive report {out}/even-*-r0 --target {target:.4f} "
          f"--out {out}/report.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
