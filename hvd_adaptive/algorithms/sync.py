"""Horovod synchronous data-parallel SGD: the baseline a Horovod user runs today.

Every step, each rank computes the gradient of its part of one global batch, the gradients are
summed over ranks by one fused Horovod allreduce (row-sparse gradients are allgathered, so the
update stays row-sparse), and every rank applies the same update, so all replicas stay equal.
A step is three parts: gradient (local computation), allreduce (communication), update (local
computation); only the two local parts are slowed by simulated heterogeneity, and a barrier
before the allreduce separates waiting for the slowest rank from the transfer itself.

partition "equal": every rank takes train.batch_size rows a step. partition "proportional"
(LB-BSP): the global batch is split so that every rank's local computation takes equally long,
from per-row and per-step times measured in the training steps themselves and re-measured
every window (blended by `sync.smoothing`); each rank's gradient is weighted by its share of the rows, so
the summed gradient is the mean over the global batch whatever the split.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

from hvd_adaptive.algorithms.base import Algorithm, RoundStats, Window, chunks
from hvd_adaptive.balance import balanced_partition
from hvd_adaptive.distributed import allgather, broadcast_variables
from hvd_adaptive.model import BATCH_SIGNATURE


class Sync(Algorithm):
    name = "sync"
    optimizer_differs_by_rank = False  # every rank applies the same summed update

    def __init__(self, ctx):
        super().__init__(ctx)
        n = self.cluster.size
        self.global_batch = self.cfg.train.batch_size * n
        self.sizes = np.full(n, self.cfg.train.batch_size, np.int64)
        # Smoothed per-rank costs of local computation: seconds per row, seconds per step.
        self.per_row = np.zeros(n)
        self.per_step = np.zeros(n)

        @tf.function(input_signature=(*BATCH_SIGNATURE, tf.TensorSpec([], tf.float32)),
                     autograph=False)
        def gradient(*args):
            *batch, share = args
            with tf.GradientTape() as tape:
                # Scaled by this rank's share of the step's rows: the sum over ranks is then the
                # mean over the global batch, whatever the split.
                loss = self.model.loss(*batch, training=True)
                scaled = loss * share
            return loss, tape.gradient(scaled, self.variables)

        @tf.function(reduce_retracing=True, autograph=False)
        def allreduce(grads):
            # Horovod: one fused allreduce (Sum) of every gradient; IndexedSlices are allgathered.
            # Horovod 0.28.1 takes each allgathered slice's dense_shape from the group's tensors
            # by position among the slices, so the row-sparse gradients go first (with the
            # sampled output layer there are three: input layer, output layer, output bias).
            grads = list(grads)
            order = sorted(range(len(grads)), key=lambda i: not isinstance(grads[i], tf.IndexedSlices))
            summed = hvd.grouped_allreduce([grads[i] for i in order], op=hvd.Sum, name="sync_gradients")
            out = [None] * len(grads)
            for i, g in zip(order, summed):
                out[i] = g
            return out

        @tf.function(reduce_retracing=True, autograph=False)
        def update(grads):
            self.opt.apply(grads, self.variables)
            return tf.constant(0.0)

        self._gradient, self._allreduce, self._update = gradient, allreduce, update

    def step_functions(self) -> list:
        return [self._local_step, self._gradient]

    def setup(self) -> None:
        # Horovod: start every replica from rank 0's weights so they stay identical.
        broadcast_variables(self.variables)
        broadcast_variables(self.opt.slot_variables())

    def trace(self) -> None:
        super().trace()
        # The gradient functions take IndexedSlices of varying length: trace allreduce and update
        # on two batch sizes (so the traced shapes relax), effects undone, and pay Horovod's
        # first-use set-up before the clock starts.
        with self.unchanged():
            for size in (8, 16):
                rows = np.arange(min(size, self.ctx.train.n_rows))
                _, grads = self._gradient(*self.batch(rows), tf.constant(0.0))
                self._update(self._allreduce(grads))

    def step(self, rows: np.ndarray, share: float, stats: RoundStats) -> None:
        """One synchronous step on this rank's `rows`, `share` of the global batch."""
        batch = self.batch(rows, stats)
        (loss, grads), t_grad = self.hetero.compute(self._gradient, *batch, tf.constant(share, tf.float32))
        self.cluster.comm.Barrier()  # waiting for the slowest rank is not counted as transfer
        with stats.timed("comm_s"):
            summed = self._allreduce(grads)
            _ready(summed[-1])  # the allreduce has finished once its results are readable
        _, t_upd = self.hetero.compute(self._update, summed)
        stats.add_step(len(rows), float(loss), t_grad + t_upd)
        stats.extra["grad_s"] = stats.extra.get("grad_s", 0.0) + t_grad
        stats.extra["update_s"] = stats.extra.get("update_s", 0.0) + t_upd

    def train_window(self, w: Window) -> RoundStats:
        r = self.cluster.rank
        stats = RoundStats(epoch=w.progress, batch_size=int(self.sizes[r]), lr=float(self.opt.lr))
        step_total = int(self.sizes.sum())
        for lo, hi in chunks(w.end - w.start, step_total):
            pos, take = w.start + lo, hi - lo
            sizes = self.sizes.copy() if take == step_total else np.floor(
                self.sizes * take / step_total).astype(np.int64)
            sizes[-1] += take - sizes.sum()  # every row of the window is covered
            off = np.concatenate([[0], np.cumsum(sizes)])
            self.step(w.perm[pos + off[r]: pos + off[r + 1]], float(sizes[r] / take), stats)
        stats.weight = float(self.sizes[r] / step_total)
        if self.cfg.sync.partition == "proportional":
            self._repartition(stats)
        return stats

    def _repartition(self, stats: RoundStats) -> None:
        """LB-BSP: share this window's costs (allgather) and split the global batch by them."""
        steps = max(stats.batches, 1)
        mine = (stats.extra["grad_s"] / max(stats.samples, 1), stats.extra["update_s"] / steps)
        with stats.timed("sync_s"):
            costs = np.array(allgather(self.cluster.comm, mine))
        keep = self.cfg.sync.smoothing if self.per_row.any() else 0.0
        self.per_row = keep * self.per_row + (1 - keep) * costs[:, 0]
        self.per_step = keep * self.per_step + (1 - keep) * costs[:, 1]
        self.sizes = balanced_partition(self.global_batch, self.per_row, self.per_step,
                                        self.cfg.sync.min_batch)

    def state(self) -> dict:
        return {"batch_sizes": self.sizes.tolist()}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "sync.sizes": self.sizes.copy(),
                "sync.per_row": self.per_row.copy(), "sync.per_step": self.per_step.copy()}

    def load_state_dict(self, d: dict) -> None:
        super().load_state_dict(d)
        n = self.cluster.size
        self.sizes = self.per_rank(d, "sync.sizes", np.full(n, self.cfg.train.batch_size, np.int64))
        self.per_row = self.per_rank(d, "sync.per_row", np.zeros(n))
        self.per_step = self.per_rank(d, "sync.per_step", np.zeros(n))


def _ready(t) -> None:
    """Waits until a tensor is computed (kernels may run asynchronously on a GPU)."""
    (t.values if isinstance(t, tf.IndexedSlices) else t).numpy()
