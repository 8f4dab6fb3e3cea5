"""The scaling benchmark: 1 to N ranks on one machine, each rank in its own cgroup CPU quota.

Usage:
  bash launch/bench.sh scaling      # 67,009 labels on 1, 2, 4, 8 ranks at a quarter core each
  python -m hvd_adaptive.bench.speed --config configs/bench.yaml --scaling 1 2 4 8 --core 0.25 \
      --algorithms horovod sync adaptive --target 0.6202 0.6977 --seeds 1 2 3 --out runs/bench-scaling
  hvd-adaptive report --scaling runs/bench-scaling/scaling.json --out scaling.png

Two cluster profiles (`hetero.cores`, hvd_adaptive/train/hetero.py), at every rank count:
- ``equal``: every rank gets `--core` cores (a quarter: eight ranks fit two cores, so no rank
  contends with another for a core and their speeds mean what the profile says);
- ``half``: the last half of the ranks get half of that (slower machines whose communication
  and waiting slow down too).
One rank runs the reference only (`horovod` when it is a contender, else sync: minibatch SGD,
what every contender is on one rank); the speedup of a contender at n ranks is that one rank's
time to the target over the contender's own.

Columns per profile, rank count and contender (medians over the seeds): time to the target and
its range, rows to it and their multiple of one rank's (rows_x1: what the rank count costs in
rows, as opposed to speed), rows/s, speedup over one rank, its ceiling (the sum of the ranks'
standalone rates over one rank's: ranks running at once share the machine's caches and memory
bandwidth, so n ranks at a quarter core each train slower per rank than one rank alone), the
reference's time over the contender's seed by seed (median and range), efficiency (rows/s over
the sum of the ranks' standalone rates), the fraction of the limit (the reference's rows to the
target at that sum), the shares of all ranks' time computing, in communication (allreduces,
merges, timing exchanges) and waiting ("-" for the plain script, which times none of it), and
the largest peak resident memory of a rank.
"""
from __future__ import annotations

import json
from pathlib import Path

from hvd_adaptive.bench.measure import limits, measures, median, span, time_span
from hvd_adaptive.bench.output import ReportError, align, save_png

PROFILES = ("equal", "half")


def profile_cores(kind: str, n: int, core: float) -> list[float]:
    """Each rank's cores: all `core` (equal), or the last n // 2 ranks at half of it (half)."""
    slow = n // 2 if kind == "half" else 0
    return [core] * (n - slow) + [core / 2] * slow


def profile_sets(kind: str, n: int, core: float) -> tuple[str, list[str]]:
    """A profile's label and the overrides that give it (one thread a rank: a fraction of a core
    cannot use more)."""
    cores = profile_cores(kind, n, core)
    label = f"{kind}: {n} rank(s) at " + ", ".join(f"{c:g}" for c in cores) + " core(s)"
    return label, [f"hetero.cores=[{', '.join(f'{c:g}' for c in cores)}]",
                   "hetero.mode=cpu_quota", "train.threads=1"]


def points(kinds: list[str], counts: list[int]) -> list[tuple[str, int]]:
    """(profile, ranks) to run: one rank once (the profiles agree there), then every profile
    at every other count."""
    out = [("equal", 1)] if 1 in counts else []
    return out + [(k, n) for k in kinds for n in counts if n > 1]


def rows(results: dict, target: float, reference: str = "sync") -> list[dict]:
    """One row per (profile, ranks, contender) from {(profile, ranks): {contender: [run, ...]}}.

    Speedups are over the one-rank runs (whatever contender ran there); `ratio` is `reference`'s
    time to the target over the contender's at the same point, seed by seed (the repeats of a
    point are in seed order), median and range; the limit takes `reference`'s rows."""
    one = next(iter(results.get(("equal", 1), {}).values()), [])
    t1 = median([measures(r, target)["t"] for r in one])
    rows1 = median([measures(r, target)["samples"] for r in one])
    rate1 = limits({"one": one}, target)["rate"] if one else None
    out = []
    for (kind, n), algos in results.items():
        lim = limits(algos, target, reference=reference)
        ref = [measures(r, target)["t"] for r in algos.get(reference, [])]
        for name, runs in algos.items():
            ms = [measures(r, target, lim) for r in runs]
            med = {k: median([m[k] for m in ms]) for k in ms[0]}
            ratios = [a / m["t"] if a and m["t"] else None for a, m in zip(ref, ms)]
            peak = median([max(x.get("peak_rss_mb", 0.0) for x in r["summary"]["per_rank"]) for r in runs])
            out.append({"profile": kind, "ranks": n, "contender": name, "t": med["t"],
                        "t_range": time_span([m["t"] for m in ms]),
                        "samples": med["samples"], "rate": med["rate"], "eff": med["eff"],
                        "rows_x": med["samples"] / rows1 if rows1 and med["samples"] else None,
                        "of_limit": med["of_limit"],
                        "speedup": t1 / med["t"] if t1 and med["t"] else None,
                        "ceiling": lim["rate"] / rate1 if rate1 else None,
                        "ratio": median(ratios), "ratio_range": span(ratios),
                        "compute": med["compute_s"],
                        "comm": None if med["comm_s"] is None else med["comm_s"] + (med["sync_s"] or 0.0),
                        "wait": med["wait_s"], "peak_mb": peak, "repeats": len(runs)})
    return out


COLUMNS = (("profile", "profile", "{}"), ("ranks", "ranks", "{}"), ("contender", "contender", "{}"),
           ("s->target", "t", "{:.1f}"), ("range", "t_range", "{}"), ("rows->tgt", "samples", "{:.0f}"),
           ("rows_x1", "rows_x", "{:.2f}"), ("rows/s", "rate", "{:.0f}"), ("speedup", "speedup", "{:.2f}"),
           ("ceiling", "ceiling", "{:.2f}"), ("ref/this", "ratio", "{:.2f}"), ("range", "ratio_range", "{}"),
           ("effic.", "eff", "{:.2f}"), ("of_limit", "of_limit", "{:.2f}"), ("compute", "compute", "{:.2f}"),
           ("comm", "comm", "{:.2f}"), ("wait", "wait", "{:.2f}"), ("peak MB", "peak_mb", "{:.0f}"))


def table(data: list[dict]) -> str:
    cells = [[h for h, _, _ in COLUMNS]]
    for r in data:
        cells.append(["-" if r.get(k) is None else fmt.format(r[k]) for _, k, fmt in COLUMNS])
    return align(cells, text_columns=3)


def save(data: list[dict], target: float, core: float, path: Path) -> None:
    path.write_text(json.dumps({"target": target, "core": core, "rows": data}, indent=1) + "\n")


def plot(path: str | Path, out: str | Path) -> Path:
    """The scalability figure from a scaling.json: time to target against ranks (log-log), one
    line per contender and profile, the linear ideal from one rank dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt


    try:
        data = json.loads(Path(path).read_text())
        got = data["rows"]
    except (OSError, ValueError, KeyError) as e:
        raise ReportError(f"{path}: not a scaling.json written by the scaling benchmark ({e})") from None
    kinds = [k for k in PROFILES if any(r["profile"] == k and r["ranks"] > 1 for r in got)]
    one = next((r["t"] for r in got if r["ranks"] == 1 and r["t"]), None)
    fig, axes = plt.subplots(1, max(1, len(kinds)), figsize=(6 * max(1, len(kinds)), 4.5),
                             sharey=True, squeeze=False)
    names = list(dict.fromkeys(r["contender"] for r in got))
    counts = sorted({r["ranks"] for r in got})
    for ax, kind in zip(axes[0], kinds):
        for name in names:
            # Every contender starts from the one-rank run (minibatch SGD, run once).
            pts = ([(1, one)] if one else []) + sorted(
                (r["ranks"], r["t"]) for r in got
                if r["contender"] == name and r["t"] and r["profile"] == kind and r["ranks"] > 1)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=name)
        if one:
            ax.plot(counts, [one / n for n in counts], "k--", linewidth=0.8, label="linear ideal")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(counts, [str(n) for n in counts])
        ax.set_xlabel("ranks")
        ax.set_title(f"{kind}: " + ("every rank" if kind == "equal" else "half the ranks at half")
                     + f" of {data.get('core', '?')} core")
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel(f"seconds to P@1 {data.get('target', 0):.3f}")
    axes[0][0].legend(fontsize=8)
    return save_png(fig, out)

