"""Adaptive SGD for heterogeneous ranks (Ma, Rusu, Wu, Sim): the heart of hvd_adaptive.

Per merge window of S rows (train.window_samples):
1. Dynamic scheduling: ranks claim batches from the window's slice of the epoch's shuffled
   stream through a shared counter (MPI one-sided Fetch_and_op on rank 0) until the budget is
   spent; a faster rank comes back sooner and so takes more batches. Every row once per epoch.
2. Timing exchange: an mpi4py allgather of batches, rows and seconds; p_i = batches of rank i
   / all batches of the window.
3. Normalized model merging: theta = sum_i w_i theta_i / sum_i w_i with w_i = p_i (adaptive
   normalization may tilt them, see balance.merge_weights), row-normalized for the row-sparse
   layers and the full softmax's labels, moving only touched rows, by one fused Horovod
   allreduce (hvd_adaptive/parallel/merge.py).
4. Optional block momentum on the merged model.
5. After warm-up, batch sizes move toward equal update counts per window (additive or
   proportional policy) and each rank's learning rate scales with its batch size.
"""
from __future__ import annotations

import numpy as np
from hvd_adaptive.tfload import tf

from hvd_adaptive.train import balance
from hvd_adaptive.train.algorithms.base import Algorithm, RoundStats, Window, chunks
from hvd_adaptive.parallel.distributed import allgather, broadcast_variables, shared_counter
from hvd_adaptive.parallel.merge import Merge
from hvd_adaptive.model.network import SparseMLP


class Adaptive(Algorithm):
    name = "adaptive"

    def __init__(self, ctx):
        super().__init__(ctx)
        a = self.adaptive_cfg = self.cfg.adaptive
        self.b_max, self.b_min = a.b_max, a.b_min  # resolved: b_min <= b_max (config.resolve)
        n = self.cluster.size
        self.sizes = np.full(n, a.b_warm if a.warmup_epochs > 0 else self.b_max, np.int64)
        self.warm = a.warmup_epochs > 0
        self.shares = np.full(n, 1.0 / n)  # p_i: each rank's part of the last window (batches or rows)
        self.weights = np.full(n, 1.0 / n)
        self.speed = np.ones(n)  # rows/s per rank, smoothed (static scheduler)
        self.boost = False
        self.prev_norm = None
        # Optimizer state under averaging: each rank's own (local), or merged with the model.
        slots = self.opt.slots if a.opt_state != "local" else None
        # merge.overlap: a window's merge runs while the next one trains; the merged model,
        # the same on every rank, is kept in a copy that evaluations read.
        self.overlap = self.cfg.merge.overlap
        self.central = (SparseMLP(self.model.n_features, self.model.n_labels, self.cfg.model,
                                  label_freq=ctx.train.label_frequencies())
                        if self.overlap else None)
        # Normalized model merging, row-normalized for the row-sparse layers (adaptive.row_norm)
        # and the full softmax's labels (adaptive.label_norm),
        # moving only touched rows (merge.sparse): hvd_adaptive/parallel/merge.py.
        self.merge = Merge(self.model, slots, self.cfg.merge, a.row_norm, self.cluster.comm,
                           label_norm=a.label_norm,
                           central=self.central.variables_list if self.overlap else None)
        # Dynamic scheduling needs MPI one-sided windows; where MPI cannot host them (across
        # nodes under OpenMPI's default osc) every rank takes the static scheduler instead.
        self.counter = shared_counter(self.cluster.comm) if a.scheduler == "rma" else None
        if a.merge_momentum > 0:
            self.anchor = [tf.Variable(v, trainable=False) for v in self.variables]
            self.velocity = [tf.Variable(tf.zeros_like(v), trainable=False) for v in self.variables]

    def setup(self) -> None:
        # Horovod: identical starting replicas; merges keep them identical afterwards.
        broadcast_variables(self.variables)
        broadcast_variables(self.opt.slot_variables())
        self.merge.reset_anchor()
        # Replicas are equal now: a merge of every row changes nothing and pays the first use
        # of the merge's buffers before the clock starts.
        self.merge.warm_up(1.0 / self.cluster.size)
        self._copy_central()
        if self.adaptive_cfg.merge_momentum > 0:
            for x, v in zip(self.anchor, self.variables):
                x.assign(v)

    # ---- one window ----------------------------------------------------------------------
    def _claims(self, w: Window, b: int):
        """Yields this rank's batches of the window (dynamic or static scheduling); no batch
        is under half of `b` unless the window is (SharedCounter.claims, `chunks`), except the
        guided tail's (adaptive.guided), down to b / 4."""
        budget = w.end - w.start
        if self.counter is not None:
            guided = self.cluster.size if self.adaptive_cfg.guided else 1
            for lo, hi in self.counter.claims(w.index, budget, lambda: b, parts=guided,
                                              smallest=max(1, b // 4)):
                yield w.perm[w.start + lo: w.start + hi]
        else:
            # Without one-sided MPI: each rank takes a contiguous part of the window in
            # proportion to its speed measured in the previous windows (rows/s), so a faster
            # rank still takes more rows.
            off = np.concatenate([[0], np.cumsum(self.speed / self.speed.sum())])
            r = self.cluster.rank
            lo, hi = int(round(budget * off[r])), int(round(budget * off[r + 1]))
            for a, z in chunks(hi - lo, b):
                yield w.perm[w.start + lo + a: w.start + lo + z]

    def _lr(self, epoch: float, b: int) -> float:
        a, lr = self.adaptive_cfg, self.cfg.optim.lr
        if self.warm:
            return balance.warmup_lr(lr, a.b_warm, self.b_max, epoch, a.warmup_epochs)
        b = b if a.lr_scaling == "linear" else self.b_max
        return balance.adaptive_lr(lr, b, self.b_max, epoch, a.warmup_epochs, a.lr_decay)

    def train_window(self, w: Window) -> RoundStats:
        r, comm, a = self.cluster.rank, self.cluster.comm, self.adaptive_cfg
        b = int(self.sizes[r])
        epoch_now = w.epoch + w.start / w.n_rows
        self.opt.lr.assign(self._lr(epoch_now, b))
        if self.counter is not None:
            self.counter.prepare(w.index)
        stats = RoundStats(epoch=w.progress, batch_size=b, lr=float(self.opt.lr))
        if self.overlap:
            # The last window's merge travels beside this window's steps (merge.overlap).
            with stats.timed("comm_s"):
                self.merge.send()
        for rows in self._claims(w, b):
            self.local_step(rows, stats)

        comm.Barrier()  # waiting for the last rank to finish its batch is not communication
        with stats.timed("sync_s"):
            # Timing exchange: every rank learns every rank's batch and row counts (mpi4py allgather).
            # Under the guided tail a claim smaller than the batch counts as its fraction of one.
            units = stats.samples / b if a.guided and self.counter is not None else stats.batches
            # The touched-row masks ride along: the merge's union needs no collective of its own.
            got = allgather(comm, (units, stats.samples, stats.compute_s, self.merge.packed()))
            info = np.array([g[:3] for g in got])
        with stats.timed("comm_s"):
            self.shares = balance.batch_shares(info[:, 0] if a.weights == "batches" else info[:, 1])
            self.weights = balance.merge_weights(self.shares, self.boost, a.norm_factor)
            # Normalized model merging (weighted allreduce over Horovod); weights sum to 1.
            if self.overlap:
                # The last window's merge lands under this window's steps, and this window's
                # values are taken; they travel while the next window trains.
                stats.extra["merge_wait_s"] = round(self.merge.finish(), 4)
                self.merge.start(float(self.weights[r]), gathered=[g[3] for g in got])
            else:
                self.merge(float(self.weights[r]), gathered=[g[3] for g in got])
            if a.merge_momentum > 0:
                self._block_momentum()
        stats.note_merge(self.merge)
        stats.weight = float(self.weights[r])
        stats.extra["share"] = float(self.shares[r])
        rate = info[:, 1] / np.maximum(info[:, 2], 1e-9)
        self.speed = rate if w.index == 0 else 0.5 * self.speed + 0.5 * rate
        self._rescale(w.progress)
        return stats

    def settle(self) -> bool:
        """Lands the merge in flight (merge.overlap): the replicas and the central copy are the
        merged model again. True if one was in flight."""
        if not self.merge.in_flight:
            return False
        self.merge.finish()  # no step since it started: the merged model itself
        return True

    def eval_model(self) -> SparseMLP:
        # Under merge.overlap the replicas hold their own steps on top of the merged model.
        return self.central if self.overlap else self.model

    def _copy_central(self) -> None:
        if self.central is not None:
            for c, v in zip(self.central.variables_list, self.variables):
                c.assign(v)

    def _block_momentum(self) -> None:
        mu, lr = self.adaptive_cfg.merge_momentum, self.adaptive_cfg.merge_lr
        for x, v, vel in zip(self.anchor, self.variables, self.velocity):
            vel.assign(mu * vel + (v - x))
            x.assign_add(lr * vel)
            v.assign(x)

    def _rescale(self, epoch: float) -> None:
        """Batch-size scaling after the window (identical on every rank: same inputs)."""
        a = self.adaptive_cfg
        if self.warm:
            if epoch >= a.warmup_epochs:
                self.warm = False
                self.sizes[:] = self.b_max
            return
        if a.policy == "additive":
            self.sizes = balance.additive_batch_sizes(self.sizes, self.shares, a.step, self.b_min, self.b_max)
        else:
            self.sizes = balance.proportional_batch_sizes(self.sizes, self.shares, self.b_min, self.b_max,
                                                          a.smoothing)

    def on_eval(self, norm: float) -> None:
        """Adaptive normalization follows the model's L2-norm trend between evaluations."""
        self.boost = balance.norm_trend_flag(self.adaptive_cfg.norm_mode, self.prev_norm, norm)
        self.prev_norm = norm

    def state(self) -> dict:
        return {"batch_sizes": self.sizes.tolist(), "shares": self.shares.tolist(),
                "weights": self.weights.tolist(), "warmup": self.warm}

    def state_dict(self) -> dict:
        return {**super().state_dict(), **self.own_state()}

    def own_state(self) -> dict:
        # Batch sizes, shares and weights come from the allgathered timings and the block
        # momentum buffers from the merged model: identical on every rank.
        d = {"adaptive.sizes": self.sizes.copy(),
             "adaptive.p": self.shares.copy(),  # "p": the checkpoint key predates the name
             "adaptive.weights": self.weights.copy(), "adaptive.speed": self.speed.copy(),
             "adaptive.warm": bool(self.warm),
             "adaptive.boost": bool(self.boost), "adaptive.prev_norm": self.prev_norm}
        if self.adaptive_cfg.merge_momentum > 0:
            d.update({f"adaptive.anchor.{i}": x.numpy() for i, x in enumerate(self.anchor)})
            d.update({f"adaptive.velocity.{i}": v.numpy() for i, v in enumerate(self.velocity)})
        return d

    def load_state_dict(self, d: dict) -> None:
        super().load_state_dict(d)
        self.load_own(d)

    def load_own(self, d: dict) -> None:
        """Adaptive SGD's own part of a checkpoint (after the model and optimizer)."""
        n = self.cluster.size
        self.warm = bool(d["adaptive.warm"])
        # Another rank count: every rank restarts from the common batch size, equal shares.
        start = self.adaptive_cfg.b_warm if self.warm else self.b_max
        self.sizes = self.per_rank(d, "adaptive.sizes", np.full(n, start, np.int64))
        self.shares = self.per_rank(d, "adaptive.p", np.full(n, 1.0 / n))
        self.weights = self.per_rank(d, "adaptive.weights", np.full(n, 1.0 / n))
        self.speed = self.per_rank(d, "adaptive.speed", np.ones(n))
        self.merge.reset_anchor()  # the checkpoint is taken right after a merge
        self._copy_central()
        self.boost, self.prev_norm = bool(d["adaptive.boost"]), d["adaptive.prev_norm"]
        if self.adaptive_cfg.merge_momentum > 0:
            for i, (x, v) in enumerate(zip(self.anchor, self.velocity)):
                x.assign(d[f"adaptive.anchor.{i}"])
                v.assign(d[f"adaptive.velocity.{i}"])
