"""`optim.lr: auto`: the learning rate chosen for the data, model and batch by a short probe.

Every candidate rate trains the same rows from the same start for a few steps, and the rate
whose model has the lowest loss on rows it did not train wins. The ranks share the candidates
(rank r tries candidates r, r + n, ...), so the probe costs about ceil(candidates / ranks)
short trainings, and every rank takes the same choice from one allgather of the losses. The
probe runs inside each rank's slowdown and its seconds are charged to the run's clock: what a
choice costs counts in the time to a target.

The rule, the candidates and the probe's size are the module's; how a candidate trains is the
caller's (`choose`), so the project's algorithms (`probe`) and the plain Horovod script of the
benchmark (hvd_adaptive.plain_horovod) choose the same way with their own steps.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional, Sequence

import numpy as np

from hvd_adaptive.config import ConfigError

# Candidates per optimizer: geometric, a factor of 2 apart.
CANDIDATES = {
    "adagrad": (0.025, 0.05, 0.1, 0.2, 0.4),
    "rowwise_adagrad": (0.025, 0.05, 0.1, 0.2, 0.4),
    "sgd": (0.25, 0.5, 1.0, 2.0, 4.0),
    "momentum": (0.025, 0.05, 0.1, 0.2, 0.4),
    "adam": (0.00025, 0.0005, 0.001, 0.002, 0.004),
}
PROBE_STEPS = 8         # steps each candidate trains
HELD_OUT_ROWS = 1024    # rows, not trained by the probe, whose loss judges the candidates
PROBE_SEED = 7919       # the probe's rows: a permutation of its own, the same on every rank


@dataclass
class LrChoice:
    """What `optim.lr: auto` chose, and how (the start record's `lr_choice`)."""

    lr: float
    candidates: list
    losses: list           # held-out loss after the probe, per candidate (nan: diverged)
    start_loss: float      # held-out loss of the untrained start
    steps: int
    rows: int              # rows a candidate trained
    held_out_rows: int
    seconds: float         # the probe's wall time on the slowest rank (charged to the clock)

    def record(self) -> dict:
        def short(v):
            return round(v, 6) if isinstance(v, float) else [short(x) for x in v] if isinstance(v, list) else v
        return {k: short(v) for k, v in asdict(self).items()}

    def line(self) -> str:
        tried = ", ".join(f"{c:g}: {l:.4f}" for c, l in zip(self.candidates, self.losses))
        return (f"optim.lr auto: {self.lr:g} (held-out loss after {self.steps} steps of "
                f"{self.rows // max(self.steps, 1)} rows from {self.start_loss:.4f}: {tried}; "
                f"{self.seconds:.2f} s, charged to the clock)")


def probe_rows(n_rows: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows the candidates train (PROBE_STEPS batches) and the held-out rows that judge
    them: disjoint slices of one seeded permutation of the training rows. On small data sets
    the batches shrink so that a quarter of the rows stays held out."""
    perm = np.random.default_rng(PROBE_SEED).permutation(n_rows)
    held = min(HELD_OUT_ROWS, max(1, n_rows // 4))
    train = perm[held:held + min(PROBE_STEPS * batch_size, n_rows - held)]
    return train, perm[:held]


def pick(candidates: Sequence[float], losses: Sequence[float], start_loss: float,
         optimizer: str) -> float:
    """The candidate with the lowest held-out loss.

    Raises:
        ConfigError: no candidate lowered the held-out loss below the start's (rows without
            labels, labels unrelated to the features, or every rate diverged).
    """
    finite = [(l, c) for c, l in zip(candidates, losses) if math.isfinite(l)]
    if not finite or min(finite)[0] >= start_loss * (1 - 1e-4):
        tried = ", ".join(f"{c:g}: {l:.4g}" for c, l in zip(candidates, losses))
        raise ConfigError(
            f"optim.lr=auto: no candidate rate of {optimizer} learned in the probe (held-out loss "
            f"from {start_loss:.4g} to {tried}); check that the training rows have labels that "
            "depend on their features, or pin optim.lr")
    return min(finite)[1]


def choose(candidates: Sequence[float], try_rate: Callable[[float], float], start_loss: float,
           rank: int, size: int, allgather: Callable[[object], list], optimizer: str) -> LrChoice:
    """Runs this rank's share of the candidates and returns the choice every rank makes.

    Args:
        candidates: the rates to try.
        try_rate: trains the probe's rows at a rate from the common start and returns the
            held-out loss (nan or inf when it diverged); leaves the start as it found it.
        start_loss: the held-out loss of the start.
        rank, size: this rank and the ranks sharing the candidates.
        allgather: the job's allgather of a Python object.
        optimizer: the optimizer's name, for the error message.
    """
    t0 = time.perf_counter()
    mine = {}
    for i in range(rank, len(candidates), size):
        loss = float(try_rate(float(candidates[i])))
        mine[i] = loss if math.isfinite(loss) else float("nan")
    seconds = time.perf_counter() - t0
    gathered = allgather((mine, seconds))
    losses = [float("nan")] * len(candidates)
    for part, _ in gathered:
        for i, loss in part.items():
            losses[i] = loss
    return LrChoice(lr=pick(candidates, losses, start_loss, optimizer),
                    candidates=[float(c) for c in candidates], losses=losses,
                    start_loss=float(start_loss), steps=PROBE_STEPS, rows=0, held_out_rows=0,
                    seconds=max(s for _, s in gathered))


def candidates_for(optimizer: str) -> tuple:
    return CANDIDATES[optimizer]


def probe(algo, allgather: Callable[[object], list]) -> Optional[LrChoice]:
    """`optim.lr: auto` for one of the project's algorithms: each candidate runs the algorithm's
    local training step (`Algorithm.local_step`'s traced function, with its slowdown) on the
    probe's rows from the model as it stands, which is then put back (`Algorithm.unchanged`).
    None when the rate is pinned."""
    cfg = algo.cfg
    if cfg.optim.lr != "auto":
        return None
    ds = algo.ctx.train
    train_rows, held_rows = probe_rows(ds.n_rows, cfg.train.batch_size)
    steps = [algo.batch(b) for b in np.array_split(train_rows, PROBE_STEPS) if len(b)]
    held = algo.batch(held_rows)

    def held_out_loss() -> float:
        return float(algo.held_out_loss(*held))

    def try_rate(lr: float) -> float:
        with algo.unchanged():
            algo.opt.lr.assign(lr)
            for b in steps:
                algo.probe_step(*b)
            return held_out_loss()

    start_loss = held_out_loss()
    choice = choose(candidates_for(cfg.optim.name), try_rate, start_loss, algo.cluster.rank,
                    algo.cluster.size, allgather, cfg.optim.name)
    choice.rows, choice.held_out_rows = len(train_rows), len(held_rows)
    return choice
