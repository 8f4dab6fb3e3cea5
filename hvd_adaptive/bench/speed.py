"""Side-by-side benchmark: every contender on the same data, seed and heterogeneity.

Usage:
  bash launch/bench.sh [quick|full]      # the curve of docs/benchmark.md (3 repeats)
  python -m hvd_adaptive.bench.speed --config configs/bench_quick.yaml --repeats 3 \
      --algorithms sync sync_prop adaptive --scenarios even slowed quota vary \
      --slowdown 2 1.25 1.5 4 --quota-slowdown 2 --out runs/bench-quick
  python -m hvd_adaptive.bench.speed ... --variant "adaptive_w1024=train.algorithm=adaptive,train.window_samples=1024"

Fairness: each contender is its own `mpirun -np N hvd-adaptive train` run, one after the other
and interleaved per repeat, on the same synthetic data and seed, with the same heterogeneity
(`hetero.slowdown` of the last rank: in sleep mode it multiplies only local computation, the
same span in every algorithm; the `quota` scenario slows the rank's whole process through a
cgroup CPU quota), and the same clock (training seconds on rank 0, evaluation excluded).
Contenders whose defaults are not their own carry their tuned settings in CONTENDERS.

`horovod` is the yardstick users recognize: not the project's training at all, but the plain
Horovod script a user would write instead (hvd_adaptive/bench/plain_horovod.py: tf.Variables,
DistributedGradientTape, one tf.function step), started as `mpirun -np N python -m
hvd_adaptive.bench.plain_horovod` with the same config and overrides. A CPU quota (the `quota`
scenario, cluster profiles) reaches it as it reaches the project's runs: its whole process in
the same cgroup. The sleep slowdown multiplies only the project's own computation spans, which
a plain script does not have: `horovod` is left out of the `slowed` and `vary` scenarios, with
a line saying so. It measures its own standalone rates (its step without the allreduce) for the
limit, and has no breakdown of its time ("-" in those columns).

Scenarios (`--scenarios`, the slowed rank is the last): `even`; `slowed` (sleep mode) and
`quota` (a cgroup CPU quota) once per factor of `--slowdown`; `vary`: the last rank runs at
full speed, turns `--slowdown`'s first factor slower a third of the way to the target and
recovers at two thirds (in epochs, from sync's rows to the target in the first even run).

The targets are 80% and 90% of sync's final P@1 in a full-length run without slowdown (or
--target, one or more); runs stop once they reach the highest, and each target gets a table.
Time and samples to target are interpolated linearly between evaluations: every contender
evaluates every `--eval-every` epochs (0.05 by default, whatever its config's
`train.eval_every`; a `--set train.eval_every=...` wins). A coarser grid puts a time to the
target on a straight line across the curve's bend, later than the curve: at the configs' 0.25
epochs adaptive SGD's median ratio to the plain script at 13,402 labels read 1.44x where 0.05
read 1.22x, and on the PyPI data its ratio to sync 0.97x where 0.05 read 0.82x
(docs/benchmark.md). Columns: time to target; samples to target (statistical
efficiency); samples per second up to then (hardware efficiency); cluster efficiency; the
reference's time to target over the contender's, seed by seed (`--reference`, by default
`horovod` when it runs, else sync; > 1: sooner); the fraction of the limit; where the ranks'
time went. Medians and ranges over the repeats, each its own seed; a time range ending "(k/n)"
says only k of the n seeds reached the target, and the median is theirs.

The limit is the time a perfect data-parallel method would take: the reference's rows to the
target (sync's in the scenarios `horovod` sits out) at the sum of the ranks' standalone rates
(each rank's own training step, timed at start-up in every run). One set of standalone rates
serves every contender of a scenario: per rank, the median over all the scenario's runs (every
contender, every repeat), so no contender is judged by its own lucky or unlucky measurement;
their spread is printed. In `vary` the slowed phase's
rate of the last rank is its full-speed rate over the factor (sleep mode divides exactly).
Cluster efficiency is a run's rows/s over that sum.

The contenders' run folders keep their config, metrics and summary but no model
(`checkpoint.keep=0`), and the arguments they ran with (ARGS_FILE): `--reuse` reads a finished
run of the same arguments instead of running it again.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

from hvd_adaptive.train.algorithms import ALGORITHMS
from hvd_adaptive.bench import scaling
from hvd_adaptive.bench.measure import (FEW_EVALS, code_line, evals_before, limits, lower_quartile,
                                        measures, median, span, time_span, time_to_target)
from hvd_adaptive.bench.output import align
from hvd_adaptive.train.records import METRICS, SUMMARY, load_run
from hvd_adaptive.train.run import mpirun_command

EVAL_EVERY = 0.05  # epochs between a benchmark run's evaluations (--eval-every)

# name -> config overrides: every algorithm with its defaults, and named variants of them.
CONTENDERS = {
    **{name: [f"train.algorithm={name}"] for name in ALGORITHMS},
    # sync with LB-BSP's partition re-measured every window
    "sync_prop": ["train.algorithm=sync", "sync.partition=proportional"],
    # adaptive SGD as published: per-rank optimizer state, plain weighted average, lr ~ batch
    "adaptive_paper": ["train.algorithm=adaptive", "adaptive.opt_state=local",
                       "adaptive.row_norm=false", "adaptive.label_norm=false",
                       "adaptive.lr_scaling=linear"],
    # the plain Horovod script (SCRIPTS): its own training, the config as every contender's
    "horovod": [],
}
# Contenders that are scripts of their own rather than `hvd-adaptive train`: name -> module.
SCRIPTS = {"horovod": "hvd_adaptive.bench.plain_horovod"}


def script_of(contender: str, sets: Sequence[str] = ()) -> Optional[str]:
    """The SCRIPTS entry `contender` runs: its name, or a variant's `train.algorithm=<entry>`
    (`--variant horovod_x=train.algorithm=horovod,...`); None: `hvd-adaptive train`."""
    if contender in SCRIPTS:
        return contender
    return next((k for k in SCRIPTS if f"train.algorithm={k}" in sets), None)
# Scenarios whose slowdown only the project's training can apply (sleep mode), and why.
SLEEP_SCENARIOS = ("slowed", "vary")
SCENARIOS = ("even", "slowed", "quota", "vary")
def train_args(config: str, sets: list[str], run_dir: Path, contender: str = "") -> list[str]:
    """A contender's `python ARGS`: `hvd-adaptive train`, or the contender's own script
    (SCRIPTS); no checkpoints (the runs are read for their metrics only; a full benchmark at
    67,009 labels would keep about 10 GB of models), then `sets`."""
    script = script_of(contender, sets)
    program = ["-m", SCRIPTS[script]] if script else ["-m", "hvd_adaptive.cli", "train"]
    args = [*program, "--config", config, "--run-dir", str(run_dir)]
    for s in ["checkpoint.keep=0", *[x for x in sets if x != f"train.algorithm={script}"]]:
        args += ["--set", s]
    return args


def skip_reason(contender: str, scenario: str, sets: Sequence[str] = ()) -> Optional[str]:
    """Why `contender` (with its `sets`) cannot run `scenario` (None: it can): a plain script
    in a sleep-mode scenario, whose slowdown it has no way to apply."""
    if script_of(contender, sets) and scenario in SLEEP_SCENARIOS:
        return (f"{contender} skipped in the {scenario} scenario: its slowdown (hetero.mode=sleep) "
                "multiplies only the project's own computation spans, which a plain script does "
                "not have; the quota scenario slows it as it slows the others")
    return None


ARGS_FILE = "bench-args.json"  # in a run's folder: the arguments the benchmark ran it with


def run_one(config: str, ranks: int, sets: list[str], run_dir: Path, contender: str = "",
            reuse: bool = False) -> dict:
    """Trains one contender (`contender` names a SCRIPTS entry, else `hvd-adaptive train`);
    returns its summary and eval records. With `reuse`, a folder holding a finished run of the
    same ranks and arguments (ARGS_FILE, written once the run finished) is read, not run again:
    an interrupted benchmark goes on where it stopped, and a finished one prints its tables
    again."""
    args = train_args(config, sets, run_dir, contender)
    asked = {"ranks": ranks, "args": args}
    done = run_dir / ARGS_FILE
    if not (reuse and done.is_file() and (run_dir / SUMMARY).is_file()
            and json.loads(done.read_text()) == asked):
        cmd, env = mpirun_command(ranks, args)
        run_dir.mkdir(parents=True, exist_ok=True)
        done.unlink(missing_ok=True)
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"{run_dir.name} failed (exit {p.returncode}):\n{p.stderr[-2000:]}")
        done.write_text(json.dumps(asked) + "\n")
    run = load_run(run_dir)
    if run.summary is None:
        raise RuntimeError(f"{run_dir.name} ended without its summary.json")
    return {"summary": run.summary, "evals": run.evals, "start": run.start}


def run_logged(config: str, ranks: int, sets: list[str], run_dir: Path, target: float,
               what: str, t0: float, contender: str = "", reuse: bool = False) -> dict:
    """`run_one` with the benchmark's progress lines: what runs, then its time to the target."""
    print(f"[bench {time.time() - t0:6.0f} s] {what}", flush=True)
    res = run_one(config, ranks, sets, run_dir, contender, reuse)
    t = time_to_target(res["evals"], target)
    print(f"    time to target {t if t is None else round(t, 1)} s", flush=True)
    return res


# (header, measure, format) of the table's columns after the contender's name
COLUMNS = (("s->target", "t", "{:.1f}"), ("range", "t_range", "{}"), ("probe", "probe_s", "{:.1f}"),
           ("rows->tgt", "samples", "{:.0f}"),
           ("rows/s", "rate", "{:.0f}"), ("effic.", "eff", "{:.2f}"), ("ref/this", "ratio", "{:.2f}"),
           ("range", "ratio_range", "{}"), ("q1", "ratio_q1", "{:.2f}"),
           ("of_limit", "of_limit", "{:.2f}"), ("of_lim-pr", "of_limit_np", "{:.2f}"),
           ("compute", "compute_s", "{:.2f}"), ("comm", "comm_s", "{:.2f}"),
           ("allgat", "sync_s", "{:.2f}"), ("wait", "wait_s", "{:.2f}"), ("batch", "batch_s", "{:.2f}"))


def reference_of(contenders) -> str:
    """The contender every ratio is against: the plain Horovod script when it runs, else sync."""
    return "horovod" if "horovod" in contenders else "sync"


def table(results: dict, target: float, phases: Optional[dict] = None,
          reference: str = "sync") -> str:
    """Formats {scenario: {contender: [run, ...]}} as the benchmark's table: medians and ranges
    over the repeats (seeds); `ratio` is `reference`'s time to the target over the
    contender's, the median of the repeats' ratios, each within one seed; `phases` maps a
    time-varying scenario's label to its phases (see `limits`)."""
    lines = []
    for scenario, algos in results.items():
        reps = max(len(v) for v in algos.values())
        lim = limits(algos, target, (phases or {}).get(scenario), reference)
        head = (f"\n{scenario}  (target P@1 {target:.4f}; medians over {reps} repeat(s); time shares "
                f"of all ranks)\n  standalone rows/s per rank (median of the scenario's runs): "
                + ", ".join(f"{x:.0f}" for x in lim["per_rank"])
                + f"; sum {lim['rate']:.0f} (runs spread {100 * (lim['spread'] - 1):.0f}%)")
        if lim["t"]:
            head += f"; limit {lim['t']:.1f} s to target"
        lines.append(head)
        m = {name: [measures(r, target, lim) for r in runs] for name, runs in algos.items()}
        ref = m.get(reference, [])
        lines[-1] += (f"\n  ref/this: {reference}'s time to the target over the contender's, per seed; "
                      "a range ending (k/n): k of the n seeds reached the target, the median is theirs;"
                      "\n  q1: the lower quartile of the seeds' ratios; probe: optim.lr auto's seconds, "
                      "inside s->target; of_lim-pr: of_limit with the probe left out of the time")
        cells = [["contender", *(h for h, _, _ in COLUMNS)]]
        for name, ms in m.items():
            med = {k: median([x[k] for x in ms]) for k in ms[0]}
            ratios = [r["t"] / x["t"] if r["t"] and x["t"] else None for r, x in zip(ref, ms)]
            med["ratio"], med["ratio_range"] = median(ratios), span(ratios)
            med["ratio_q1"] = lower_quartile(ratios)
            med["t_range"] = time_span([x["t"] for x in ms])
            cells.append([name, *("-" if med.get(k) is None else fmt.format(med[k]) for _, k, fmt in COLUMNS)])
        lines.append(align(cells, text_columns=1))
        # Each seed's time and the rate it trained at: a ratio's range may be a rate's draw.
        seeds = []
        for name, ms in m.items():
            lrs = [(r.get("start") or {}).get("lr") for r in algos[name]]
            times = [("-" if x["t"] is None else f"{x['t']:.1f}")
                     + ("" if lr is None else f" ({lr:.4g})") for x, lr in zip(ms, lrs)]
            seeds.append([name, *times, *[""] * (reps - len(times))])
        lines.append("  per seed, in the order of the seeds: seconds to the target (learning rate)\n"
                     + align(seeds, text_columns=1))
        few = {name: median([evals_before(r["evals"], target) for r in runs])
               for name, runs in algos.items()}
        few = {name: n for name, n in few.items() if n is not None and n < FEW_EVALS}
        if few:
            lines.append("  few evaluations before the target (median of the seeds): "
                         + ", ".join(f"{name} {n:g}" for name, n in few.items())
                         + "; its time is interpolated across long stretches of the curve: "
                         "evaluate more often (--eval-every; adaptive and local "
                         "SGD evaluate at the first window's end after each mark)")
    return "\n".join(lines)


def scenario_list(names: list[str], factors: list[float],
                  quota_factors: Optional[list[float]] = None) -> list[tuple[str, float]]:
    """(kind, factor) for each scenario to run: slowed once per factor, quota once per quota
    factor (default: the same), even and vary with the first factor."""
    out = []
    for name in names:
        if name in ("slowed", "quota"):
            out += [(name, f) for f in (quota_factors or factors if name == "quota" else factors)]
        else:
            out.append((name, factors[0]))
    return out


def scenario_sets(scen: str, ranks: int, slowdown: float,
                  vary_epochs: tuple[float, float] = (0.0, 0.0)) -> tuple[str, list[str]]:
    """A scenario's label and overrides (the last rank is the slowed one)."""
    slow = f"hetero.slowdown={{{ranks - 1}: {slowdown}}}"
    if scen == "even":
        return "no slowdown", []
    if scen == "slowed":
        return f"rank {ranks - 1} slowed {slowdown:g}x (sleep: local computation only)", [slow]
    if scen == "vary":
        a, b = vary_epochs
        return (f"rank {ranks - 1} slowed {slowdown:g}x from epoch {a:.3f} to {b:.3f} (sleep)",
                [f"hetero.schedule=[{{from_epoch: {a:.4f}, slowdown: {{{ranks - 1}: {slowdown}}}}}, "
                 f"{{from_epoch: {b:.4f}, slowdown: {{}}}}]"])
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
    ap.add_argument("--slowdown", type=float, nargs="+", default=[2.0],
                    help="factors of the slowed rank (last rank); slowed and quota run once per factor")
    ap.add_argument("--quota-slowdown", type=float, nargs="+", default=None,
                    help="factors of the quota scenarios (default: --slowdown's)")
    ap.add_argument("--algorithms", nargs="*",
                    default=["sync", "sync_prop", "adaptive"],
                    choices=sorted(CONTENDERS))
    ap.add_argument("--variant", action="append", default=[],
                    help="an extra contender: NAME=section.key=value[,section.key=value]; its "
                         "items come after --eval-every's (a variant's train.eval_every wins) and "
                         "a --set of a key a contender sets itself is refused")
    ap.add_argument("--scenarios", nargs="+", default=["even", "slowed"], choices=SCENARIOS)
    ap.add_argument("--target", type=float, nargs="+", default=None,
                    help="P@1 targets, a table each; runs stop at the highest (default: 80%% and "
                         "90%% of sync's final P@1 in a full-length run without slowdown)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="repeats, each with its own seed (train.seed and model.init_seed: 1, 2, ...)")
    ap.add_argument("--seeds", type=int, nargs="+", default=None,
                    help="the repeats' seeds (default 1 to --repeats)")
    ap.add_argument("--eval-every", type=float, default=EVAL_EVERY, metavar="EPOCHS",
                    help=f"every run evaluates every EPOCHS epochs (default {EVAL_EVERY:g}, whatever its "
                         "config's train.eval_every; --set train.eval_every=... wins)")
    ap.add_argument("--set", action="append", default=[], help="extra overrides for every run")
    ap.add_argument("--out", default="runs/bench")
    ap.add_argument("--reference", default=None,
                    help="the contender every ratio and the limit are against (default: horovod "
                         "when it runs, else sync)")
    ap.add_argument("--reuse", action="store_true",
                    help="read the runs already finished in --out with the same arguments instead "
                         "of running them again (an interrupted benchmark goes on; a finished one "
                         "prints its tables)")
    ap.add_argument("--scaling", type=int, nargs="+", default=None, metavar="RANKS",
                    help="the scaling benchmark instead of --scenarios: these rank counts under "
                         "cluster profiles (hvd_adaptive/bench/scaling.py), e.g. 1 2 4 8")
    ap.add_argument("--core", type=float, default=0.25,
                    help="--scaling: cores of a full-speed rank (its cgroup CPU quota)")
    ap.add_argument("--profiles", nargs="+", default=["equal", "half"], choices=["equal", "half"],
                    help="--scaling: the cluster profiles to run")
    a = ap.parse_args(argv)
    grid = grid_sets(a.eval_every, [])  # every run's overrides start with it; 0 is refused here
    if a.scaling and (min(a.scaling) < 1 or a.core <= 0):
        raise SystemExit(f"--scaling {a.scaling} --core {a.core}: rank counts >= 1 and cores > 0")
    contenders = {name: CONTENDERS[name] for name in a.algorithms}
    contenders.update(parse_variants(a.variant))
    refuse_set_over_contender(contenders, a.set)
    if a.reference is not None and a.reference not in contenders:
        raise SystemExit(f"--reference {a.reference}: not a contender of this run ({', '.join(contenders)})")
    a.reference = a.reference or reference_of(contenders)
    seeds = a.seeds or list(range(1, a.repeats + 1))
    a.repeats = len(seeds)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    targets = a.target
    t0 = time.time()
    a.code = code_line()  # the code the runs train with, once (bench.txt's second line too)
    print(f"[bench] {a.code}", flush=True)
    if targets is None:  # sync's full run fixes the targets; every other run stops at the highest
        print(f"[bench {time.time() - t0:6.0f} s] reference: sync without slowdown, full length", flush=True)
        ref = run_one(a.config, a.ranks,
                      grid + CONTENDERS["sync"] + a.set + seed_sets(seeds[0]),
                      out / "reference-sync", reuse=a.reuse)
        final = ref["summary"]["final"]["p_at_1"]
        targets = [0.8 * final, 0.9 * final]
        print(f"[bench] target P@1 {targets[0]:.4f} and {targets[1]:.4f} (80% and 90% of {final:.4f})",
              flush=True)
    targets = sorted(targets)
    target = targets[-1]  # where every run stops
    (out / "target.txt").write_text(f"{target}\n")  # for the figures (launch/bench.sh)
    if a.scaling:
        return run_scaling(a, contenders, targets, out, t0, seeds, grid)
    phases: dict = {}
    for rep in range(a.repeats):
        for scen, factor in scenario_list(a.scenarios, a.slowdown, a.quota_slowdown):
            vary = (0.0, 0.0)
            if scen == "vary":
                vary = _vary_epochs(results, target, a.config, out)
            label, scen_sets = scenario_sets(scen, a.ranks, factor, vary)
            if scen == "vary":
                n_rows = _train_rows(out)
                phases[label] = [(vary[0] * n_rows, 1.0), (vary[1] * n_rows, factor), (float("inf"), 1.0)]
            for name, sets in contenders.items():
                why = skip_reason(name, scen, sets)
                if why:
                    if rep == 0:
                        print(f"[bench {time.time() - t0:6.0f} s] {label}: {why}", flush=True)
                    continue
                run_sets = (grid + sets + a.set + scen_sets + seed_sets(seeds[rep])
                            + [f"train.target_p_at_1={target}"])
                if scen != "even" and "hogbatch" in " ".join(sets):
                    # the slowed rank stands in for the CPU worker (small batches), as in the paper
                    run_sets.append(f"hogbatch.cpu_ranks=[{a.ranks - 1}]")
                tag = scen if scen in ("even", "vary") else f"{scen}{factor:g}"
                res = run_logged(a.config, a.ranks, run_sets, out / f"{tag}-{name}-r{rep}", target,
                                 f"{label}: {name} (seed {seeds[rep]}, {rep + 1}/{a.repeats})", t0, name,
                                 a.reuse)
                results.setdefault(label, {}).setdefault(name, []).append(res)
    text = (f"benchmark: {a.config}, {a.ranks} ranks, seeds {seeds}, "
            f"overrides {grid + a.set}\n"
            f"{a.code}\n"
            + "\n".join(table(results, t, phases, a.reference) for t in targets) + "\n")
    print(text)
    (out / "bench.txt").write_text(text)
    print(f"runs in {out}/; plot with: hvd-adaptive report {out}/even-*-r0 --target {target:.4f} "
          f"--out {out}/report.png")
    return 0


def grid_sets(eval_every: float, sets: list[str]) -> list[str]:
    """A run's overrides from the command line: the benchmark's evaluation grid first, so that a
    contender's or a `--set`'s train.eval_every among `sets` (its items, then every --set) wins."""
    if not eval_every > 0:
        raise SystemExit(f"--eval-every {eval_every:g}: must be above 0 (epochs between evaluations)")
    return [f"train.eval_every={eval_every:g}", *sets]


def refuse_set_over_contender(contenders: dict, sets: list[str]) -> None:
    """A --set of a key a contender sets itself would replace the contender's value in every run
    (the later item wins): stop before any run, naming both."""
    given = {item.partition("=")[0].strip(): item for item in sets}
    for name, items in contenders.items():
        for item in items:
            key = item.partition("=")[0].strip()
            if key in given:
                raise SystemExit(f"--set {given[key]}: contender {name} sets {item} itself, and the "
                                 f"--set would replace it in every run; set {key} in each --variant "
                                 "instead")


def seed_sets(seed: int) -> list[str]:
    """A repeat's seed: the data order (train.seed) and the initial weights (model.init_seed)."""
    return [f"train.seed={seed}", f"model.init_seed={seed}"]


def run_scaling(a: argparse.Namespace, contenders: dict, targets: list[float], out: Path,
                t0: float, seeds: list[int], grid: list[str]) -> int:
    """The scaling benchmark (hvd_adaptive/bench/scaling.py): every contender at every rank count of
    every profile, interleaved per repeat, the runs stopping at the highest target; writes
    bench.txt (a table a target) and scaling.json (the highest target's rows, the figure's)."""
    results: dict = {}
    reference = a.reference
    for rep in range(a.repeats):
        for kind, n in scaling.points(a.profiles, a.scaling):
            label, sets = scaling.profile_sets(kind, n, a.core)
            # One rank: minibatch SGD whatever the contender (speedups are over this run).
            runs = {reference: contenders.get(reference, CONTENDERS[reference])} if n == 1 else contenders
            for name, csets in runs.items():
                res = run_logged(a.config, n, grid + csets + a.set + sets
                                 + seed_sets(seeds[rep])
                                 + [f"train.target_p_at_1={targets[-1]}"],
                                 out / f"{kind}{n}-{name}-r{rep}", targets[-1],
                                 f"{label}: {name} (seed {seeds[rep]}, {rep + 1}/{a.repeats})", t0, name,
                                 a.reuse)
                results.setdefault((kind, n), {}).setdefault(name, []).append(res)
    text = (f"scaling benchmark: {a.config}, ranks {a.scaling}, {a.core:g} core a full-speed rank, "
            f"seeds {seeds}, overrides {grid + a.set}\n{a.code}\n"
            f"ref/this: {reference}'s time to the target over the contender's at the same point, per seed; "
            "a range ending (k/n): k of the n seeds reached the target, the median is theirs\n")
    data = {target: scaling.rows(results, target, reference) for target in targets}
    for target in targets:
        text += f"\ntarget P@1 {target:.4f}, medians over {a.repeats} seed(s)\n{scaling.table(data[target])}\n"
    print(text)
    (out / "bench.txt").write_text(text)
    scaling.save(data[targets[-1]], targets[-1], a.core, out / "scaling.json")
    print(f"figure: hvd-adaptive report --scaling {out}/scaling.json --out {out}/scaling.png")
    return 0


def _vary_epochs(results: dict, target: float, config: str, out: Path) -> tuple[float, float]:
    """A third and two thirds of the way to the target, in epochs: from sync's rows to the
    target in the first even run (which must come first)."""
    sync = results.get("no slowdown", {}).get("sync")
    rows = time_to_target(sync[0]["evals"], target, key="samples") if sync else None
    if not rows:
        raise SystemExit("--scenarios vary needs `even` before it and sync among the contenders "
                         "reaching the target (its rows to the target place the slow phase)")
    n = _train_rows(out)
    return rows / 3 / n, 2 * rows / 3 / n


def _train_rows(out: Path) -> int:
    """Training rows of the benchmark's data set, from any finished run's start record."""
    for metrics in sorted(out.glob(f"*/{METRICS}")):
        start = load_run(metrics.parent).start
        if start and start.get("train_rows"):
            return int(start["train_rows"])
    raise SystemExit(f"no finished run in {out} records its training rows")


if __name__ == "__main__":
    sys.exit(main())
