"""The accuracy benchmark: the network's kept model against napkinXC's label tree on the same rows.

    python -m hvd_adaptive.bench.accuracy --config configs/default.yaml --name default \
        --seeds 3 --ranks 2 --out runs/accuracy [--set KEY=VALUE ...]

For each seed r (0, 1, ... or from --first-seed; train.seed, model.init_seed and the tree's
seed r + 1), one `hvd-adaptive train`
run on `--ranks` ranks (bench.run_one: no checkpoint is written, `kept` is read from the
evaluations) with a validation split (data.validation, default 0.05 here) and an
evaluation every `--eval-every` epochs, then `hvd-adaptive trees` on the same training rows
(`--tree-method br`: napkinXC's binary relevance in the tree's place, its figures in the tree_
columns).
Prints one line a seed and a median row: which model was kept (the trained one, or
checkpoint.average's average: "average"), the kept model's test P@1/P@5/PSP@5, the best test
P@1 any evaluation of the trained model reached and the kept model's gap to it (points;
negative where a kept average is above them all), the tree's P@1/P@5/PSP@5
and train time, and the network's training seconds to the tree's P@1 (the run's clock: rate
probe included, evaluations not; "-" where it never got there). Writes accuracy.json.
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

from hvd_adaptive.bench.measure import code_line
from hvd_adaptive.bench.speed import run_one


def first_time(evals: list[dict], p1: float) -> Optional[float]:
    """Training seconds of the first evaluation whose test P@1 reaches `p1` (None: never)."""
    return next((e["wall_s"] for e in evals if e["p_at_1"] >= p1), None)


def run_seed(args, seed: int, say) -> dict:
    """One seed: the network, then the tree; returns the seed's row."""
    sets = [f"data.validation={args.validation}", f"train.eval_every={args.eval_every}",
            f"train.seed={seed}", f"model.init_seed={seed + 1}", *args.set]
    if args.epochs is not None:
        sets.append(f"train.epochs={args.epochs}")
    run_dir = Path(args.out) / f"{args.name}-r{seed}"
    flags = [a for s in sets for a in ("--set", s)]
    run = run_one(args.config, args.ranks, sets, run_dir)  # the benchmark's runs: no checkpoints
    summary, evals = run["summary"], run["evals"]
    tree_out = run_dir / "trees.json"
    p = subprocess.run([sys.executable, "-m", "hvd_adaptive.cli", "trees", "--config", args.config,
                        *flags, "--threads", str(args.ranks), "--method", args.tree_method,
                        "--out", str(tree_out)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"trees for {run_dir} failed (exit {p.returncode}):\n{p.stderr[-2000:]}")
    tree = json.loads(tree_out.read_text())
    kept, tm = summary["kept"], tree["metrics"]
    best = max(e["p_at_1"] for e in evals)
    row = {"seed": seed, "kept_model": kept["model"], "kept_p1": kept["p_at_1"], "kept_p5": kept["p_at_5"],
           "kept_psp5": kept["psp_at_5"], "kept_epoch": kept["epoch"], "best_p1": best,
           "gap_points": round(100 * (best - kept["p_at_1"]), 2),
           "final_p1": summary["final"]["p_at_1"], "final_epoch": summary["final"]["epoch"],
           "tree_p1": tm["p_at_1"], "tree_p5": tm["p_at_5"], "tree_psp5": tm["psp_at_5"],
           "tree_train_s": tree["train_s"], "net_s_to_tree_p1": first_time(evals, tm["p_at_1"]),
           "net_train_s": summary["train_wall_s"]}
    say(line(row))
    return row


COLUMNS = ("kept_p1", "kept_p5", "kept_psp5", "best_p1", "gap_points", "final_p1", "tree_p1",
           "tree_p5", "tree_psp5", "tree_train_s", "net_s_to_tree_p1", "net_train_s")


def line(row: dict) -> str:
    def cell(v):
        return "-" if v is None else f"{v:.4f}" if isinstance(v, float) and v < 1 else f"{v:g}"
    return (f"{str(row['seed']):>6} {row['kept_model']:>10} "
            + " ".join(f"{cell(row[c]):>16}" for c in COLUMNS))


def median_row(rows: list[dict]) -> dict:
    # kept_model: of how many seeds the kept model was checkpoint.average's average.
    out = {"seed": "median",
           "kept_model": f"{sum(r['kept_model'] == 'average' for r in rows)}/{len(rows)} avg"}
    for c in COLUMNS:
        values = [r[c] for r in rows if r[c] is not None]
        # A time never reached counts as later than any reached (it stays "-" for most seeds).
        out[c] = (round(statistics.median(values), 4)
                  if len(values) * 2 > len(rows) else None)
    return out


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hvd_adaptive.bench.accuracy", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True)
    p.add_argument("--name", required=True, help="the workload's name (run folders, the table)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--seeds", type=int, default=3, help="how many seeds")
    p.add_argument("--first-seed", type=int, default=0,
                   help="the first seed r (the seeds are r, r + 1, ...; default 0)")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--epochs", type=float, help="train.epochs (default: the config's)")
    p.add_argument("--eval-every", type=float, default=0.5)
    p.add_argument("--validation", type=float, default=0.05)
    p.add_argument("--tree-method", choices=("plt", "br"), default="plt",
                   help="the model beside the network: napkinXC's label tree (plt, default) or its "
                        "binary relevance (br: a logistic model a label, no tree)")
    p.add_argument("--out", default="runs/accuracy")
    args = p.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    beside = "" if args.tree_method == "plt" else ", beside napkinXC's BR (the tree_ columns)"
    print(f"accuracy: {args.name} ({args.config} {' '.join(args.set)}), {args.seeds} seed(s), "
          f"{args.ranks} ranks{beside}", flush=True)
    code = code_line()
    print(f"accuracy: {code}", flush=True)
    print(f"{'seed':>6} {'kept_model':>10} " + " ".join(f"{c:>16}" for c in COLUMNS), flush=True)
    rows = [run_seed(args, r, lambda s: print(s, flush=True))
            for r in range(args.first_seed, args.first_seed + args.seeds)]
    med = median_row(rows)
    print(line(med), flush=True)
    print(f"accuracy: {args.name} done in {time.time() - t0:.0f} s", flush=True)
    out = Path(args.out) / f"accuracy-{args.name}.json"
    out.write_text(json.dumps({"name": args.name, "config": args.config, "sets": args.set, "code": code,
                               "tree_method": args.tree_method,
                               "rows": rows, "median": med}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
