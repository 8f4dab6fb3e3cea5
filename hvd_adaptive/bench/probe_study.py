"""What `optim.lr: auto`'s judge sees: per candidate rate, the probe's training (its steps of
PROBE_BATCH rows from one start) on one rank, judged on held-out training rows at several
horizons by loss, P@1 and P@5, and at each horizon the candidate `tune.best` picks and the rate
`tune.settle` makes of it (and what both would give with P@1 or P@1+P@5 in place of P@5).

The evidence behind the probe's size and rule (docs/benchmark.md, "Settings chosen by the
tool"); compare the picks with a grid of fixed rates run by hvd_adaptive.bench.speed.

    mpirun -np 1 python -m hvd_adaptive.bench.probe_study --config configs/pypi.yaml \\
        --rates 0.02 0.04 0.08 0.16 --seeds 1 2 3 --horizons 512 1024 2048 4096

Each seed sets `train.seed` and `model.init_seed` (the start) and the permutation that splits
the probe's rows from the held-out ones.
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from hvd_adaptive.config import load_config, model_for, resolve
from hvd_adaptive.data import load_data, split_validation
from hvd_adaptive.parallel import distributed
from hvd_adaptive.train import tune
from hvd_adaptive.train.build import build_algorithm


# The rule's score (P@5, the first) and others it was compared with, within the same loss slack:
# (P@1, P@5) -> score.
JUDGES = {"P@5": lambda p1, p5: p5, "P@1": lambda p1, p5: p1, "P@1+P@5": lambda p1, p5: p1 + p5}


def study(cfg, cluster, train, rates, horizons, batch: int, held_rows: int, seed: int,
          labels: str = "auto") -> dict:
    """{rate: {horizon: (loss, P@1, P@5)}} for one seed on the training rows `train`, and
    prints a line per rate. `labels`: the judge's labels, as the probe takes them
    (`tune.judge_labels` of the held-out rows and the rows of the longest horizon: "auto"),
    every label ("all"), or both judges side by side ("both": a line per judge)."""
    algo = build_algorithm(cfg, cluster, train)
    algo.setup()
    algo.trace()
    perm = np.random.default_rng(seed * 1000 + 7).permutation(train.n_rows)
    held, rest = perm[:held_rows], perm[held_rows:]
    chosen = tune.judge_labels(train, rest[:max(horizons)], held)
    every = tune.EVERY_LABEL
    judges = {"auto": {"": chosen}, "all": {"": every},
              "both": {" all": every, f" {len(chosen[0]) or train.n_labels} labels": chosen}}[labels]
    judges = {name: tune.HeldOut(train, held, cfg.train.eval_memory_mb, algo.batch, labels=l)
              for name, l in judges.items()}
    out = {name: {} for name in judges}
    with algo.unchanged() as restore:
        for lr in rates:
            algo.opt.lr.assign(lr)
            done, res, t0 = 0, {name: {} for name in judges}, time.perf_counter()
            for h in horizons:
                while done < h:
                    start = done % len(rest)
                    rows = rest[start:start + batch]
                    algo.probe_step(*algo.batch(rows))
                    done += len(rows)
                for name, judge in judges.items():
                    sums = judge.sums(algo.held_out)
                    loss, p5 = judge.judged(sums)
                    res[name][h] = (loss, sums[4] / max(sums[3], 1.0), p5)
            restore()
            for name in judges:
                out[name][lr] = res[name]
                print(f"seed {seed} lr {lr:g}{name}  " + "  ".join(
                    f"{h}: {l:.4f}/{p1:.4f}/{p5:.4f}" for h, (l, p1, p5) in res[name].items())
                    + f"  ({time.perf_counter() - t0:.1f} s)", flush=True)
    for name in judges:
        for h in horizons:
            losses = [out[name][r][h][0] for r in rates]
            picks = {}
            for score_name, score in JUDGES.items():
                scores = [score(*out[name][r][h][1:]) for r in rates]
                i = tune.best(losses, scores)
                picks[score_name] = (rates[i], tune.settle(rates, losses, scores, i))
            best, rule = picks.pop("P@5")
            print(f"seed {seed}{name} rows {h}: the rule picks {rule:g} (the best candidate {best:g}; "
                  + ", ".join(f"by {n}: {b:g}, then {r:g}" for n, (b, r) in picks.items())
                  + ")", flush=True)
    return out[next(iter(judges))]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--set", action="append", default=[], help="section.key=value overrides")
    ap.add_argument("--rates", type=float, nargs="+", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1])
    ap.add_argument("--horizons", type=int, nargs="+", default=[512, 1024, 2048, 4096],
                    help="probe rows after which the candidates are judged")
    ap.add_argument("--batch", type=int, default=tune.PROBE_BATCH)
    ap.add_argument("--held", type=int, default=tune.HELD_OUT_ROWS, help="held-out rows")
    ap.add_argument("--labels", choices=("auto", "all", "both"), default="auto",
                    help="the judge's labels: as the probe takes them (tune.judge_labels), every "
                         "label, or both judges side by side")
    a = ap.parse_args(argv)
    cluster = distributed.init(threads=1)
    print("loss/P@1/P@5 of the held-out rows after that many probe rows", flush=True)
    train = None  # the data does not depend on the seed: read once
    for seed in a.seeds:
        cfg, _ = load_config(a.config, a.set + [f"train.seed={seed}", f"model.init_seed={seed}"])
        cfg = resolve(cfg, 1)
        if train is None:
            train, _ = split_validation(cfg, load_data(cfg, True, cluster.comm.Barrier)[0])
        # The model as a run on these rows chooses it (model.hidden, loss and output auto).
        cfg = dataclasses.replace(cfg, model=model_for(cfg.model, train.n_features,
                                                       train.n_labels, train.nnz_a_row))
        study(cfg, cluster, train, a.rates, sorted(a.horizons), a.batch, a.held, seed, a.labels)


if __name__ == "__main__":
    main()
