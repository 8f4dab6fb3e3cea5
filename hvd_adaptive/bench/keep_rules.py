"""Which validation figure picks the kept model best, read from finished runs: for each rule,
how far the test P@1 of the evaluation it picks lies below the run's best test P@1.

The evidence behind keeping the model of the best validation score, the mean of P@1, P@3 and
P@5 (records.val_score; docs/accuracy.md). It compares the trained model's evaluations only
(the average's test metrics are recorded only where it is kept). Every
evaluation record of a run with a validation split holds val_p_at_1, val_p_at_3 and
val_p_at_5, so the rules are compared on the same runs without training again. One more rule
keeps the latest evaluation whose validation P@1 is within one standard error of the best so
far (sqrt(p(1 - p) / rows), the split's rows from the run's config.json and start record):
a later model wins a near-tie that the split's noise decides.

    python -m hvd_adaptive.bench.keep_rules runs/acc4-accuracy/*-r* runs/acc-pypi*/*-r* --over 0.5
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Optional

import numpy as np

from hvd_adaptive.bench.output import align
from hvd_adaptive.train.records import load_runs, val_score

# name -> the validation figure a rule maximizes, from one evaluation record
RULES = {
    "val P@1": lambda e: e["val_p_at_1"],
    "val P@5": lambda e: e["val_p_at_5"],
    "val P@1+P@5": lambda e: e["val_p_at_1"] + e["val_p_at_5"],
    "val P@1+P@3+P@5": val_score,  # their mean: the keep's own score
}


def gap(evals: list[dict], figure, smooth: bool = False) -> float:
    """Points of test P@1 between the best evaluation and the first one that maximizes
    `figure` (averaged with its neighbours when `smooth`)."""
    v = np.array([figure(e) for e in evals], float)
    if smooth:
        v = np.array([v[max(0, i - 1):i + 2].mean() for i in range(len(v))])
    test = np.array([e["p_at_1"] for e in evals])
    return 100.0 * float(test.max() - test[int(np.argmax(v))])


def latest_within_se_gap(evals: list[dict], val_rows: float) -> float:
    """Points of test P@1 between the best evaluation and the latest one whose validation P@1
    is within one standard error of the highest so far (the keep rule as a run would apply it,
    evaluation by evaluation)."""
    top, kept = -1.0, evals[0]
    for e in evals:
        top = max(top, e["val_p_at_1"])
        if e["val_p_at_1"] >= top - math.sqrt(top * (1.0 - top) / val_rows):
            kept = e
    return 100.0 * (max(e["p_at_1"] for e in evals) - kept["p_at_1"])


def table(runs: list[list[dict]], over: float, val_rows: Optional[list[float]] = None) -> str:
    """One line a rule (plain and neighbour-averaged, then the standard-error rule when the
    runs' `val_rows` are given): the runs' median, mean and largest gap and how many are over
    `over` points."""
    cells = [["rule", "runs", "median", "mean", "max", f"over {over:g}"]]

    def line(name, g):
        g = np.array(g)
        cells.append([name, str(len(g)), f"{np.median(g):.2f}", f"{g.mean():.2f}",
                      f"{g.max():.2f}", str(int((g > over).sum()))])

    for name, figure in RULES.items():
        for smooth in (False, True):
            line(name + (", neighbours" if smooth else ""), [gap(ev, figure, smooth) for ev in runs])
    if val_rows is not None:
        line("val P@1, latest within 1 s.e.",
             [latest_within_se_gap(ev, n) for ev, n in zip(runs, val_rows)])
    return align(cells, text_columns=1)


def split_rows(run) -> float:
    """The validation rows of a run: data.validation of its config.json (a fraction of the
    training rows before the split, or a count) and the training rows its start record holds
    (after the split)."""
    v = json.loads((Path(run.path) / "config.json").read_text())["data"]["validation"]
    return float(v) if v >= 1 else round(v * run.start["train_rows"] / (1.0 - v))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders (those without a validation split are left out)")
    ap.add_argument("--over", type=float, default=0.5, help="gap in points of P@1 counted as too far")
    a = ap.parse_args(argv)
    kept = [(r, [e for e in r.evals if "val_p_at_1" in e]) for r in load_runs(a.runs)]
    kept = [(r, ev) for r, ev in kept if len(ev) >= 2]
    if not kept:
        raise SystemExit("keep_rules: none of the runs has two evaluations with a validation split")
    print(f"points of test P@1 below the run's best evaluation, {len(kept)} runs")
    print(table([ev for _, ev in kept], a.over, [split_rows(r) for r, _ in kept]))


if __name__ == "__main__":
    main()
