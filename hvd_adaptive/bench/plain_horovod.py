"""The yardstick: the plain Horovod script a user would write instead of using hvd_adaptive.

    mpirun -np 2 python -m hvd_adaptive.bench.plain_horovod --config configs/tiny.yaml --run-dir DIR \\
        [--set key=value ...]

tf.Variables in a tf.Module (Keras 3 variables break Horovod 0.28), the project's model and loss
(sparse input -> ReLU hidden layer(s) by gathering the input layer's rows -> softmax over every
label, cross-entropy against the multi-hot labels normalized to sum 1; under model.output
sampled, or auto at as many labels as the project takes it for, the softmax over the batch's
labels and the drawn negatives; with model.hidden [] one linear layer read by the batch's
features, and under model.loss sigmoid one logistic loss a label), TensorFlow's own
optimizer kernels, `hvd.DistributedGradientTape` (Average) around the loss, the whole step in
one `tf.function`, rank 0's weights broadcast at start, and each rank taking its slice of a
global batch of ranks x train.batch_size rows cut from the epoch's shuffle. Nothing runs per
step but the step: no timing, no barrier, no accounting.

It shares no training code with the project (no trainer, algorithms, model, merge, balance or
distributed). What it does take from hvd_adaptive keeps the comparison fair, not the training:
the config file and `--set` overrides (the same data, rate, batch, seed and stopping rules as
the project's runs), `optim.lr: auto`'s probe (`hvd_adaptive.train.tune`: its candidates, rows,
rule and judge, run with this script's own step), the data as the project reads it
(`hvd_adaptive.data`: the same bytes and the same epoch shuffles; a user would read the files
with a loader of their own), the sampled loss's negatives as the project draws them
(`hvd_adaptive.model.negatives`: the same labels from the same seeds, so no contender
trains on luckier draws; a user would call TensorFlow's candidate samplers, which draw from
the same proposal), the metric
code every contender is scored with (`hvd_adaptive.model.metrics`), and the project's CPU quota
(`hvd_adaptive.train.hetero`, `hetero.mode: cpu_quota`): the one way a slower machine can be imposed
on a script that knows nothing of heterogeneity, entered where the project enters it (after
tracing, before the clock), so a slowed rank is slowed the same in both. The sleep mode slows
only the project's own computation spans and cannot reach this script, which refuses it.

Like the project it sets HOROVOD_CYCLE_TIME (5 ms, longer under a CPU quota: 5 ms / cores, at
most 50) and OMPI_MCA_mpi_yield_when_idle=1 unless exported, and train.threads (default: the
cores over the ranks on the node) as TensorFlow's threads: settings any user can make.

Records (rank 0, in DIR): metrics.jsonl with a `start` record (standalone rows/s of each rank:
the step without its allreduce, timed before the clock, for the benchmark's limit) and `eval`
records at the first step after each train.eval_every mark, as the project's sync is evaluated,
on the first train.eval_rows test rows (`wall_s` is
training time, evaluation left out), and summary.json. Training stops after train.epochs, at
train.target_p_at_1, or at train.time_budget_s (checked at evaluations, where the ranks meet).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import resource
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import numpy as np

from hvd_adaptive.train import tune
from hvd_adaptive.config import ConfigError, load_config, model_for
from hvd_adaptive.data import epoch_permutation, load_data, split_validation
from hvd_adaptive.train.hetero import Heterogeneity, smallest_quota
from hvd_adaptive.model.negatives import Negatives
from hvd_adaptive.model.metrics import (finalize, inverse_propensities, metric_sums,
                                  most_frequent_label_p1, sum_names)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # read once, when TensorFlow loads
import tensorflow as tf  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402

OPTIMIZERS = ("sgd", "momentum", "adagrad", "rowwise_adagrad")
# A batch: feature ids, values, batch row of each, label ids, batch row of each, row count.
SIGNATURE = (tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.float32),
             tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], tf.int32),
             tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int32))


def check(cfg) -> None:
    """Refuses what this script does not do, before anything starts (ConfigError)."""
    if cfg.optim.name not in OPTIMIZERS:
        raise ConfigError(f"optim.name: the plain Horovod script has {', '.join(OPTIMIZERS)}, "
                          f"got {cfg.optim.name}")
    if cfg.hetero.sleeps:
        raise ConfigError("hetero: sleep mode slows the project's own computation spans, which a "
                          "plain Horovod script does not have; use hetero.mode=cpu_quota")


def batch(ds, rows: np.ndarray) -> tuple:
    """The rows' SIGNATURE arrays, in the rows' order (labels not yet normalized: the loss does)."""
    f, y = ds.features[rows], ds.labels[rows]
    row = np.arange(len(rows), dtype=np.int32)
    return (f.indices.astype(np.int64), f.data.astype(np.float32), np.repeat(row, np.diff(f.indptr)),
            y.indices.astype(np.int32), np.repeat(row, np.diff(y.indptr)), np.int32(len(rows)))


class Net(tf.Module):
    """The project's network and initialisation: Glorot-uniform kernels drawn in layer order
    from numpy's generator seeded by model.init_seed, zero biases; with model.hidden [] one
    [features x labels] kernel from zero, read by the batch's features (a linear model)."""

    def __init__(self, n_features: int, n_labels: int, mcfg, label_freq=None, stream: int = 0):
        super().__init__(name="plain_net")
        rng = np.random.default_rng(mcfg.init_seed)
        sizes = [n_features, *mcfg.hidden, n_labels]
        # The sampled loss gathers the output layer's rows: it is stored [labels x hidden].
        self.sampled, self.n_labels = mcfg.output == "sampled", n_labels
        self.linear, self.sigmoid = not mcfg.hidden, mcfg.loss == "sigmoid"
        self.n_features = n_features
        self.kernels, self.biases = [], []
        for a, b in zip(sizes[:-1], sizes[1:]):
            limit = math.sqrt(6.0 / (a + b))
            w = (np.zeros((a, b), np.float32) if self.linear
                 else rng.uniform(-limit, limit, (a, b)).astype(np.float32))
            last = len(self.kernels) == len(sizes) - 2
            self.kernels.append(tf.Variable(w.T.copy() if last and self.sampled else w))
            self.biases.append(tf.Variable(tf.zeros([b])))
        # The project's negatives (its loss): by label frequency, (training count + 1) ^ 0.75,
        # or uniform; drawn from (model.init_seed, a counter), this rank's stream.
        self.drawer = (Negatives(n_labels, mcfg.negatives, mcfg.init_seed, stream,
                                 label_freq if mcfg.sampler == "frequency" else None)
                       if self.sampled else None)
        self.dropout = mcfg.dropout
        # model.dropout_after: 0 until that many epochs are trained (`dropout_from`)
        self.dropout_after = mcfg.dropout_after
        self.dropping = mcfg.dropout > 0 and mcfg.dropout_after <= 0
        self.rate = tf.Variable(mcfg.dropout if self.dropping else 0.0, trainable=False)
        self.smoothing = mcfg.label_smoothing
        # kernel, bias of each layer, input layer first (the project's order, to compare and load)
        self.ordered = [v for pair in zip(self.kernels, self.biases) for v in pair]

    def hidden(self, ids, vals, seg, n, training=False):
        if self.linear:  # the rows themselves, dense (the rate judge's products)
            at = tf.stack([seg, tf.cast(ids, tf.int32)], 1)
            return tf.scatter_nd(at, vals, tf.stack([n, self.n_features]))
        # Only the batch's rows of the input layer are read: its gradient is row-sparse. The
        # rows come one after another, so TensorFlow's sorted segment sum adds them up (what
        # tf.nn.embedding_lookup_sparse calls), padded for trailing rows without features.
        x = tf.math.segment_sum(tf.gather(self.kernels[0], ids) * vals[:, None], seg)
        x = tf.pad(x, [[0, n - tf.shape(x)[0]], [0, 0]])
        x = self._relu(x + self.biases[0], training)
        for w, b in zip(self.kernels[1:-1], self.biases[1:-1]):
            x = self._relu(tf.matmul(x, w) + b, training)
        return x

    def _relu(self, x, training):
        x = tf.nn.relu(x)
        return tf.nn.dropout(x, rate=self.rate) if training and self.dropout > 0 else x

    def dropout_from(self, progress: float) -> None:
        """Dropout for the steps after `progress` epochs where model.dropout_after says so
        (called every step: a Python check until it switches, then nothing)."""
        if not self.dropping and self.dropout > 0 and progress >= self.dropout_after:
            self.dropping = True
            self.rate.assign(self.dropout)

    def logits(self, ids, vals, seg, n, training=False):
        if self.linear:  # the batch's rows of the one kernel: a row-sparse gradient
            x = tf.math.segment_sum(tf.gather(self.kernels[0], ids) * vals[:, None], seg)
            return tf.pad(x, [[0, n - tf.shape(x)[0]], [0, 0]]) + self.biases[0]
        h = self.hidden(ids, vals, seg, n, training)
        return tf.matmul(h, self.kernels[-1], transpose_b=self.sampled) + self.biases[-1]

    def loss(self, ids, vals, seg, labels, label_row, n, training=True):
        """Mean over the rows with labels of softmax cross-entropy against their labels, each of
        a row's k labels weighted 1/k (the multi-hot target normalized to sum 1); in training,
        model.label_smoothing of the target spread evenly over every label. Sampled: in
        training, the softmax over the batch's labels and model.negatives drawn ones. Under
        model.loss sigmoid: the mean over the rows of the sum over every label of the logistic
        loss, the row's labels positive."""
        if self.sigmoid:
            z = self.logits(ids, vals, seg, n, training=training)
            y = tf.scatter_nd(tf.stack([label_row, labels], 1), tf.ones_like(labels, tf.float32),
                              tf.shape(z))
            per_row = tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.minimum(y, 1.0), logits=z)
            return tf.reduce_sum(per_row) / tf.maximum(tf.cast(n, tf.float32), 1.0)
        if self.sampled and training:
            return self.sampled_loss(ids, vals, seg, labels, label_row, n)
        return self.xent(self.logits(ids, vals, seg, n, training=training), labels, label_row, n,
                         self.smoothing if training else 0.0)

    def sampled_loss(self, ids, vals, seg, labels, label_row, n):
        """The softmax over the batch's candidate labels (`candidates`)."""
        cand, corr, where = self.candidates(labels)
        return self.candidate_xent(ids, vals, seg, cand, corr, where, label_row, n)

    def candidates(self, labels):
        """The batch's own labels (no correction), then the negatives drawn once for the batch
        (about model.negatives distinct labels), each with the log of its expected count
        (sampled softmax's correction); a drawn label that is one of the batch's counts once,
        as the batch's. Returns (candidates, corrections, each label's place among the
        candidates)."""
        own, where = tf.unique(tf.cast(labels, tf.int64))
        drawn, log_expected = self.drawer.draw()
        # drawn labels not among the batch's: one lookup each in a mask over the labels
        mine = tf.scatter_nd(own[:, None], tf.ones(tf.shape(own), tf.int32), [self.n_labels])
        new = tf.equal(tf.gather(mine, drawn), 0)
        return (tf.concat([own, tf.boolean_mask(drawn, new)], 0),
                tf.concat([tf.zeros(tf.shape(own)), tf.boolean_mask(log_expected, new)], 0),
                where)

    def candidate_xent(self, ids, vals, seg, cand, corr, where, label_row, n):
        """`xent` over the labels `cand` only, their logits less `corr`; `where`: each of the
        batch's labels' place in `cand`."""
        h = self.hidden(ids, vals, seg, n, training=True)
        z = (tf.matmul(h, tf.gather(self.kernels[-1], cand), transpose_b=True)
             + tf.gather(self.biases[-1], cand) - corr)
        return self.xent(z, where, label_row, n)

    @staticmethod
    def xent(z, labels, label_row, n, smoothing=0.0):
        k = tf.math.unsorted_segment_sum(tf.ones_like(labels, tf.float32), label_row, n)
        target = tf.gather_nd(z, tf.stack([label_row, labels], 1)) / tf.gather(k, label_row)
        target = tf.math.unsorted_segment_sum(target, label_row, n)
        if smoothing:
            target = (1.0 - smoothing) * target + smoothing * tf.reduce_mean(z, 1)
        xent = tf.reduce_logsumexp(z, 1) - target
        has = tf.cast(k > 0, tf.float32)
        return tf.reduce_sum(has * xent) / tf.maximum(tf.reduce_sum(has), 1.0)


class Optimizer(tf.Module):
    """sgd, momentum, adagrad on TensorFlow's kernels (row-sparse where the gradient is), and
    rowwise_adagrad as the project defines it: one accumulator a row of the input layer
    (acc[r] += mean_j g[r, j]^2; w[r] -= lr g[r] / (sqrt(acc[r]) + eps)), Adagrad elsewhere."""

    def __init__(self, ocfg, variables, rows=(0,), linear=False):
        super().__init__(name="plain_opt")
        # A variable, so optim.lr auto can set the chosen rate without retracing.
        self.cfg = ocfg
        self.lr = tf.Variable(0.0 if ocfg.lr == "auto" else ocfg.lr, trainable=False)
        # rowwise_adagrad's one value a row: the input layer, and the sampled output layer.
        self.rows = rows if ocfg.name == "rowwise_adagrad" else ()
        shapes = [[v.shape[0], 1] if i in self.rows else v.shape for i, v in enumerate(variables)]
        # Each state starts where the config says (OptimConfig.start: the row-sparse layers, the
        # input layer, a linear model's weights and the sampled output layer, where
        # optim.initial_accumulator_rows says, for a linear model or a network).
        self.slots = ([] if ocfg.name == "sgd" else
                      [tf.Variable(tf.fill(s, ocfg.start(i in rows, linear)))
                       for i, s in enumerate(shapes)])

    def apply(self, grads, variables):
        c = self.cfg
        for i, (g, v) in enumerate(zip(grads, variables)):
            idx = None
            if isinstance(g, tf.IndexedSlices):  # duplicate rows summed: state updates once a row
                idx, pos = tf.unique(g.indices)
                g = tf.math.unsorted_segment_sum(g.values, pos, tf.shape(idx)[0])
            if c.weight_decay > 0:
                g = g + c.weight_decay * (v if idx is None else tf.gather(v, idx))
            s = self.slots[i] if self.slots else None
            if c.name == "sgd":
                if idx is None:
                    tf.raw_ops.ResourceApplyGradientDescent(var=v.handle, alpha=self.lr, delta=g)
                else:
                    v.scatter_sub(tf.IndexedSlices(self.lr * g, idx))
            elif c.name == "momentum":
                kw = dict(var=v.handle, accum=s.handle, lr=self.lr, grad=g, momentum=c.momentum)
                (tf.raw_ops.ResourceApplyMomentum(**kw) if idx is None
                 else tf.raw_ops.ResourceSparseApplyMomentum(indices=idx, **kw))
            elif i in self.rows:
                acc = (s if idx is None else tf.gather(s, idx)) + tf.reduce_mean(g * g, 1, keepdims=True)
                upd = g * (self.lr / (tf.sqrt(acc) + c.eps))
                if idx is None:
                    s.assign(acc)
                    v.assign_sub(upd)
                else:
                    s.scatter_update(tf.IndexedSlices(acc, idx))
                    v.scatter_sub(tf.IndexedSlices(upd, idx))
            else:  # adagrad, and rowwise_adagrad's layers other than the input layer
                kw = dict(var=v.handle, accum=s.handle, lr=self.lr, epsilon=c.eps, grad=g)
                (tf.raw_ops.ResourceApplyAdagradV2(**kw) if idx is None
                 else tf.raw_ops.ResourceSparseApplyAdagradV2(indices=idx, **kw))


class PlainHorovod:
    """Model, optimizer and the Horovod step, built the same on every rank."""

    def __init__(self, cfg, n_features: int, n_labels: int, label_freq=None):
        self.net = Net(n_features, n_labels, cfg.model, label_freq, stream=hvd.rank())
        out = len(self.net.ordered) - 2  # the output layer's kernel
        self.opt = Optimizer(cfg.optim, self.net.ordered, (0, out) if self.net.sampled else (0,),
                             linear=cfg.model.linear)
        variables = self.net.ordered

        @tf.function(input_signature=SIGNATURE, autograph=False)
        def step(*b):
            with tf.GradientTape() as tape:
                loss = self.net.loss(*b)
            tape = hvd.DistributedGradientTape(tape)  # gradients averaged over the ranks
            self.opt.apply(tape.gradient(loss, variables), variables)
            return loss

        @tf.function(input_signature=SIGNATURE, autograph=False)
        def alone(*b):  # the step without its allreduce: this rank's standalone speed
            with tf.GradientTape() as tape:
                loss = self.net.loss(*b)
            self.opt.apply(tape.gradient(loss, variables), variables)
            return loss

        @tf.function(input_signature=SIGNATURE[:3] + SIGNATURE[5:], autograph=False)
        def top5(ids, vals, seg, n):
            return tf.math.top_k(self.net.logits(ids, vals, seg, n), k=min(5, n_labels)).indices

        @tf.function(input_signature=SIGNATURE + (tf.TensorSpec([None], tf.int64),
                                                  tf.TensorSpec([None], tf.float32)),
                     autograph=False)
        def held_out(ids, vals, seg, labels, label_row, n, judged, corr):  # optim.lr auto's judge
            # The project's judge (tune.HeldOut): every label, or the labels `judged` alone
            # with their logits less `corr` in the loss (tune.judge_labels).
            h = self.net.hidden(ids, vals, seg, n)
            w, b = self.net.kernels[-1], self.net.biases[-1]
            k = min(tune.TOP_K, n_labels)

            def every():
                z = tf.matmul(h, w, transpose_b=self.net.sampled) + b
                return (self.net.xent(z, labels, label_row, n),
                        tf.cast(tune.top_labels(z, k=k), tf.int64))

            def among():
                z = (tf.matmul(h, tf.gather(w, judged, axis=0 if self.net.sampled else 1),
                               transpose_b=self.net.sampled) + tf.gather(b, judged))
                where = tf.cast(tf.searchsorted(judged, tf.cast(labels, tf.int64)), tf.int32)
                return (self.net.xent(z - corr, where, label_row, n),
                        tf.gather(judged, tune.top_labels(z, k=k)))

            return tf.cond(tf.size(judged) > 0, among, every)

        self.step, self.alone, self.top5, self.held_out = step, alone, top5, held_out

    @contextmanager
    def unchanged(self):
        """Steps inside change nothing (tracing and timing before the clock)."""
        drawn = [self.net.drawer.count] if self.net.drawer is not None else []  # as the project
        with tune.unchanged([*self.net.ordered, *self.opt.slots, self.opt.lr, *drawn]) as restore:
            yield restore


def evaluate(plain: PlainHorovod, test, cfg, inv_prop, rows=None, extra: float = 0.0) -> tuple[dict, float]:
    """P@k, nDCG@k, PSP@k and PSnDCG@k on the first `rows` test rows (default
    train.eval_rows), spread over the ranks (rows r, r + n, ...) and summed by one allreduce;
    returns (metrics, `extra` summed over the ranks: rank 0's clock reaches every rank with
    the sums)."""
    rows = rows or cfg.train.eval_rows
    n = min(rows or test.n_rows, test.n_rows)
    mine = np.arange(hvd.rank(), n, hvd.size())
    # Rows a chunk so that its logits stay within train.eval_memory_mb.
    chunk = int(max(1, min(2048, cfg.train.eval_memory_mb * 2**20 // (4 * plain.net.n_labels))))
    names = sum_names(True)
    acc = np.zeros(len(names) + 1)
    acc[-1] = extra
    for i in range(0, len(mine), chunk):
        r = mine[i:i + chunk]
        b = batch(test, r)
        top = plain.top5(b[0], b[1], b[2], b[5]).numpy()
        sub = test.subset(r)
        s = metric_sums(top, sub.label_indptr, sub.label_indices, inv_prop)
        acc[:-1] += [s[k] for k in names]
    total = hvd.allreduce(tf.constant(acc), op=hvd.Sum, name="eval_sums").numpy()
    return finalize(dict(zip(names, total[:-1].tolist()))), float(total[-1])


def global_batches(cfg, n_rows: int, ranks: int):
    """(epoch, rows done in it after the step, the step's global rows, the epoch's rows) over
    the whole run: each epoch's shuffle cut into ranks x train.batch_size rows; a remainder
    under half of that joins the last step (one tiny step makes a noisy update)."""
    size = ranks * cfg.train.batch_size
    for epoch in range(math.ceil(cfg.train.epochs)):
        take = n_rows if epoch + 1 <= cfg.train.epochs else max(1, round((cfg.train.epochs - epoch) * n_rows))
        perm = epoch_permutation(n_rows, cfg.train.seed, epoch)[:take]
        cuts = list(range(0, take, size)) + [take]
        if len(cuts) > 2 and cuts[-1] - cuts[-2] < size / 2:
            del cuts[-2]
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            yield epoch, hi, perm[lo:hi], take


def standalone_rate(plain: PlainHorovod, train, cfg) -> float:
    """This rank's rows/s training alone (the step without its allreduce), over at least 8
    steps and train.calibrate_s seconds, with its effects undone."""
    rng = np.random.default_rng(7 + hvd.rank())
    size = min(cfg.train.batch_size, train.n_rows)
    batches = [batch(train, rng.integers(0, train.n_rows, size)) for _ in range(8)]
    with plain.unchanged():
        plain.alone(*batches[0])  # the first run of a traced function is slow
        done, t0 = 0, time.perf_counter()
        while done < 8 or time.perf_counter() - t0 < cfg.train.calibrate_s:
            plain.alone(*batches[done % 8]).numpy()
            done += 1
        return done * size / (time.perf_counter() - t0)


def choose_lr(plain: PlainHorovod, train, cfg, rates: list):
    """optim.lr auto, the way the project chooses (hvd_adaptive.train.tune.auto_choice): by the
    rule, or by the probe (tune.search: its candidates, rows and rule, shared out by the ranks'
    standalone `rates`), each candidate trained with this script's own step without the
    allreduce, from the broadcast start, which is put back; None when the rate is pinned."""
    choice = tune.auto_choice(cfg, train, hvd.allgather_object, lambda: tune.search(
        cfg, train, lambda r: batch(train, r), plain.alone, plain.held_out, plain.opt.lr,
        plain.unchanged, hvd.rank(), hvd.size(), hvd.allgather_object, rates,
        plain.net.drawer.restart if plain.net.drawer is not None else lambda s: None))
    if choice is None:
        return None
    plain.opt.lr.assign(choice.lr)
    if hvd.rank() == 0:
        print(choice.line(), flush=True)
    return choice


def train(cfg, run_dir: Path, threads: int) -> dict:
    """Trains on this rank; rank 0 writes the run folder. Returns the summary."""
    rank, ranks, root = hvd.rank(), hvd.size(), hvd.rank() == 0
    # Rank 0 parses the files and writes the caches, then the others read them.
    train_ds, test_ds = load_data(cfg, root,
                                  lambda: hvd.allreduce(tf.zeros([1]), name="data_barrier").numpy())
    train_ds, _ = split_validation(cfg, train_ds)  # the project's training rows, exactly
    # The model as the project chooses it for this data (model.hidden, loss and output auto).
    cfg = dataclasses.replace(cfg, model=model_for(cfg.model, train_ds.n_features,
                                                   train_ds.n_labels, train_ds.nnz_a_row))
    freq = train_ds.label_frequencies()
    base = most_frequent_label_p1(freq, test_ds.label_indptr, test_ds.label_indices)
    inv_prop = inverse_propensities(freq, train_ds.n_rows, cfg.data.propensity_a, cfg.data.propensity_b)
    plain = PlainHorovod(cfg, train_ds.n_features, train_ds.n_labels, freq)
    hvd.broadcast_variables([*plain.net.ordered, *plain.opt.slots], root_rank=0)
    with plain.unchanged():  # traced and run once before the clock, as the project's steps
        plain.step(*batch(train_ds, np.arange(min(8, train_ds.n_rows))))
        if tune.probes(cfg):  # the probe's judge, as the project runs it before its clock
            tune.warm_up(cfg, train_ds, lambda r: batch(train_ds, r), plain.held_out, hvd.size())
    evaluate(plain, test_ds, cfg, inv_prop, rows=1)  # traced before the clock and any quota
    quota = Heterogeneity(cfg.hetero, rank)
    said = quota.start(threads, tag=f"rank{rank}-{os.getpid()}")
    if said:
        print(f"[rank {rank}] {said}\n", end="", flush=True)
    hvd.allreduce(tf.zeros([1]), name="in_quota").numpy()  # every rank slowed before any times
    rates = hvd.allgather(tf.constant([standalone_rate(plain, train_ds, cfg)])).numpy().tolist()
    choice = choose_lr(plain, train_ds, cfg, rates)
    log = open(run_dir / "metrics.jsonl", "w", buffering=1) if root else None

    def record(**rec):
        if log:
            log.write(json.dumps(rec) + "\n")
    record(event="start", algorithm="horovod", ranks=ranks, standalone_rates=rates,
           hidden=cfg.model.hidden, loss=cfg.model.loss, output=cfg.model.output,
           baseline_p_at_1=base, train_rows=train_ds.n_rows, time=time.time(),
           global_batch=ranks * cfg.train.batch_size, threads=threads,
           horovod_cycle_ms=float(os.environ["HOROVOD_CYCLE_TIME"]),
           mpi_yield_when_idle=os.environ.get("OMPI_MCA_mpi_yield_when_idle"),
           lr=float(plain.opt.lr.numpy()), lr_choice=choice.record() if choice else None)
    # The choice's seconds count, as they do in the project's runs.
    t, clock = cfg.train, {"wall": choice.seconds if choice else 0.0, "began": time.perf_counter()}
    samples, mine, batches, evals, progress, loss = 0, 0, 0, [], 0.0, None

    def evaluate_now() -> bool:
        """Stops the clock, evaluates, records; whether training should stop."""
        if loss is not None:
            loss.numpy()  # the last step has finished (a GPU would run it asynchronously)
        here = clock["wall"] + time.perf_counter() - clock["began"]
        m, clock["wall"] = evaluate(plain, test_ds, cfg, inv_prop, extra=here if root else 0.0)
        evals.append(dict(event="eval", wall_s=round(clock["wall"], 4), epoch=round(progress, 4),
                          samples=samples, **{k: round(v, 5) for k, v in m.items()}))
        record(**evals[-1])
        if root:
            print(f"eval  epoch {progress:6.2f} | {clock['wall']:7.1f} s | P@1 {m['p_at_1']:.4f} "
                  f"P@3 {m['p_at_3']:.4f} P@5 {m['p_at_5']:.4f}\n", end="", flush=True)
        clock["began"] = time.perf_counter()
        return ((t.target_p_at_1 is not None and m["p_at_1"] >= t.target_p_at_1)
                or (t.time_budget_s is not None and clock["wall"] >= t.time_budget_s))

    # Evaluated at the first step after each eval_every mark, where the project's sync is.
    last = 0.0
    for epoch, done, rows, _ in global_batches(cfg, train_ds.n_rows, ranks):
        part = np.array_split(rows, ranks)[rank]
        loss = plain.step(*batch(train_ds, part))
        samples, mine, batches = samples + len(rows), mine + len(part), batches + 1
        progress = epoch + done / train_ds.n_rows
        plain.net.dropout_from(progress)
        if math.floor(progress / t.eval_every + 1e-9) > math.floor(last / t.eval_every + 1e-9) \
                and evaluate_now():
            break
        last = progress
    if not evals or evals[-1]["epoch"] != round(progress, 4):
        evaluate_now()
    wall = clock["wall"]
    per_rank = hvd.allgather(tf.constant([[mine, batches, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                                           quota.quota.cores_set() if quota.quota else -1.0]],
                                         tf.float64)).numpy()
    summary = {
        "algorithm": "horovod", "ranks": ranks, "train_wall_s": round(wall, 3), "samples": int(samples),
        "rows_per_s": round(samples / max(wall, 1e-9), 1),
        "efficiency": round(samples / max(wall, 1e-9) / max(sum(rates), 1e-9), 4),
        "baseline_p_at_1": base, "final": {k: v for k, v in evals[-1].items() if k != "event"},
        "best_p_at_1": max(e["p_at_1"] for e in evals),
        "per_rank": [{"rank": i, "samples": int(r[0]), "batches": int(r[1]),
                      "standalone_rate": round(rates[i], 1), "peak_rss_mb": round(r[2], 1),
                      "quota_cores": None if r[3] < 0 else r[3]} for i, r in enumerate(per_rank)]}
    if root:
        log.close()
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        print(f"done: P@1 {summary['final']['p_at_1']:.4f} after {wall:.1f} s of training "
              f"(baseline P@1 {base:.4f}); {summary['rows_per_s']:.0f} rows/s\n", end="", flush=True)
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="The plain Horovod script (the benchmark's yardstick).")
    ap.add_argument("--config", required=True)
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--set", action="append", default=[], help="section.key=value (YAML value)")
    a = ap.parse_args(argv)
    try:
        cfg, _ = load_config(a.config, a.set)
        check(cfg)
    except ConfigError as e:
        print(f"plain_horovod: error: {e}", file=sys.stderr)
        return 2
    # The project's settings for Horovod and OpenMPI (hvd_adaptive/parallel/distributed.py), copied as
    # values: an exported value wins. Both must be set before hvd.init starts MPI.
    os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")  # waiting ranks yield their core
    cores = smallest_quota(cfg.hetero, cfg.train.threads or 1)
    cycle = 5.0 if cores is None or cores >= 1 else min(50.0, round(5.0 / cores, 1))
    os.environ.setdefault("HOROVOD_CYCLE_TIME", f"{cycle:g}")
    hvd.init()
    try:
        threads = cfg.train.threads or max(1, len(os.sched_getaffinity(0)) // hvd.local_size())
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(min(2, threads))
        run_dir = Path(a.run_dir)
        if hvd.rank() == 0:
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n")
        train(cfg, run_dir, threads)
        hvd.shutdown()
    except BaseException as e:  # noqa: BLE001 - a rank that fails must end the job, never hang it
        print(f"[rank {hvd.rank()}] error: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)  # mpirun then ends the other ranks
    return 0


if __name__ == "__main__":
    sys.exit(main())
