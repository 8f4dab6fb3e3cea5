"""auto, the hybrid mode: each window, the kind of training that measured more goodput.

Not the recommended mode: adaptive SGD with adaptive.label_norm reached every benchmark target
sooner than auto (docs/benchmark.md), and auto needed more rows than either of its two modes.

Two ways to train a window of S rows, both already in the harness and sharing one model and
one optimizer:

- gradient aggregation (`grad`): sync with the speed-balanced split (sync.partition
  proportional, started from the standalone rates and re-measured every window), optionally
  with the sharded output-layer update (auto.shard_update). It needs sync's rows to reach an
  accuracy; its speed is capped by the per-step allreduce and by what the split cannot
  balance.
- model averaging (`avg`): adaptive SGD's window (dynamic scheduling, per-rank batch sizes,
  the normalized merge). No rank waits, and one merge replaces a window of allreduces, but the
  replicas drift apart: it needs more rows (auto.averaging_cost times sync's).

Goodput is rows per second times rows' worth: a window merges only when adaptive SGD's rows
per second, measured on this run's own windows, beat gradient aggregation's by more than
`auto.averaging_cost`. The first window aggregates gradients, the second averages (both are
measured), and afterwards the mode not chosen is probed once every `auto.probe_every` windows,
so a rank that turns slower or recovers changes the choice. Every rank takes the same decision
from the same allgathered figures.

Both modes leave identical replicas and optimizer state on every rank at a window's end (sync by
construction; adaptive SGD merges its optimizer state with the model, adaptive.opt_state
average), so a window of either kind continues from the other's. The sharded update keeps its
part of the optimizer state apart: it is gathered before an averaging window and scattered
before a gradient window.
"""
from __future__ import annotations

import time

import numpy as np

from hvd_adaptive.train.algorithms.adaptive import Adaptive
from hvd_adaptive.train.balance import MODES, choose_mode
from hvd_adaptive.train.algorithms.base import Algorithm, RoundStats, Window
from hvd_adaptive.train.algorithms.sync import Sync
from hvd_adaptive.parallel.distributed import allgather
from hvd_adaptive.config import ConfigError

class Auto(Algorithm):
    name = "auto"

    def __init__(self, ctx):
        super().__init__(ctx)
        if self.cfg.adaptive.opt_state != "average":
            raise ConfigError("train.algorithm auto: needs adaptive.opt_state=average (after an "
                              "averaging window every rank must hold the same optimizer state)")
        self.grad = Sync(ctx, partition="proportional", shard_update=self.cfg.auto.shard_update)
        self.avg = Adaptive(ctx)
        self.rates: dict = {m: None for m in MODES}
        self.last_probe: dict = {}
        self.last_mode = "grad"
        self.counts = {m: 0 for m in MODES}

    def setup(self) -> None:
        self.grad.setup()
        self.avg.setup()

    def trace(self) -> None:
        self.avg.trace()
        self.grad.trace()  # last: it takes the shard back from the whole layer

    def step_functions(self) -> list:
        return [*self.grad.step_functions(), *self.avg.step_functions()]

    def on_calibrated(self, rates: list) -> None:
        self.grad.on_calibrated(rates)

    def set_lr(self, lr: float) -> None:
        super().set_lr(lr)
        self.grad.set_lr(lr)
        self.avg.set_lr(lr)

    def train_window(self, w: Window) -> RoundStats:
        a = self.cfg.auto
        mode = choose_mode(w.index, self.rates, self.last_probe, a.averaging_cost, a.probe_every)
        sharded = self.grad.sharded
        if sharded and mode != self.last_mode:
            # The sharded part of the optimizer state: whole for adaptive SGD's local steps,
            # back in slices for gradient aggregation (identical on every rank both ways).
            sharded.gather_state() if mode == "avg" else sharded.reshard()
        counter = self.avg.counter
        if mode == "avg" and self.last_mode != "avg" and counter is not None:
            # The shared counter zeroes a window's slot during the window before it, which was
            # not adaptive SGD's: zero this one now, and let nobody claim before it is.
            counter.prepare(w.index - 1)
            self.cluster.comm.Barrier()
        t0 = time.perf_counter()
        stats = (self.grad if mode == "grad" else self.avg).train_window(w)
        elapsed = time.perf_counter() - t0
        with stats.timed("sync_s"):
            figs = np.array(allgather(self.cluster.comm, (stats.samples, elapsed)))
        rate = figs[:, 0].sum() / max(figs[:, 1].max(), 1e-9)
        old = self.rates[mode]
        self.rates[mode] = rate if old is None else 0.5 * old + 0.5 * rate
        self.last_probe[mode] = w.index
        self.last_mode = mode
        self.counts[mode] += 1
        stats.extra.update(mode=mode, mode_rows_s=float(rate))
        return stats

    def state(self) -> dict:
        return {"windows_by_mode": dict(self.counts),
                "rows_per_s": {m: r and round(r, 1) for m, r in self.rates.items()},
                "grad": self.grad.state(), "avg": self.avg.state()}

    # ---- checkpoints: one model and optimizer (base), each mode's own state, the choice ----
    def state_dict(self) -> dict:
        if self.grad.sharded and self.last_mode == "grad":
            self.grad.sharded.gather_state()
        return {**super().state_dict(), **self.grad.own_state(), **self.avg.own_state(),
                "auto.rates": [self.rates[m] if self.rates[m] is not None else -1.0 for m in MODES],
                "auto.last_probe": [self.last_probe.get(m, -1) for m in MODES],
                "auto.counts": [self.counts[m] for m in MODES],
                "auto.last_mode": self.last_mode}

    def load_state_dict(self, d: dict) -> None:
        super().load_state_dict(d)
        for part in (self.grad, self.avg):
            part.resized = self.resized
        self.avg.load_own(d)
        self.grad.load_own(d)  # takes the shard from the restored whole optimizer state
        self.rates = {m: (r if r >= 0 else None) for m, r in zip(MODES, d["auto.rates"])}
        self.last_probe = {m: int(p) for m, p in zip(MODES, d["auto.last_probe"]) if p >= 0}
        self.counts = {m: int(c) for m, c in zip(MODES, d["auto.counts"])}
        self.last_mode = "grad"  # the shard was just taken from the whole state
