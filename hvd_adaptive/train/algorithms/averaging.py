"""Model-averaging baselines: local SGD and CROSSBOW's synchronous model averaging (SMA).

Both give every rank an equal, static share of each round's rows and equal batches; they
differ in the merge at the round's end.
- local: replicas are averaged with equal weights and every rank continues from the average.
- sma: a central model z; each replica r moves d = alpha (r - z) toward it (r -= d), the
  corrections are summed over ranks (D = sum d), D += momentum * D_prev, and z += D. Replicas
  are not reset to z; z is what gets evaluated.
"""
from __future__ import annotations

from hvd_adaptive.tfload import tf

from hvd_adaptive.train import checkpoint as ck
from hvd_adaptive.train.algorithms.base import Algorithm, RoundStats, Window, chunks
from hvd_adaptive.train.balance import split_evenly
from hvd_adaptive.parallel import collectives
from hvd_adaptive.parallel.distributed import broadcast_variables
from hvd_adaptive.parallel.merge import Merge
from hvd_adaptive.model.network import SparseMLP


class _Averaging(Algorithm):
    def setup(self) -> None:
        # Horovod: identical starting replicas, so averaging starts from a common point.
        broadcast_variables(self.variables)

    def train_local_share(self, w: Window) -> RoundStats:
        r, n, b = self.cluster.rank, self.cluster.size, self.cfg.train.batch_size
        off = split_evenly(w.end - w.start, n)
        mine = w.perm[w.start + off[r]: w.start + off[r + 1]]
        stats = RoundStats(epoch=w.progress, batch_size=b, lr=float(self.opt.lr), weight=1.0 / n)
        for lo, hi in chunks(len(mine), b):
            self.local_step(mine[lo:hi], stats)
        return stats

    def merge_timed(self, merge, stats: RoundStats) -> None:
        """Runs the round's merge as communication; waiting for the slowest rank (the barrier)
        stays out of it and ends up in wait_s."""
        self.cluster.comm.Barrier()
        with stats.timed("comm_s"):
            merge()


class LocalSGD(_Averaging):
    name = "local"

    def __init__(self, ctx):
        super().__init__(ctx)
        # Equal weights, plain average, only touched rows under merge.sparse (merge.py).
        self.merge = Merge(self.model, None, self.cfg.merge, False, self.cluster.comm)

    def setup(self) -> None:
        super().setup()
        self.merge.reset_anchor()
        self.merge.warm_up(1.0 / self.cluster.size)  # replicas are equal: changes nothing

    def train_window(self, w: Window) -> RoundStats:
        stats = self.train_local_share(w)
        self.merge_timed(lambda: self.merge(1.0 / self.cluster.size), stats)
        stats.note_merge(self.merge)
        return stats

    def load_state_dict(self, d: dict) -> None:
        super().load_state_dict(d)
        self.merge.reset_anchor()


class SMA(_Averaging):
    name = "sma"
    model_differs_by_rank = True  # replicas only move toward the central model, never onto it

    def __init__(self, ctx):
        super().__init__(ctx)
        # The label frequencies: the sampled loss's sampler is built with the model.
        self.central = SparseMLP(self.model.n_features, self.model.n_labels, self.cfg.model,
                                 label_freq=ctx.train.label_frequencies())
        self.z = self.central.variables_list
        self.prev = [tf.Variable(tf.zeros_like(v), trainable=False) for v in self.variables]
        alpha, mu = self.cfg.sma.alpha, self.cfg.sma.momentum

        @tf.function(autograph=False)
        def sma_merge():
            d = [alpha * (r - z) for r, z in zip(self.variables, self.z)]
            for r, di in zip(self.variables, d):
                r.assign_sub(di)
            total = collectives.sum_group(d, name="sma_corrections")
            for z, dp, dd in zip(self.z, self.prev, total):
                step = dd + mu * dp
                dp.assign(step)
                z.assign_add(step)

        self._sma_merge = sma_merge

    def setup(self) -> None:
        super().setup()
        for z, r in zip(self.z, self.variables):
            z.assign(r)
        self._sma_merge()  # replicas equal the central model: a no-op that warms Horovod up

    def train_window(self, w: Window) -> RoundStats:
        stats = self.train_local_share(w)
        self.merge_timed(self._sma_merge, stats)
        return stats

    def eval_model(self) -> SparseMLP:
        return self.central

    def state_dict(self) -> dict:
        # The central model and its momentum come from allreduced sums: equal on every rank.
        d = super().state_dict()
        d.update(ck.indexed(ck.SMA_CENTRAL, [z.numpy() for z in self.z]))
        d.update(ck.indexed(ck.SMA_MOMENTUM, [m.numpy() for m in self.prev]))
        return d

    def load_state_dict(self, d: dict) -> None:
        super().load_state_dict(d)
        for i, (z, m) in enumerate(zip(self.z, self.prev)):
            z.assign(d[f"{ck.SMA_CENTRAL}{i}"])
            m.assign(d[f"{ck.SMA_MOMENTUM}{i}"])
