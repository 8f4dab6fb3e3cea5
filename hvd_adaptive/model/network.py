"""The sparse XMC network and its optimizers, as plain tf.Module / tf.Variable.

Keras 3 variables break Horovod 0.28 (no `.ref()`), so nothing here touches Keras.
The input layer is a row gather from W1 followed by a segment sum: its cost scales with the
batch's non-zeros and its gradient is a tf.IndexedSlices touching only those rows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from hvd_adaptive.tfload import tf

from hvd_adaptive.config import (LINEAR_MAX_WEIGHTS, ConfigError, ModelConfig, OptimConfig,
                                  model_for)
from hvd_adaptive.data import Batch
from hvd_adaptive.model.negatives import Negatives

# The step functions take a batch as these seven tensors (see hvd_adaptive.data.Batch).
BATCH_SIGNATURE = (
    tf.TensorSpec([None], tf.int64),    # feat_ids
    tf.TensorSpec([None], tf.float32),  # feat_vals
    tf.TensorSpec([None], tf.int32),    # feat_seg
    tf.TensorSpec([None], tf.int32),    # label_ids
    tf.TensorSpec([None], tf.int32),    # label_seg
    tf.TensorSpec([None], tf.float32),  # label_w
    tf.TensorSpec([], tf.int32),        # size
)
# The probe's judge (SparseMLP.loss_and_top) takes a batch and the labels it scores.
JUDGE_SIGNATURE = (
    *BATCH_SIGNATURE,
    tf.TensorSpec([None], tf.int64),    # labels (empty: every label)
    tf.TensorSpec([None], tf.float32),  # their corrections in the loss
)


def batch_tensors(b: Batch) -> tuple:
    """Turns a numpy Batch into the tensors of BATCH_SIGNATURE."""
    return (tf.constant(b.feat_ids), tf.constant(b.feat_vals), tf.constant(b.feat_seg),
            tf.constant(b.label_ids), tf.constant(b.label_seg), tf.constant(b.label_w),
            tf.constant(b.size, tf.int32))


class TouchedRows(tf.Module):
    """Which rows of the row-sparse variables this rank's training reached since the last clear.

    A contract between three parts, named and owned here: the model's loss marks the rows its
    gradient reaches (`mark`), every window's start clears them (`clear`, in
    Algorithm.run_round, so that calibration and warm-up steps do not count), and the sparse
    merge reads them (`numpy`) to agree on the union of rows that travel and to normalize rows
    by the ranks that trained them. One boolean mask per kind of row: FEATURES (rows of the
    input layer: the batch's features) and LABELS (the output layer's rows and its bias: the
    candidates under the sampled loss, the batch's positive labels under the full softmax);
    SparseMLP.row_masks says which mask indexes which variable, and how.
    """

    FEATURES, LABELS = 0, 1

    def __init__(self, n_features: int, n_labels: int):
        super().__init__(name="touched")
        self.masks = (tf.Variable(tf.zeros([n_features], tf.bool), trainable=False, name="touched_in"),
                      tf.Variable(tf.zeros([n_labels], tf.bool), trainable=False, name="touched_out"))

    def __len__(self) -> int:
        return len(self.masks)

    @property
    def sizes(self) -> list[int]:
        """Rows of each mask (features, labels)."""
        return [int(m.shape[0]) for m in self.masks]

    def mark(self, kind: int, ids) -> None:
        """Marks rows `ids` (a tensor; duplicates allowed) of mask `kind`; graph-safe."""
        self.masks[kind].scatter_update(tf.IndexedSlices(tf.ones_like(ids, tf.bool), ids))

    def clear(self) -> None:
        for m in self.masks:
            m.assign(tf.zeros_like(m))

    def numpy(self) -> list[np.ndarray]:
        """The masks as numpy bool arrays, in the order FEATURES, LABELS."""
        return [m.numpy() for m in self.masks]


@dataclass(frozen=True)
class RowMask:
    """How a variable's rows relate to a mask of TouchedRows (SparseMLP.row_masks).

    mask: TouchedRows.FEATURES or LABELS; axis: the variable's axis the mask indexes (the full
    softmax keeps its kernel [hidden x labels], so its labels are axis 1). sparse: only the ranks
    that touched a row changed it, so rows nobody touched are equal on every rank and a merge
    may leave them out (the input layer; the output layer under the sampled loss). Under the
    full softmax every step changes every label's row a little (the softmax's negative part),
    so the mask there marks the labels a rank trained as positives, which carry the large
    changes: not sparse, but the merge can still normalize those rows by the ranks that had
    them (adaptive.label_norm).
    """

    mask: int
    axis: int = 0
    sparse: bool = True


def _glorot(rng: np.random.Generator, fan_in: int, fan_out: int) -> np.ndarray:
    lim = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-lim, lim, size=(fan_in, fan_out)).astype(np.float32)


class SparseMLP(tf.Module):
    """Sparse input -> hidden ReLU layer(s) -> logits over all labels; or, with no hidden layer
    (model.hidden: []), a linear model: the logits are the input row times a [features x labels]
    layer read by the batch's feature rows (row-sparse like the input layer), from zero.

    The input layer is stored [features x hidden] and read by rows, so its gradient is
    row-sparse. Under the sampled loss the output layer is stored [labels x hidden] (with its
    bias [labels]) and only the candidates' rows are gathered, so its gradient is an
    IndexedSlices over those labels and optimizer updates are lazy there too; the full softmax
    keeps the dense kernel [hidden x labels]. Initial weights come from a numpy generator seeded by `cfg.init_seed`,
    so every rank builds the same model; the algorithms still broadcast rank 0's variables.

    `touched` (TouchedRows) holds the rows that training steps reached since the window began.
    """

    def __init__(self, n_features: int, n_labels: int, cfg: ModelConfig,
                 label_freq: Optional[np.ndarray] = None, stream: int = 0):
        super().__init__(name="sparse_mlp")
        if cfg.hidden == "auto":
            raise ValueError("SparseMLP builds a chosen model: resolve model.hidden auto with "
                             "config.model_for, which reads the rows")
        cfg = model_for(cfg, n_features, n_labels)  # model.loss and output auto for this data
        rng = np.random.default_rng(cfg.init_seed)
        widths = [n_features, *cfg.hidden]
        self.dropout = cfg.dropout
        # The rate the traced steps read, where there is dropout: `dropout` from the first
        # step, or 0 until `dropout_on` sees model.dropout_after epochs trained. Not a model
        # variable (no merge, broadcast or checkpoint carries it).
        self.dropout_rate = (tf.Variable(cfg.dropout if cfg.dropout_after <= 0 else 0.0,
                                         trainable=False, name="dropout_rate")
                             if cfg.dropout > 0 else None)
        self.label_smoothing = cfg.label_smoothing
        self.cfg = cfg
        self.linear, self.sigmoid = cfg.linear, cfg.loss == "sigmoid"
        if self.linear and n_features * n_labels > LINEAR_MAX_WEIGHTS:
            raise ConfigError(
                f"model.hidden: [] (a linear model) needs {n_features:,} features x {n_labels:,} "
                f"labels = {n_features * n_labels:,} weights, more than the {LINEAR_MAX_WEIGHTS:,} "
                "it takes (1 GiB); give it a hidden layer (model.hidden: [128])")
        hidden = [tf.Variable(_glorot(rng, a, b), name=f"w{i}")
                  for i, (a, b) in enumerate(zip(widths[:-1], widths[1:]))]
        self.sampled = cfg.output == "sampled"
        # The sampled loss gathers output rows, so its output layer is [labels x hidden]; the
        # full softmax keeps the dense kernel [hidden x labels], whose matmul and gradient ran
        # faster than the transposed product at 67,009 labels (docs/benchmark.md, "Figures
        # behind the code's defaults").
        kernel = (np.zeros((n_features, n_labels), np.float32) if self.linear
                  else _glorot(rng, widths[-1], n_labels))
        out = tf.Variable(kernel.T.copy() if self.sampled else kernel, name=f"w{len(hidden)}")
        self.layers = [*hidden, out]
        self.biases = [tf.Variable(np.zeros(b, np.float32), name=f"b{i}")
                       for i, b in enumerate([*cfg.hidden, n_labels])]
        self.n_features, self.n_labels = n_features, n_labels
        self.touched = TouchedRows(n_features, n_labels)
        if self.sampled and cfg.negatives >= n_labels:
            raise ConfigError(f"model.negatives: {cfg.negatives} negatives need more than "
                              f"{cfg.negatives} labels, the data has {n_labels}; lower it or use "
                              "model.output: full")
        self.negatives = None
        if self.sampled:
            if cfg.sampler == "frequency" and label_freq is None:
                raise ValueError("the frequency sampler needs the training label frequencies")
            self.negatives = Negatives(n_labels, cfg.negatives, cfg.init_seed, stream,
                                       None if cfg.sampler == "uniform" else label_freq)

    def restart_draws(self, stream: int) -> None:
        """`Negatives.restart` where the loss samples, else nothing."""
        if self.negatives is not None:
            self.negatives.restart(stream)

    def random_state(self) -> list[tf.Variable]:
        """The variables that fix the next random draws (the sampled loss's counter): put back
        with the model where steps must not count (tune.unchanged)."""
        return [] if self.negatives is None else [self.negatives.count]

    @property
    def variables_list(self) -> list[tf.Variable]:
        """All variables in a fixed order (input layer first), the order every collective uses."""
        return [v for pair in zip(self.layers, self.biases) for v in pair]

    @property
    def row_axes(self) -> list[Optional[int]]:
        """Per variable of `variables_list`: 0 for the row-sparse 2-D layers, whose steps read
        and update rows (the input layer's features; the sampled output layer's labels), else
        None. The row-wise optimizer keeps one accumulator a row there."""
        return [0 if rm is not None and rm.sparse and len(v.shape) == 2 else None
                for v, rm in zip(self.variables_list, self.row_masks)]

    @property
    def row_masks(self) -> list[Optional[RowMask]]:
        """Per variable of `variables_list`: the mask of `touched` that indexes its rows, or None
        for the hidden layers and their biases (every step changes them whole)."""
        if self.linear:  # [features x labels] read by features; its bias by the positives
            return [RowMask(TouchedRows.FEATURES), RowMask(TouchedRows.LABELS, sparse=False)]
        n = len(self.variables_list)
        out = ([RowMask(TouchedRows.LABELS), RowMask(TouchedRows.LABELS)] if self.sampled else
               [RowMask(TouchedRows.LABELS, axis=1, sparse=False),
                RowMask(TouchedRows.LABELS, sparse=False)])
        return [RowMask(TouchedRows.FEATURES), *[None] * (n - 3), *out]

    def hidden(self, feat_ids, feat_vals, feat_seg, size, training: bool = False):
        """The last hidden layer's activations, [rows x hidden]; `feat_seg` non-decreasing (the
        batch's rows one after another, as `make_batch` builds them). A linear model's are its
        input rows, dense [rows x features] (evaluation's label blocks read them)."""
        if self.linear:
            at = tf.stack([feat_seg, tf.cast(feat_ids, tf.int32)], axis=1)
            return tf.scatter_nd(at, feat_vals, tf.stack([size, self.n_features]))
        rows = tf.gather(self.layers[0], feat_ids) * feat_vals[:, None]
        h = row_sums(rows, feat_seg, size) + self.biases[0]
        for w, b in zip(self.layers[1:-1], self.biases[1:-1]):
            h = tf.matmul(self._act(h, training), w) + b
        return self._act(h, training)

    def _act(self, h, training: bool):
        h = tf.nn.relu(h)
        if training and self.dropout > 0:
            h = tf.nn.dropout(h, rate=self.dropout_rate)
        return h

    def dropout_on(self, epochs: float) -> bool:
        """Sets the dropout rate for training past `epochs` epochs (model.dropout_after);
        True where this call switched it on."""
        if self.dropout > 0 and epochs >= self.cfg.dropout_after and self.dropout_rate.numpy() == 0:
            self.dropout_rate.assign(self.dropout)
            return True
        return False

    def logits(self, feat_ids, feat_vals, feat_seg, size, training: bool = False):
        """Logits over every label."""
        if self.linear:  # the batch's feature rows, summed: its gradient is row-sparse
            rows = tf.gather(self.layers[0], feat_ids) * feat_vals[:, None]
            return row_sums(rows, feat_seg, size) + self.biases[0]
        h = self.hidden(feat_ids, feat_vals, feat_seg, size, training)
        return tf.matmul(h, self.layers[-1], transpose_b=self.sampled) + self.biases[-1]

    def block_logits(self, h, start, stop):
        """Logits of labels [start, stop) for hidden activations `h` (blocked evaluation)."""
        # A gather reads only the block's rows (slicing the variable would read all of it).
        rows = tf.range(start, stop)
        w = tf.gather(self.layers[-1], rows, axis=0 if self.sampled else 1)
        return tf.matmul(h, w, transpose_b=self.sampled) + tf.gather(self.biases[-1], rows)

    def loss(self, feat_ids, feat_vals, feat_seg, label_ids, label_seg, label_w, size,
             training: bool = True):
        """Softmax cross-entropy against the multi-hot target normalized to sum 1, over all
        labels (output: full) or over a sampled candidate set (output: sampled); under
        model.loss sigmoid, one logistic loss a label (`_sigmoid_xent`).

        Rows without labels carry no target and are left out of the softmax's mean (the
        sigmoid's counts them, every label negative). In training,
        `touched` marks the batch's features, and its labels: the candidates (sampled) or the
        positives (full softmax).
        """
        if training:
            self.touched.mark(TouchedRows.FEATURES, feat_ids)
        if not self.sampled:
            if training:
                self.touched.mark(TouchedRows.LABELS, label_ids)
            z = self.logits(feat_ids, feat_vals, feat_seg, size, training)
            if self.sigmoid:
                return _sigmoid_xent(z, label_ids, label_seg, size)
            return _softmax_xent(z, label_ids, label_seg, label_w, size,
                                 self.label_smoothing if training else 0.0)
        cand, corr, label_pos = self.candidates(label_ids)
        if training:
            self.touched.mark(TouchedRows.LABELS, cand)
        return self.candidate_loss(feat_ids, feat_vals, feat_seg, cand, corr, label_pos, label_seg,
                                   label_w, size, training)

    def loss_and_top(self, feat_ids, feat_vals, feat_seg, label_ids, label_seg, label_w, size,
                     labels, corrections, k: int = 5, top_labels=None):
        """The probe's judge (hvd_adaptive.train.tune.HeldOut): the softmax's cross-entropy
        (whatever `output` and `loss`; the loss a sampled model approximates) and each row's k
        best label ids, by `top_labels(logits, k)` (default `tf.math.top_k`'s indices), over
        every label when `labels` is empty, else over `labels` alone (ascending, holding every
        label of the rows), their logits less `corrections` in the loss (tune.judge_labels)."""
        h = self.hidden(feat_ids, feat_vals, feat_seg, size)
        w, b = self.layers[-1], self.biases[-1]

        def top(z):
            n = min(k, self.n_labels)
            return tf.cast(top_labels(z, n) if top_labels else tf.math.top_k(z, k=n).indices,
                           tf.int64)

        def every():
            z = tf.matmul(h, w, transpose_b=self.sampled) + b
            return _softmax_xent(z, label_ids, label_seg, label_w, size), top(z)

        def among():
            z = (tf.matmul(h, tf.gather(w, labels, axis=0 if self.sampled else 1),
                           transpose_b=self.sampled) + tf.gather(b, labels))
            where = tf.searchsorted(labels, tf.cast(label_ids, tf.int64))
            return (_softmax_xent(z - corrections, where, label_seg, label_w, size),
                    tf.gather(labels, top(z)))

        return tf.cond(tf.size(labels) > 0, among, every)

    def candidates(self, label_ids):
        """The batch's candidate labels: its positives (always in, no correction) then the
        negatives `Negatives` draws, each with the correction log(expected count) that sampled
        softmax subtracts from its logit; negatives that are positives of the batch are kept
        once, as positives.

        Returns (candidates int64, corrections float32, position of each label_ids entry in
        candidates).
        """
        pos, label_pos = tf.unique(tf.cast(label_ids, tf.int64))
        neg, log_expected = self.negatives.draw()
        both = tf.concat([pos, neg], 0)
        corr = tf.concat([tf.zeros(tf.shape(pos), tf.float32), log_expected], 0)
        cand, where = tf.unique(both)  # positives first, in order, so label_pos stays valid
        first = tf.math.unsorted_segment_min(tf.range(tf.size(both)), where, tf.size(cand))
        return cand, tf.gather(corr, first), label_pos

    def candidate_loss(self, feat_ids, feat_vals, feat_seg, cand, corr, label_pos, label_seg,
                       label_w, size, training: bool = True):
        """Softmax cross-entropy over the labels `cand` only, logits minus `corr`; label_pos
        gives each target label's position in `cand`. With every label as candidate and no
        correction this is the full loss."""
        h = self.hidden(feat_ids, feat_vals, feat_seg, size, training)
        w = tf.gather(self.layers[-1], cand)
        z = tf.matmul(h, w, transpose_b=True) + tf.gather(self.biases[-1], cand) - corr
        return _softmax_xent(z, label_pos, label_seg, label_w, size)


def _sigmoid_xent(z, label_ids, label_seg, size):
    """Mean over the batch's rows of the sum over every label of the logistic loss, the row's
    labels the positives (model.loss: sigmoid)."""
    at = tf.stack([label_seg, tf.cast(label_ids, tf.int32)], axis=1)
    y = tf.minimum(tf.scatter_nd(at, tf.ones_like(label_seg, tf.float32), tf.shape(z)), 1.0)
    per_row = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=z), axis=1)
    return tf.reduce_sum(per_row) / tf.maximum(tf.cast(size, tf.float32), 1.0)


def _softmax_xent(z, label_ids, label_seg, label_w, size, smoothing: float = 0.0):
    """Mean over the rows with labels of the cross-entropy against their target, with
    `smoothing` of it spread evenly over every label (model.label_smoothing)."""
    lse = tf.reduce_logsumexp(z, axis=1)
    picked = tf.gather_nd(z, tf.stack([label_seg, tf.cast(label_ids, tf.int32)], axis=1))
    target = tf.math.unsorted_segment_sum(label_w * picked, label_seg, size)
    has = tf.math.unsorted_segment_sum(label_w, label_seg, size)  # 1 with labels, else 0
    if smoothing:
        target = (1.0 - smoothing) * target + smoothing * has * tf.reduce_mean(z, axis=1)
    return tf.reduce_sum(has * lse - target) / tf.maximum(tf.reduce_sum(has), 1.0)


# Optimizers updated by TensorFlow's own kernels (dense and row-sparse).
_FUSED = ("sgd", "momentum", "adagrad")


def row_sums(x, seg, size):
    """[size, width]: the rows of `x` ([entries, width]) summed by their batch row `seg`, which
    must be non-decreasing (TensorFlow raises InvalidArgumentError otherwise); rows without
    entries are zeros. TensorFlow's sorted segment sum, padded for trailing rows without
    entries: on a 256-row batch at 67,009 labels the input layer's sum took 2.74 ms against
    the unsorted one's 5.85 (docs/benchmark.md, "The optimizer's row writes")."""
    h = tf.math.segment_sum(x, seg)
    return tf.pad(h, [[0, size - tf.shape(h)[0]], [0, 0]])


def _dedupe(g: tf.IndexedSlices) -> tuple[tf.Tensor, tf.Tensor]:
    """Sums the rows of duplicated indices so per-row optimizer state updates once."""
    idx, pos = tf.unique(g.indices)
    vals = tf.math.unsorted_segment_sum(g.values, pos, tf.shape(idx)[0])
    return idx, vals


def summed_rows(g: tf.IndexedSlices) -> tf.IndexedSlices:
    """`g` with the rows of duplicated indices summed (`_dedupe`), the same gradient."""
    idx, vals = _dedupe(g)
    return tf.IndexedSlices(vals, idx, g.dense_shape)


def _subtract_rows(v: tf.Variable, idx, step) -> None:
    """v[idx] -= step for distinct `idx` (`_dedupe`'s): the rows read, subtracted and written
    back. TensorFlow's CPU scatter-subtract took 2.7 times as long on a 256-row batch's 12,291
    distinct input rows at 67,009 labels (docs/benchmark.md, "The optimizer's row writes");
    with distinct rows the result is the same to the bit."""
    v.scatter_update(tf.IndexedSlices(tf.gather(v, idx) - step, idx))


class Optimizer(tf.Module):
    """SGD, momentum, Adam, Adagrad and row-wise Adagrad with lazy (row-sparse) updates for
    IndexedSlices.

    SGD, momentum and Adagrad use TensorFlow's fused kernels (ResourceApply* and
    ResourceSparseApply*); Adam, which has no lazy kernel, is written out here. Duplicate rows
    of a sparse gradient are summed first, so per-row state updates once per step.

    Row-wise Adagrad (rowwise_adagrad) keeps one accumulator a row on the row-sparse layers
    (`row_axes`, SparseMLP.row_axes: the input layer's features, the sampled output layer's
    labels), the mean of the row's squared gradient, and Adagrad's per-weight accumulator
    elsewhere (hidden and dense output layers, biases):

        acc[r] += mean_j g[r, j]^2;  var[r, j] -= lr g[r, j] / (sqrt(acc[r]) + eps)

    The input layer's state is then one value a feature instead of one a weight, which
    adaptive SGD's merges carry with the model (adaptive.opt_state: average). A row-wise
    accumulator per label on the full softmax's dense output layer cost sync many more rows to
    the target at 67,009 labels (docs/benchmark.md, "Where the defaults come from"), so that
    layer keeps Adagrad's.

    The states start at OptimConfig.start (`linear`: the variables are a linear model's, whose
    row-sparse layer starts at its own value under optim.initial_accumulator_rows auto).
    The learning rate is a tf.Variable so per-rank schedules change it without retracing.
    Weight decay is added to the gradient of the parameters an update touches.
    """

    def __init__(self, variables: Sequence[tf.Variable], cfg: OptimConfig,
                 row_axes: Optional[Sequence[Optional[int]]] = None, linear: bool = False):
        super().__init__(name="optimizer")
        self.cfg = cfg
        # optim.lr "auto" is set once the probe has chosen (hvd_adaptive.train.tune).
        lr = 0.0 if cfg.lr == "auto" else cfg.lr
        self.lr = tf.Variable(lr, dtype=tf.float32, trainable=False, name="lr")
        self.t = tf.Variable(0.0, dtype=tf.float32, trainable=False, name="t")
        if cfg.name == "rowwise_adagrad" and row_axes is None:
            raise ValueError("rowwise_adagrad needs the row axes of the model's layers (row_axes)")
        self.row_axes = list(row_axes) if row_axes is not None else [None] * len(variables)
        nslots = {"sgd": 0, "momentum": 1, "adagrad": 1, "rowwise_adagrad": 1, "adam": 2}[cfg.name]
        self.slots = [[tf.Variable(tf.fill(self._slot_shape(v, axis),
                                           cfg.start(axis is not None, linear)),
                                   trainable=False)
                       for _ in range(nslots)] for v, axis in zip(variables, self.row_axes)]

    @classmethod
    def for_model(cls, model: "SparseMLP", cfg: OptimConfig) -> "Optimizer":
        """The optimizer of a model's variables, with the model's row axes (and its rows'
        start: a linear model's, OptimConfig.rows_start)."""
        return cls(model.variables_list, cfg, model.row_axes, linear=model.linear)

    def _slot_shape(self, v: tf.Variable, axis: Optional[int]) -> list[int]:
        """A weight's shape, or for row-wise Adagrad's layers with rows one value a row, kept
        2-D ([rows, 1] or [1, rows]) so it broadcasts against the layer and merges by row."""
        shape = list(v.shape)
        if self.cfg.name == "rowwise_adagrad" and axis is not None:
            shape[1 - axis] = 1
        return shape

    def slot_variables(self) -> list[tf.Variable]:
        return [s for group in self.slots for s in group] + [self.t]

    def apply(self, grads, variables) -> None:
        c = self.cfg
        self.t.assign_add(1.0)
        for g, v, slots, axis in zip(grads, variables, self.slots, self.row_axes):
            if g is None:
                continue
            sparse = isinstance(g, tf.IndexedSlices)
            if sparse:
                idx, gv = _dedupe(g)
                cur = tf.gather(v, idx) if c.weight_decay > 0 else None
            else:
                idx, gv, cur = None, g, v
            if c.weight_decay > 0:
                gv = gv + c.weight_decay * cur
            if c.name == "rowwise_adagrad":  # Adagrad's kernels on the layers without rows
                if axis is None:
                    self._fused("adagrad", v, slots, gv, idx)
                else:
                    self._rowwise(v, slots[0], gv, idx, axis)
                continue
            if c.name in _FUSED:
                self._fused(c.name, v, slots, gv, idx)
                continue
            # Adam has no lazy (row-sparse) kernel in TensorFlow: its rows are updated here.
            m = c.beta1 * self._read(slots[0], idx) + (1 - c.beta1) * gv
            s = c.beta2 * self._read(slots[1], idx) + (1 - c.beta2) * gv * gv
            self._write(slots[0], idx, m)
            self._write(slots[1], idx, s)
            corr = tf.sqrt(1 - c.beta2 ** self.t) / (1 - c.beta1 ** self.t)
            upd = self.lr * corr * m / (tf.sqrt(s) + c.eps)
            if sparse:
                _subtract_rows(v, idx, upd)
            else:
                v.assign_sub(upd)

    def _fused(self, name: str, v, slots, g, idx) -> None:
        """TensorFlow's fused update kernels (one pass over the touched rows)."""
        lr = tf.cast(self.lr, v.dtype)
        if name == "sgd":
            if idx is None:
                tf.raw_ops.ResourceApplyGradientDescent(var=v.handle, alpha=lr, delta=g)
            else:
                _subtract_rows(v, idx, lr * g)
        elif name == "momentum":
            mom = tf.constant(self.cfg.momentum, v.dtype)
            if idx is None:
                tf.raw_ops.ResourceApplyMomentum(var=v.handle, accum=slots[0].handle, lr=lr, grad=g,
                                                 momentum=mom)
            else:
                tf.raw_ops.ResourceSparseApplyMomentum(var=v.handle, accum=slots[0].handle, lr=lr,
                                                       grad=g, indices=idx, momentum=mom)
        else:  # adagrad: accum += g^2; var -= lr g / (sqrt(accum) + eps)
            eps = tf.constant(self.cfg.eps, v.dtype)
            if idx is None:
                tf.raw_ops.ResourceApplyAdagradV2(var=v.handle, accum=slots[0].handle, lr=lr,
                                                  epsilon=eps, grad=g)
            else:
                tf.raw_ops.ResourceSparseApplyAdagradV2(var=v.handle, accum=slots[0].handle, lr=lr,
                                                        epsilon=eps, grad=g, indices=idx)

    def _rowwise(self, v, acc, g, idx, axis: int) -> None:
        """Row-wise Adagrad on a layer whose rows lie along `axis` (sparse gradients: axis 0)."""
        if idx is not None and axis != 0:
            raise ValueError("a row-sparse gradient indexes axis 0; this layer's rows are axis 1")
        lr = tf.cast(self.lr, v.dtype)
        grown = self._read(acc, idx) + tf.reduce_mean(tf.square(g), axis=1 - axis, keepdims=True)
        self._write(acc, idx, grown)
        step = g * (lr / (tf.sqrt(grown) + self.cfg.eps))
        if idx is None:
            v.assign_sub(step)
        else:
            _subtract_rows(v, idx, step)

    @staticmethod
    def _read(slot, idx):
        return slot if idx is None else tf.gather(slot, idx)

    @staticmethod
    def _write(slot, idx, value):
        if idx is None:
            slot.assign(value)
        else:
            slot.scatter_update(tf.IndexedSlices(value, idx))
