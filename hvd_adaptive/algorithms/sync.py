"""Horovod synchronous data-parallel SGD: the baseline a Horovod user runs today.

Every step, each rank computes gradients on its part of one global batch and
DistributedGradientTape sums them over ranks before the update, so all replicas stay equal.
partition "equal": every rank takes train.batch_size rows. partition "proportional" (LB-BSP):
the global batch is split in proportion to each rank's speed, re-measured at every epoch start
and shared by allgather; gradients are weighted by batch share b_i / sum b.
"""
from __future__ import annotations

import time

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

from hvd_adaptive.algorithms.base import Algorithm, RoundStats, Window, chunks
from hvd_adaptive.balance import proportional_partition
from hvd_adaptive.distributed import allgather, broadcast_variables
from hvd_adaptive.model import BATCH_SIGNATURE


class Sync(Algorithm):
    name = "sync"
    slots_differ = False  # every rank applies the same summed gradient

    def __init__(self, ctx):
        super().__init__(ctx)
        n = self.cluster.size
        self.global_batch = self.cfg.train.batch_size * n
        self.sizes = np.full(n, self.cfg.train.batch_size, np.int64)
        self.rates = np.ones(n)
        self._epoch = -1

        @tf.function(input_signature=(*BATCH_SIGNATURE, tf.TensorSpec([], tf.float32)))
        def sync_step(*args):
            *batch, share = args
            with tf.GradientTape() as tape:
                # Scaling by this rank's share of the step's rows makes the summed gradient the
                # mean over the global batch, whatever the split.
                loss = self.model.loss(*batch, training=True) * share
            # Horovod: allreduce (Sum) of the gradients; IndexedSlices of the input layer are
            # allgathered, so the update stays row-sparse.
            tape = hvd.DistributedGradientTape(tape, op=hvd.Sum)
            grads = tape.gradient(loss, self.variables)
            self.opt.apply(grads, self.variables)
            return loss / tf.maximum(share, 1e-12)

        self._sync_step = sync_step

    def step_functions(self) -> list:
        return [self._sync_step, self._grad_only]

    def setup(self) -> None:
        # Horovod: start every replica from rank 0's weights so they stay identical.
        broadcast_variables(self.variables)
        broadcast_variables(self.opt.slot_variables())
        # Horovod sets up its collectives on first use (seconds); a step with share 0 has zero
        # gradients and changes nothing, so that cost is paid before the clock starts.
        rows = np.arange(min(self.cfg.train.batch_size, self.ctx.train.n_rows))
        self._sync_step(*self.batch(rows), tf.constant(0.0, tf.float32))

    def _repartition(self) -> None:
        """LB-BSP: measure speeds (allgather) and split the global batch accordingly."""
        rate = self.calibrate(int(self.sizes[self.cluster.rank]), steps=2)
        self.rates = np.array(allgather(self.cluster.comm, rate))
        self.sizes = proportional_partition(self.global_batch, self.rates, self.cfg.sync.min_batch)

    def train_window(self, w: Window) -> RoundStats:
        if self.cfg.sync.partition == "proportional" and w.epoch != self._epoch:
            self._repartition()
            self._epoch = w.epoch
        r = self.cluster.rank
        stats = RoundStats(epoch=w.progress, batch_size=int(self.sizes[r]), lr=float(self.opt.lr))
        step_total = int(self.sizes.sum())
        t_busy = 0.0
        for lo, hi in chunks(w.end - w.start, step_total):
            pos, take = w.start + lo, hi - lo
            sizes = self.sizes.copy() if take == step_total else np.floor(
                self.sizes * take / step_total).astype(np.int64)
            sizes[-1] += take - sizes.sum()  # every row of the window is covered
            off = np.concatenate([[0], np.cumsum(sizes)])
            rows = w.perm[pos + off[r]: pos + off[r + 1]]
            batch = self.batch(rows)
            t0 = time.perf_counter()
            loss = float(self._sync_step(*batch, tf.constant(len(rows) / take, tf.float32)))
            dt = time.perf_counter() - t0
            # The step time includes the allreduce; for a slowed rank (the last to arrive) it is
            # close to its own compute time.
            self.simulate_slowdown(dt)
            t_busy += time.perf_counter() - t0
            stats.batches += 1
            stats.samples += len(rows)
            stats.loss_sum += loss * len(rows)
        stats.compute_s = t_busy
        stats.weight = float(self.sizes[r] / step_total)
        return stats

    def state(self) -> dict:
        return {"batch_sizes": self.sizes.tolist()}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "sync.sizes": self.sizes.copy(),
                "sync.rates": self.rates.copy(), "sync.epoch": self._epoch}

    def load_state_dict(self, d: dict) -> None:
        super().load_state_dict(d)
        n = self.cluster.size
        self.sizes = self.per_rank(d, "sync.sizes", np.full(n, self.cfg.train.batch_size, np.int64))
        self.rates = self.per_rank(d, "sync.rates", np.ones(n))
        # On another rank count, proportional partition re-measures at the next window.
        self._epoch = -1 if self.resized else int(d["sync.epoch"])
