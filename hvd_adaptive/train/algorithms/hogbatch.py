"""CPU+GPU Hogbatch and Adaptive Hogbatch: asynchronous training on workers of mixed speed.

Design (details, measurements and how to run: docs/hogbatch.md):
- The model lives in one node's shared memory: an MPI window (Allocate_shared on the node
  communicator; `distributed.SharedModel`) holds every variable as a float32 numpy array, plus a
  per-worker table (update counts, rates, batch sizes) in which each worker writes only its own
  row. The batch-size rule and the update shares are pure functions in balance.py.
- Each worker (one per rank; CPU workers, ``hogbatch.cpu_ranks``, take small batches, GPU
  workers large ones) repeats: claim its next batch from one global stream (the shared counter
  over the epoch's permutation: every row once per epoch), copy the shared values the batch
  needs into its tf.Variables, compute the update with its own optimizer, and add the update to
  the shared arrays without locks (Hogwild with batches).
- adaptive_hogbatch: every ``hogbatch.adjust_every`` updates a worker publishes its update rate
  and, once every other worker has published since its last decision, resizes its batch with
  `balance.adapt_batch` so that update counts balance; ``hogbatch.threshold`` is the dead band.

Synchronization: none between updates. A round covers ``hogbatch.round_epochs`` of the stream
(default: train.eval_every; never across an epoch) and ends with a barrier, a copy of the shared
model into every rank's replica, and a second barrier, so evaluation (between rounds) sees one
model on every rank. Those two barriers are the only synchronization.

Consistency: lost updates (two workers read-modify-write the same element at once) and stale
reads (a worker computes on values others have since changed) are part of the algorithm. Torn
reads, a worker copying a row while another writes it, give a mix of old and new elements: each
aligned float32 element is stored whole (x86 never splits an aligned 4-byte store), so every
value read is a float some worker wrote, never garbage. A NaN guard drops any update whose loss
or values are not finite before it reaches the shared arrays, and counts it.

Only one node is supported: a job spanning several nodes fails at start with a clear message.
Future work: keep the model in one-sided MPI windows on a model-holding rank (Get/Accumulate).
"""
from __future__ import annotations

import dataclasses
import sys
import time
from typing import Optional

import numpy as np
from hvd_adaptive.tfload import tf

from hvd_adaptive.train.algorithms import worker_threads
from hvd_adaptive.train.algorithms.base import Algorithm, RoundStats, Window
from hvd_adaptive.config import Config
from hvd_adaptive.data import make_batch
from hvd_adaptive.train.balance import adapt_batch, update_shares
from hvd_adaptive.parallel.distributed import SharedCounter, SharedModel
from hvd_adaptive.model.network import Optimizer, SparseMLP, batch_tensors

# Columns of the per-worker table in shared memory (float64; row i is written only by rank i).
UPDATES, SAMPLES, BUSY_S, BATCH, RATE, SEQ, SKIPPED = range(7)
_COLUMNS = 7


# ---- set-up rules (unit-tested in tests/test_hogbatch.py) ----------------------------------------
def worker_batch(cfg: Config, rank: int) -> tuple[str, int, int, int]:
    """A worker's kind ("cpu" or "gpu"), starting batch and adaptive bounds (b_min, b_max), from
    the resolved config (config.resolve derives gpu_batch and the bounds)."""
    h = cfg.hogbatch
    kind = "cpu" if rank in h.cpu_ranks else "gpu"
    start = h.cpu_batch if kind == "cpu" else h.gpu_batch
    return kind, start, h.b_min, h.b_max


# ---- the algorithms -----------------------------------------------------------------------------
class Hogbatch(Algorithm):
    """CPU+GPU Hogbatch: lock-free batch updates of one shared model, no barrier between them."""

    name = "hogbatch"
    adaptive = False

    def __init__(self, ctx):
        cfg, cluster = ctx.cfg, ctx.cluster
        self.kind, self.b, self.b_min, self.b_max = worker_batch(cfg, cluster.rank)
        self.worker_device = "/CPU:0" if self.kind == "cpu" else cluster.device
        if self.worker_device != cluster.device:
            # A CPU worker on a GPU node computes on the host: its replica lives there.
            # Untested here (no GPU on these machines).
            with tf.device(self.worker_device):
                model = SparseMLP(ctx.model.n_features, ctx.model.n_labels, cfg.model,
                                  label_freq=ctx.train.label_frequencies(), stream=cluster.rank)
                opt = Optimizer.for_model(model, cfg.optim)
                ctx = dataclasses.replace(ctx, model=model, opt=opt)
        super().__init__(ctx)
        h = cfg.hogbatch
        bad = [r for r in h.cpu_ranks if r >= cluster.size]
        if bad:
            raise ValueError(f"hogbatch.cpu_ranks: {bad} not below the {cluster.size} ranks of this job")
        want = worker_threads(cfg, cluster.rank)
        if want is not None and want != cluster.threads:
            # Thread pools are sized in distributed.init (run.py passes worker_threads to it);
            # a caller that did not cannot change them any more.
            print(f"[rank {cluster.rank}] warning: hogbatch.cpu_threads={want} is not applied: "
                  f"this rank runs {cluster.threads} TensorFlow thread(s)", file=sys.stderr, flush=True)
        self.hogbatch_cfg = h
        self.round_rows = max(1, int(round(h.round_epochs * ctx.train.n_rows)))
        self.shared = SharedModel(cluster.comm, [tuple(v.shape) for v in self.variables], cluster.size,
                                  _COLUMNS)
        self.counter = SharedCounter(cluster.comm)
        self.own_row = self.shared.table[cluster.rank]  # the table row only this rank writes
        self.round = 0
        self._round_start_updates = np.zeros(cluster.size)
        self._period = [0, 0.0]  # updates and seconds since the rate was last published
        self._seen = np.zeros(cluster.size)  # others' publication counts at our last resize
        self._adjusting = False
        # Adaptive's resizing decisions of the current round, as the rule saw and took them
        # (logged in the round record: the rule can be recomputed from the run's own figures).
        self._decisions: list[dict] = []

        w1, dense = self.variables[0], self.variables[1:]
        pulled = (tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, *w1.shape[1:]], tf.float32),
                  *[tf.TensorSpec(v.shape, tf.float32) for v in dense])

        @tf.function(input_signature=pulled, autograph=False)
        def pull(rows, w1_rows, *values):
            # Only the input-layer rows in the batch affect its gradient.
            with tf.device(self.worker_device):
                w1.scatter_update(tf.IndexedSlices(w1_rows, rows))
                for v, x in zip(dense, values):
                    v.assign(x)

        @tf.function(input_signature=pulled, autograph=False)
        def deltas(rows, w1_rows, *values):
            # The update is what this worker's optimizer did to its replica since the pull.
            with tf.device(self.worker_device):
                d_rows = tf.gather(w1, rows) - w1_rows
                ds = [v - x for v, x in zip(dense, values)]
                # One non-finite element makes its sum non-finite: a cheap complete NaN guard.
                total = tf.add_n([tf.reduce_sum(d) for d in [d_rows, *ds]])
                return tf.math.is_finite(total), d_rows, ds

        self._pull, self._deltas = pull, deltas

    def step_functions(self) -> list:
        return [self._local_step, self._pull, self._deltas]

    def setup(self) -> None:
        self.shared.initialize(self.variables)
        self._set_batch(self.b)

    def _set_batch(self, b: int) -> None:
        # Every update uses optim.lr whatever its batch: scaling it with the batch (sqrt or
        # linear) did not learn faster in our runs (docs/hogbatch.md).
        self.b = b
        self.own_row[BATCH] = b

    def trace(self) -> None:
        """Traces, then runs pull and push once (their first run optimizes the graph, about a
        second, which must not count as training); their effects are undone."""
        super().trace()
        b = make_batch(self.ctx.train, np.arange(min(self.b, self.ctx.train.n_rows)))
        ids = tf.constant(np.unique(b.feat_ids))
        with self.unchanged():
            args = (ids, tf.gather(self.variables[0], ids), *[tf.identity(v) for v in self.variables[1:]])
            self._pull(*args)
            self._deltas(*args)

    # ---- one update ----------------------------------------------------------------------
    def _update(self, rows: np.ndarray, stats: RoundStats) -> None:
        """Pull what the batch needs, compute this worker's update, push it without locks."""
        t0 = time.perf_counter()
        batch = make_batch(self.ctx.train, rows)
        ids = np.unique(batch.feat_ids)
        tensors = batch_tensors(batch)
        t1 = time.perf_counter()
        w1s, dense_s = self.shared.params[0], self.shared.params[1:]
        # Private copies: TensorFlow may alias an aligned numpy buffer, and no tensor or
        # variable may alias the shared memory.
        pulled = (tf.constant(ids), tf.constant(w1s[ids]), *[tf.constant(a.copy()) for a in dense_s])
        self._pull(*pulled)
        t2 = time.perf_counter()
        loss, dt = self.hetero.compute(self._local_step, *tensors)  # the only slowed part
        t3 = time.perf_counter()
        ok, d_rows, deltas = self._deltas(*pulled)
        if bool(ok) and np.isfinite(float(loss)):
            w1s[ids] += d_rows.numpy()  # ids are unique, so a fancy-index add is one add per row
            for a, d in zip(dense_s, deltas):
                np.add(a, d.numpy(), out=a)
        else:
            self.own_row[SKIPPED] += 1
        t4 = time.perf_counter()
        stats.batch_s += t1 - t0
        stats.comm_s += (t2 - t1) + (t4 - t3)
        stats.add_step(len(rows), float(loss), dt)
        row = self.own_row
        row[UPDATES] += 1
        row[SAMPLES] += len(rows)
        row[BUSY_S] += t4 - t0

    def _after_update(self, seconds: float) -> None:
        """Publishes the update rate every adjust_every updates; adaptive resizes the batch."""
        self._period[0] += 1
        self._period[1] += seconds
        if self._period[0] < self.hogbatch_cfg.adjust_every:
            return
        row, table, me = self.own_row, self.shared.table, self.cluster.rank
        row[RATE] = self._period[0] / max(self._period[1], 1e-9)
        row[SEQ] += 1
        self._period = [0, 0.0]
        if not self.adaptive:
            return
        seq = table[:, SEQ].copy()
        others = np.arange(len(seq)) != me
        # Resize only on fresh news from every other worker, so a fast worker does not chase a
        # slow worker's stale rate with several resizes in a row.
        if np.all(seq[others] > self._seen[others]):
            self._seen = seq
            rates, before = table[:, RATE].copy(), (self.b, self._adjusting)
            b, self._adjusting = adapt_batch(self.b, rates, me, self.hogbatch_cfg.threshold,
                                             self.b_min, self.b_max, self._adjusting)
            self._decisions.append({"b": before[0], "adjusting": before[1],
                                    "rates": [float(r) for r in rates],
                                    "to": b, "then": self._adjusting})
            if b != self.b:
                self._set_batch(b)

    # ---- one round -----------------------------------------------------------------------
    def _next_span(self) -> Optional[tuple[Window, Window]]:
        """Joins the base stream's windows into one claim range of about round_rows rows."""
        first = last = self.next_window()
        if first is None:
            return None
        while last.end - first.start < self.round_rows and last.end < last.epoch_rows:
            w = self.next_window()
            if w is None:
                break
            last = w
        return first, last

    def run_round(self) -> Optional[RoundStats]:
        span = self._next_span()
        if span is None:
            return None
        first, last = span
        self.hetero.at_epoch(first.epoch + first.start / first.n_rows)
        t_round, slept = time.perf_counter(), self.hetero.injected_s
        self.counter.prepare(self.round)
        budget = last.end - first.start
        stats = RoundStats(epoch=last.progress, batch_size=self.b, lr=float(self.opt.lr))
        t0 = time.perf_counter()
        for lo, hi in self.counter.claims(self.round, budget, lambda: self.b):
            self._update(first.perm[first.start + lo: first.start + hi], stats)
            self._after_update(time.perf_counter() - t0)
            t0 = time.perf_counter()
        # Round end, the only synchronization: all updates land, every replica takes the same
        # snapshot, and nobody writes again before everybody has it (evaluation sees one model).
        self.shared.fence()
        self.shared.copy_into(self.variables)
        self.shared.fence()
        self.round += 1
        stats.close(time.perf_counter() - t_round, self.hetero.injected_s - slept)
        stats.batch_size, stats.lr = self.b, float(self.opt.lr)
        updates = self.shared.table[:, UPDATES].copy()
        shares, cpu_share = update_shares(updates - self._round_start_updates,
                                          self.hogbatch_cfg.cpu_ranks)
        self._round_start_updates = updates
        stats.extra.update(kind=self.kind, update_share=round(float(shares[self.cluster.rank]), 4),
                           cpu_update_share=None if cpu_share is None else round(cpu_share, 4),
                           skipped_total=int(self.own_row[SKIPPED]))
        if self.adaptive:
            stats.extra["decisions"], self._decisions = self._decisions, []
        return stats

    def state(self) -> dict:
        t = self.shared.table.copy()
        shares, cpu_share = update_shares(t[:, UPDATES], self.hogbatch_cfg.cpu_ranks)
        cols = (("batch_sizes", BATCH), ("updates", UPDATES), ("samples", SAMPLES),
                ("skipped_nonfinite", SKIPPED))
        return {"kinds": ["cpu" if r in self.hogbatch_cfg.cpu_ranks else "gpu" for r in range(len(t))],
                **{k: t[:, c].astype(int).tolist() for k, c in cols},
                "busy_s": np.round(t[:, BUSY_S], 3).tolist(),
                "update_rates": np.round(t[:, RATE], 3).tolist(),
                "update_shares": np.round(shares, 4).tolist(),
                "cpu_update_share": None if cpu_share is None else round(cpu_share, 4)}

    # ---- checkpoints (taken between rounds, when every replica holds the shared snapshot) ----
    def state_dict(self) -> dict:
        return {**super().state_dict(), "hogbatch.round": self.round,
                "hogbatch.table": self.shared.table.copy()}

    def load_state_dict(self, d: dict) -> None:
        """Restores the replica (base class), then makes it the shared model again (collective)."""
        super().load_state_dict(d)
        self.round = int(d["hogbatch.round"])
        table = self.per_rank(d, "hogbatch.table", np.zeros_like(self.shared.table))
        self.shared.initialize(self.variables)
        if self.shared.node.Get_rank() == 0:
            self.shared.table[...] = table
        self.shared.fence()
        self._set_batch(self.b if self.resized else int(self.own_row[BATCH]))
        self._round_start_updates = self.shared.table[:, UPDATES].copy()


class AdaptiveHogbatch(Hogbatch):
    """Adaptive Hogbatch: batch sizes follow the workers' relative speed so updates balance."""

    name = "adaptive_hogbatch"
    adaptive = True

    def __init__(self, ctx):
        super().__init__(ctx)
        self.b = int(np.clip(self.b, self.b_min, self.b_max))
