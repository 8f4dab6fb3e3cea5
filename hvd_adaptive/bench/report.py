"""Compare run folders: a table of final accuracy (with PSP@k when the runs' evaluations have
it) and time to a target, and one figure.

Usage:
  hvd-adaptive report runs/sync runs/adaptive --out report.png
  hvd-adaptive report runs/sweep/sweep_tiny/* --out sweep.png --target 0.7

The figure's top panel is test P@1 against training wall time (the comparison the adaptive
SGD papers draw); below it, each rank's batch size and merge weight over time, from the
`round` records. Time to target is the training time at which test P@1 reached the target
(default: 90% of the best final P@1 among the runs), interpolated between evaluations.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

from hvd_adaptive.bench.measure import time_to_target
from hvd_adaptive.bench.output import ReportError, align, save_png
from hvd_adaptive.train.records import Run, load_runs

TARGET_FRACTION = 0.9
PSP_KEYS = ("psp_at_1", "psp_at_3", "psp_at_5")


def default_target(runs: list[Run]) -> Optional[float]:
    """TARGET_FRACTION of the best final P@1 over the runs; None when no run has evaluated."""
    finals = [r.final["p_at_1"] for r in runs if r.final]
    return TARGET_FRACTION * max(finals) if finals else None


def table_rows(runs: list[Run], target: Optional[float]) -> list[dict]:
    """One row of plain values per run (None where a run has no such value)."""
    rows = []
    for r in runs:
        f = r.final or {}
        rows.append({
            "run": r.name, "algorithm": r.algorithm,
            "p_at_1": f.get("p_at_1"), "p_at_3": f.get("p_at_3"), "p_at_5": f.get("p_at_5"),
            # propensity-scored precision: only in runs whose evaluations computed it
            **{key: f.get(key) for key in PSP_KEYS},
            "best_p_at_1": max((e["p_at_1"] for e in r.evals), default=None),
            "train_s": r.train_s,
            "time_to_target": time_to_target(r.evals, target) if target is not None else None,
            "efficiency": (r.summary or {}).get("efficiency"),
        })
    return rows


def format_table(rows: list[dict], target: Optional[float]) -> str:
    """Aligned text table; "-" marks missing values (e.g. a target never reached).

    PSP@1/3/5 columns appear when at least one run has them.
    """
    ttt = f"s to P@1>={target:.3f}" if target is not None else "s to target"
    psp = [(f"PSP@{key[-1]}", key, "{:.4f}") for key in PSP_KEYS
           if any(row.get(key) is not None for row in rows)]
    cols = [("run", "run", "{}"), ("algorithm", "algorithm", "{}"), ("P@1", "p_at_1", "{:.4f}"),
            ("P@3", "p_at_3", "{:.4f}"), ("P@5", "p_at_5", "{:.4f}"), *psp,
            ("best P@1", "best_p_at_1", "{:.4f}"), ("train s", "train_s", "{:.1f}"),
            (ttt, "time_to_target", "{:.1f}"), ("efficiency", "efficiency", "{:.2f}")]
    cells = [[h for h, _, _ in cols]]
    cells += [[("-" if row[k] is None else fmt.format(row[k])) for _, k, fmt in cols] for row in rows]
    return align(cells, text_columns=2)


def plot(runs: list[Run], out: str | Path, target: Optional[float]) -> Path:
    """Writes the figure (P@1, per-rank batch size and merge weight against time) to `out`."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on cluster nodes
    import matplotlib.pyplot as plt

    fig, (acc, bs, wt) = plt.subplots(3, 1, figsize=(11, 10), sharex=True,
                                      gridspec_kw={"height_ratios": [2, 1, 1]})
    styles = ["-", "--", ":", "-."]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, r in enumerate(runs):
        color = colors[i % len(colors)]
        if r.evals:
            acc.plot([e["wall_s"] for e in r.evals], [e["p_at_1"] for e in r.evals], "o-",
                     color=color, label=f"{r.name} ({r.algorithm})", markersize=3)
        n_ranks = max((len(rec["ranks"]) for rec in r.rounds), default=0)
        for k in range(n_ranks):
            pts = [(rec["wall_s"], rec["ranks"][k]) for rec in r.rounds if len(rec["ranks"]) > k]
            t = [p[0] for p in pts]
            # A round's batch size and weight hold until its end, where it is recorded.
            kw = dict(color=color, linestyle=styles[k % len(styles)], drawstyle="steps-pre",
                      label=f"{r.name} r{k}")
            bs.plot(t, [p[1]["batch_size"] for p in pts], **kw)
            wt.plot(t, [p[1]["weight"] for p in pts], **kw)
    if target is not None:
        acc.axhline(target, color="grey", linewidth=0.8, linestyle="--",
                    label=f"target P@1 {target:.3f}")
    acc.set_ylabel("test P@1")
    acc.set_title("Test P@1 against training time")
    bs.set_ylabel("batch size per rank")
    wt.set_ylabel("merge weight per rank")
    wt.set_xlabel("training wall time (s)")
    for ax in (acc, bs, wt):
        ax.grid(alpha=0.3)
    # Legends outside the axes, so many runs never hide the curves.
    acc.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    if len(runs) * max((len(rec["ranks"]) for r in runs for rec in r.rounds), default=0) <= 16:
        bs.legend(fontsize=7, ncol=1, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_png(fig, out)


def main(args: argparse.Namespace) -> int:
    """Entry point of `hvd-adaptive report` (parsed in hvd_adaptive.cli)."""
    if args.target is not None and not 0.0 < args.target <= 1.0:
        raise ReportError(f"--target: a P@1 in (0, 1], got {args.target}")
    if Path(args.out).suffix.lower() != ".png":
        raise ReportError(f"--out {args.out}: the figure is written as PNG; name it *.png")
    if getattr(args, "scaling", None):
        from hvd_adaptive.bench import scaling

        if args.runs:
            raise ReportError("--scaling draws from its JSON file alone: give no run folders")
        print(f"figure: {scaling.plot(args.scaling, args.out)}")
        return 0
    if not args.runs:
        raise ReportError("give one or more run folders (or --scaling FILE)")
    runs = load_runs(args.runs)
    target = args.target if args.target is not None else default_target(runs)
    print(format_table(table_rows(runs, target), target))
    print(f"figure: {plot(runs, args.out, target)}")
    return 0
