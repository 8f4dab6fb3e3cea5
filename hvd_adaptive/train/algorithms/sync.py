"""Horovod synchronous data-parallel SGD: the baseline a Horovod user runs today.

Every step, each rank computes the gradient of its part of one global batch, the gradients are
summed over ranks by one fused Horovod allreduce (row-sparse gradients are allgathered, so the
update stays row-sparse), and every rank applies the same update, so all replicas stay equal.
A step is three parts: gradient (local computation), allreduce (communication), update (local
computation). `sync.step: fused` (the default) runs them as one tf.function, as a plain Horovod
script does: Horovod takes each gradient as soon as the backward pass has it, and a step pays
one function call. The timed step runs them as three, with a barrier before the allreduce that
separates waiting for the slowest rank from the transfer itself; only the two local parts are
slowed by simulated heterogeneity. The proportional partition (which splits the batch by the
measured parts), the sharded update and a sleep-mode slowdown (which slows the local parts
only) always take the timed step.

partition "equal": every rank takes train.batch_size rows a step. partition "proportional"
(LB-BSP): the global batch is split so that every rank's local computation takes equally long,
from per-row and per-step times measured in the training steps themselves and re-measured
every window (blended by `sync.smoothing`, kept while within `sync.deadband`); each rank's
gradient is weighted by its share of the rows, so the summed gradient is the mean over the
global batch whatever the split.

`sync.shard_update` (on in `auto`'s gradient windows): the dense output layer's gradient is
reduce-scattered instead of allreduced, each rank applies the optimizer to its slice of rows
of the layer with its slice of the optimizer state, and the slices are allgathered. Every
rank then does 1/n of the largest per-step cost instead of all of it, for the same bytes moved
(a reduce-scatter and an allgather are an allreduce's two halves); a slow rank's update shrinks
with it, and the proportional split gives the time saved back as rows.

`auto` (the hybrid mode, algorithms/auto.py) can aggregate gradients with both.
"""
from __future__ import annotations

import numpy as np
from hvd_adaptive.tfload import tf

from hvd_adaptive.train.algorithms.base import Algorithm, RoundStats, Window, chunks
from hvd_adaptive.train.balance import balanced_partition, keep_within_deadband, smoothed
from hvd_adaptive.parallel import collectives
from hvd_adaptive.parallel.distributed import allgather, broadcast_variables
from hvd_adaptive.model.network import BATCH_SIGNATURE, Optimizer, summed_rows


class Sync(Algorithm):
    name = "sync"
    optimizer_differs_by_rank = False  # every rank applies the same summed update
    rounds_end_at_evaluations = True  # the replicas are equal after every step

    def __init__(self, ctx, partition: str = "", shard_update: bool = False):
        super().__init__(ctx)
        self.partition = partition or self.cfg.sync.partition
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
            # A row-sparse gradient holds a row for every non-zero of the batch, most features
            # several times: each rank sums its duplicates first, so fewer rows travel and the
            # update dedupes fewer (docs/benchmark.md, "The optimizer's row writes").
            grads = [summed_rows(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
            order = sorted(range(len(grads)), key=lambda i: not isinstance(grads[i], tf.IndexedSlices))
            summed = collectives.sum_group([grads[i] for i in order], name="sync_gradients")
            out = [None] * len(grads)
            for i, g in zip(order, summed):
                out[i] = g
            return out

        @tf.function(reduce_retracing=True, autograph=False)
        def update(grads):
            if self.sharded:  # decided when traced: this rank's slice of the sharded layer
                self.sharded.apply(grads)
            else:
                self.opt.apply(grads, self.variables)
            return tf.constant(0.0)

        @tf.function(input_signature=(*BATCH_SIGNATURE, tf.TensorSpec([], tf.float32)),
                     autograph=False)
        def fused(*args):
            loss, grads = gradient(*args)
            update(allreduce(grads))
            return loss

        self._gradient, self._allreduce, self._update, self._fused = gradient, allreduce, update, fused
        # The dense output layer (full softmax) is the one sharded; sampled layers and a linear
        # model's are row-sparse.
        self.sharded = None
        if ((shard_update or self.cfg.sync.shard_update) and n > 1 and not self.model.sampled
                and not self.model.linear):
            self.sharded = ShardedUpdate(self, len(self.variables) - 2)
        # Decided from the config alone, so every rank takes the same step (the timed step's
        # barrier and the fused step's allreduce must meet their peers').
        self.fused = (self.cfg.sync.step == "fused" and self.partition == "equal"
                      and not self.sharded and not self.cfg.hetero.sleeps)

    def step_functions(self) -> list:
        return [self._local_step, self._fused if self.fused else self._gradient]

    def setup(self) -> None:
        # Horovod: start every replica from rank 0's weights so they stay identical.
        broadcast_variables(self.variables)
        broadcast_variables(self.opt.slot_variables())
        if self.sharded:
            self.sharded.setup()

    def trace(self) -> None:
        super().trace()
        # The gradient functions take IndexedSlices of varying length: trace allreduce and update
        # on two batch sizes (so the traced shapes relax), effects undone, and pay Horovod's
        # first-use set-up before the clock starts.
        with self.unchanged():
            for size in (8, 16):
                rows = np.arange(min(size, self.ctx.train.n_rows))
                if self.fused:
                    self._fused(*self.batch(rows), tf.constant(0.0))
                    continue
                _, grads = self._gradient(*self.batch(rows), tf.constant(0.0))
                if self.sharded:
                    self._update(self.sharded.reduce(grads))
                    self.sharded.finish()
                else:
                    self._update(self._allreduce(grads))
        if self.sharded:  # the traced steps moved the shard: take it back from the full layer
            self.sharded.reshard()

    def step(self, rows: np.ndarray, share: float, stats: RoundStats) -> None:
        """One synchronous step on this rank's `rows`, `share` of the global batch."""
        batch = self.batch(rows, stats)
        if self.fused:  # computation, transfer and waiting in one span, counted as computation
            loss, t_step = self.hetero.compute(self._fused, *batch, tf.constant(share, tf.float32))
            stats.add_step(len(rows), float(loss), t_step)
            return
        (loss, grads), t_grad = self.hetero.compute(self._gradient, *batch, tf.constant(share, tf.float32))
        self.cluster.comm.Barrier()  # waiting for the slowest rank is not counted as transfer
        with stats.timed("comm_s"):
            summed = self.sharded.reduce(grads) if self.sharded else self._allreduce(grads)
            _ready(summed[-1])  # the allreduce has finished once its results are readable
        _, t_upd = self.hetero.compute(self._update, summed)
        if self.sharded:
            self.cluster.comm.Barrier()  # the slices are gathered once every rank updated its own
            with stats.timed("comm_s"):
                self.sharded.finish()
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
        if self.partition == "proportional":
            self._repartition(stats)
        return stats

    def _repartition(self, stats: RoundStats) -> None:
        """LB-BSP: share this window's costs (allgather) and split the global batch by them."""
        steps = max(stats.batches, 1)
        mine = (stats.extra["grad_s"] / max(stats.samples, 1), stats.extra["update_s"] / steps)
        with stats.timed("sync_s"):
            costs = np.array(allgather(self.cluster.comm, mine))
        keep = self.cfg.sync.smoothing
        self.per_row = smoothed(self.per_row, costs[:, 0], keep)
        self.per_step = smoothed(self.per_step, costs[:, 1], keep)
        self._split()

    def state(self) -> dict:
        return {"batch_sizes": self.sizes.tolist()}

    def state_dict(self) -> dict:
        if self.sharded:  # the saved optimizer state is whole, as plain sync's (every rank)
            self.sharded.gather_state()
        return {**super().state_dict(), **self.own_state()}

    def own_state(self) -> dict:
        return {"sync.sizes": self.sizes.copy(), "sync.per_row": self.per_row.copy(),
                "sync.per_step": self.per_step.copy()}

    def on_calibrated(self, rates: list) -> None:
        """The proportional split starts from the ranks' standalone rows/s (measured before the
        clock starts), so the first window is balanced too; the windows' own timings refine it."""
        if self.partition == "proportional" and not self.per_row.any():
            self.per_row = 1.0 / np.maximum(np.asarray(rates, dtype=float), 1e-9)
            self._split()

    def _split(self) -> None:
        """The balanced split of the current costs, unless it is within the deadband."""
        new = balanced_partition(self.global_batch, self.per_row, self.per_step,
                                 self.cfg.sync.min_batch)
        self.sizes = keep_within_deadband(self.sizes, new,
                                          self.cfg.sync.deadband * self.cfg.train.batch_size)

    def load_state_dict(self, d: dict) -> None:
        super().load_state_dict(d)
        self.load_own(d)

    def load_own(self, d: dict) -> None:
        """Sync's own part of a checkpoint (after the model and optimizer are restored)."""
        if self.sharded:
            self.sharded.reshard()
        n = self.cluster.size
        self.sizes = self.per_rank(d, "sync.sizes", np.full(n, self.cfg.train.batch_size, np.int64))
        self.per_row = self.per_rank(d, "sync.per_row", np.zeros(n))
        self.per_step = self.per_rank(d, "sync.per_step", np.zeros(n))


def _ready(t) -> None:
    """Waits until a tensor is computed (kernels may run asynchronously on a GPU)."""
    (t.values if isinstance(t, tf.IndexedSlices) else t).numpy()


class ShardedUpdate:
    """The dense output layer's update spread over the ranks (sync.shard_update).

    Horovod's reduce-scatter splits the layer's rows (hidden units) evenly over the ranks; rank
    r keeps its rows [lo, hi) of the layer and of its optimizer state in variables of its own,
    updated by an optimizer of the same kind. `reduce` replaces the layer's gradient by this
    rank's summed slice (the rest is allreduced as in sync), the sync update then applies the
    slice (`_update` calls `apply`), and `finish` allgathers the slices into the whole layer.
    The whole layer's optimizer state is stale during training: `gather_state` fills it for a
    checkpoint, `reshard` takes the slice back from it (after tracing, on resume).
    """

    def __init__(self, algo: Sync, index: int):
        self.algo, self.index = algo, index
        self.full = algo.variables[index]
        self.full_slots = algo.opt.slots[index]
        rows = int(self.full.shape[0])
        # Which rows Horovod's reduce-scatter gives this rank: scatter the row numbers once.
        got = collectives.mean_scatter(tf.range(rows, dtype=tf.float64)[:, None],
                                       name="shard_rows").numpy()[:, 0].astype(np.int64)
        self.lo, self.hi = int(got[0]), int(got[-1]) + 1
        if not np.array_equal(got, np.arange(self.lo, self.hi)):
            raise RuntimeError(f"reduce-scatter gave rows {got.tolist()}: not one contiguous block")
        self.part = tf.Variable(self.full[self.lo:self.hi], trainable=False, name="shard")
        # A slice of the dense output layer: per-weight state under every optimizer.
        self.opt = Optimizer([self.part], algo.cfg.optim, row_axes=[None])

        @tf.function(reduce_retracing=True, autograph=False)
        def reduce(grads):
            grads = list(grads)
            # Horovod: the sharded layer's gradient is summed and scattered (each rank gets its
            # rows); everything else is summed whole as in sync.
            part = collectives.sum_scatter(grads[index], name="shard_gradient")
            rest = algo._allreduce([g for i, g in enumerate(grads) if i != index])
            return [*rest[:index], part, *rest[index:]]

        @tf.function(autograph=False)
        def gather():
            # Horovod: every rank's updated rows, concatenated in rank order = the whole layer.
            self.full.assign(collectives.concat_rows(self.part, name="shard_gather"))
            return tf.constant(0.0)

        self.reduce, self.finish = reduce, gather

    def apply(self, grads) -> None:
        """The optimizer step: the whole update for every other variable, this rank's rows for
        the sharded layer (whose gradient `reduce` made this rank's slice)."""
        grads = list(grads)
        part, grads[self.index] = grads[self.index], None
        self.algo.opt.apply(grads, self.algo.variables)
        self.opt.lr.assign(self.algo.opt.lr)
        self.opt.apply([part], [self.part])

    def setup(self) -> None:
        self.reshard()
        self.finish()  # pays Horovod's first allgather before the clock starts

    def reshard(self) -> None:
        """This rank's slice of the layer and of its optimizer state, from the whole ones."""
        self.part.assign(self.full[self.lo:self.hi])
        for mine, whole in zip(self.opt.slots[0], self.full_slots):
            mine.assign(whole[self.lo:self.hi])
        self.opt.t.assign(self.algo.opt.t)

    def gather_state(self) -> None:
        """Fills the whole layer's optimizer state from every rank's slice (collective)."""
        for i, (mine, whole) in enumerate(zip(self.opt.slots[0], self.full_slots)):
            whole.assign(collectives.concat_rows(mine, name=f"shard_state_{i}"))
