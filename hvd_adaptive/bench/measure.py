"""What the benchmarks measure in a run: time and rows to a target P@1, a scenario's limit
from the ranks' standalone rates, and one run's figures against it.

A run here is {"summary": summary.json, "evals": the eval records, "start": the start record}
(speed.run_one).
"""
from __future__ import annotations

import statistics
import subprocess
from pathlib import Path
from typing import Optional

import numpy as np

PARTS = ("batch_s", "compute_s", "comm_s", "sync_s", "wait_s")


def code_line() -> str:
    """Which code the benchmark's runs train with: the hvd_adaptive package this process
    imported (the runs are started with the same interpreter, working folder and environment,
    so they import the same one; `python -m` puts the working folder first on sys.path, ahead of
    PYTHONPATH), its git commit and the files changed since. A patched worktree on PYTHONPATH
    with the benchmark started from another checkout shows here as that checkout."""
    import hvd_adaptive

    package = Path(hvd_adaptive.__file__).resolve().parent

    def git(*args: str) -> Optional[str]:
        try:
            p = subprocess.run(["git", "-C", str(package.parent), *args], capture_output=True,
                               text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return p.stdout.strip() if p.returncode == 0 else None

    commit = git("rev-parse", "--short", "HEAD")
    if commit is None:
        return f"code: {package} (not in a git checkout)"
    changed = git("status", "--porcelain", "--", str(package)) or ""
    n = len(changed.splitlines())
    return f"code: {package} at commit {commit}" + (f", {n} file(s) changed since" if n else "")


def time_to_target(evals: list[dict], target: float, key: str = "wall_s") -> Optional[float]:
    """Training seconds (or `key`, e.g. "samples") at which test P@1 reached `target`.

    Linearly interpolated between the last evaluation below the target and the first at or
    above it, so the figure does not depend on where evaluations happened to fall; the first
    evaluation's value when it already reached the target; None if none did.
    """
    prev = None
    for e in evals:
        if e["p_at_1"] >= target:
            if prev is None or e["p_at_1"] == prev["p_at_1"]:
                return float(e[key])
            frac = (target - prev["p_at_1"]) / (e["p_at_1"] - prev["p_at_1"])
            return float(prev[key] + frac * (e[key] - prev[key]))
        prev = e
    return None


FEW_EVALS = 3
"""Fewer evaluations than this before a run reaches the target leave its time to the target an
interpolation across long chords of a bending curve (on the npm data at the config's 0.25
epochs, one or two before each target put adaptive SGD 0.1x further behind `sync` under a quota
than evaluations every 0.05 epochs, three to twelve: docs/benchmark.md, "How it measures")."""


def evals_before(evals: list[dict], target: float) -> Optional[int]:
    """How many evaluations came before the first that reached `target` (None: none reached it)."""
    for i, e in enumerate(evals):
        if e["p_at_1"] >= target:
            return i
    return None


def measures(run: dict, target: float, limit: Optional[dict] = None) -> dict:
    """One run's figures: time and samples to target, rates, efficiency, time breakdown; with
    a scenario's `limit` (see `limits`) also efficiency against its rates and the fraction of
    the limit reached."""
    s = run["summary"]
    t = time_to_target(run["evals"], target)
    n = time_to_target(run["evals"], target, key="samples")
    totals = {k: sum(r.get(k, 0.0) for r in s["per_rank"]) for k in PARTS}
    spent = sum(totals.values()) or 1.0
    # A run without the breakdown (the plain Horovod script times none of it) shows none.
    timed = any(k in r for r in s["per_rank"] for k in PARTS)
    rate = n / t if t and n else None
    choice = (run.get("start") or {}).get("lr_choice") or {}
    out = {"t": t, "samples": n, "rate": rate, "eff": s["efficiency"], "final": s["final"]["p_at_1"],
           "probe_s": choice.get("seconds"),
           **{k: totals[k] / spent if timed else None for k in PARTS}}
    if limit:
        out["eff"] = rate / limit["rate"] if rate else None
        out["of_limit"] = limit["t"] / t if t and limit.get("t") else None
        # The limit bounds training; the rate probe is start-up that every contender pays once.
        p = out["probe_s"] or 0.0
        out["of_limit_np"] = limit["t"] / (t - p) if t and t > p and limit.get("t") else None
    return out


def standalone(run: dict) -> list[float]:
    """The ranks' standalone rows/s that a run measured at start-up."""
    return [r["standalone_rate"] for r in run["summary"]["per_rank"]]


def limits(runs: dict, target: float, phases: Optional[list] = None,
           reference: str = "sync") -> dict:
    """A scenario's limit from all its runs ({contender: [run, ...]}).

    Per rank the median standalone rate over every run of the scenario; `rate` is their sum;
    `t` is `reference`'s median rows to the target (sync's where the reference did not run) at
    that rate (phases: [(rows, factor of the last rank)] of a time-varying scenario, each at its
    own sum); `spread` the largest over the smallest sum of one run's standalone rates.
    """
    every = [standalone(r) for rs in runs.values() for r in rs]
    per_rank = [statistics.median(col) for col in zip(*every)]
    sums = [sum(x) for x in every]
    out = {"rate": sum(per_rank), "per_rank": per_rank, "spread": max(sums) / min(sums), "t": None}
    ref = reference if runs.get(reference) else "sync"  # a scenario the reference sat out
    ref_rows = median([time_to_target(r["evals"], target, key="samples") for r in runs.get(ref, [])])
    if ref_rows:
        if not phases:
            out["t"] = ref_rows / out["rate"]
        else:
            t, done = 0.0, 0.0
            for rows_end, factor in phases:
                part = min(rows_end, ref_rows) - done
                if part > 0:
                    t += part / (sum(per_rank[:-1]) + per_rank[-1] / factor)
                    done += part
            out["t"] = t
    return out


def median(xs: list) -> Optional[float]:
    """The median of the values that are not None; None when none is."""
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def span(xs: list, fmt: str = "{:.2f}") -> Optional[str]:
    """"low-high" of the values that are not None; None for fewer than two."""
    xs = [x for x in xs if x is not None]
    return f"{fmt.format(min(xs))}-{fmt.format(max(xs))}" if len(xs) > 1 else None


def lower_quartile(xs: list) -> Optional[float]:
    """The 25th percentile (linear between order statistics) of the values that are not None;
    None for fewer than two."""
    xs = [x for x in xs if x is not None]
    return float(np.percentile(xs, 25)) if len(xs) > 1 else None


def time_span(ts: list) -> Optional[str]:
    """The range of the runs' times to a target ("low-high"), followed by "(k/n)" when only k
    of the n runs reached it: the median beside it is over those k, so a contender that missed
    the target in some seeds does not pass for one that reached it in all."""
    got = span(ts, "{:.1f}") or ""
    reached = sum(t is not None for t in ts)
    if reached < len(ts):
        got += f"({reached}/{len(ts)})"
    return got or None
