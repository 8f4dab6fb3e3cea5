"""The sparse XMC network and its optimizers, as plain tf.Module / tf.Variable.

Keras 3 variables break Horovod 0.28 (no `.ref()`), so nothing here touches Keras.
The input layer is a row gather from W1 followed by a segment sum: its cost scales with the
batch's non-zeros and its gradient is a tf.IndexedSlices touching only those rows.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

from hvd_adaptive.config import ModelConfig, OptimConfig
from hvd_adaptive.data import Batch

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


def batch_tensors(b: Batch) -> tuple:
    """Turns a numpy Batch into the tensors of BATCH_SIGNATURE."""
    return (tf.constant(b.feat_ids), tf.constant(b.feat_vals), tf.constant(b.feat_seg),
            tf.constant(b.label_ids), tf.constant(b.label_seg), tf.constant(b.label_w),
            tf.constant(b.size, tf.int32))


def _glorot(rng: np.random.Generator, fan_in: int, fan_out: int) -> np.ndarray:
    lim = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-lim, lim, size=(fan_in, fan_out)).astype(np.float32)


class SparseMLP(tf.Module):
    """Sparse input -> hidden ReLU layer(s) -> logits over all labels.

    Initial weights come from a numpy generator seeded by `cfg.init_seed`, so every rank builds
    the same model; the algorithms still broadcast rank 0's variables once to be safe.
    """

    def __init__(self, n_features: int, n_labels: int, cfg: ModelConfig):
        super().__init__(name="sparse_mlp")
        rng = np.random.default_rng(cfg.init_seed)
        widths = [n_features, *cfg.hidden, n_labels]
        self.dropout = cfg.dropout
        self.weights_ = [tf.Variable(_glorot(rng, a, b), name=f"w{i}")
                         for i, (a, b) in enumerate(zip(widths[:-1], widths[1:]))]
        self.biases = [tf.Variable(np.zeros(b, np.float32), name=f"b{i}")
                       for i, b in enumerate(widths[1:])]
        self.n_features, self.n_labels = n_features, n_labels

    @property
    def variables_list(self) -> list[tf.Variable]:
        """All variables in a fixed order (input layer first), the order every collective uses."""
        return [v for pair in zip(self.weights_, self.biases) for v in pair]

    def logits(self, feat_ids, feat_vals, feat_seg, size, training: bool = False):
        rows = tf.gather(self.weights_[0], feat_ids) * feat_vals[:, None]
        h = tf.math.unsorted_segment_sum(rows, feat_seg, size) + self.biases[0]
        for w, b in zip(self.weights_[1:], self.biases[1:]):
            h = tf.nn.relu(h)
            if training and self.dropout > 0:
                h = tf.nn.dropout(h, rate=self.dropout)
            h = tf.matmul(h, w) + b
        return h

    def loss(self, feat_ids, feat_vals, feat_seg, label_ids, label_seg, label_w, size,
             training: bool = True):
        """Softmax cross-entropy against the multi-hot target normalized to sum 1.

        Rows without labels carry no target and are left out of the mean.
        """
        z = self.logits(feat_ids, feat_vals, feat_seg, size, training)
        lse = tf.reduce_logsumexp(z, axis=1)
        picked = tf.gather_nd(z, tf.stack([label_seg, label_ids], axis=1))
        target = tf.math.unsorted_segment_sum(label_w * picked, label_seg, size)
        has = tf.math.unsorted_segment_sum(label_w, label_seg, size)  # 1 with labels, else 0
        return tf.reduce_sum(has * lse - target) / tf.maximum(tf.reduce_sum(has), 1.0)


# Optimizers updated by TensorFlow's own kernels (dense and row-sparse).
_FUSED = ("sgd", "momentum", "adagrad")


def _dedupe(g: tf.IndexedSlices) -> tuple[tf.Tensor, tf.Tensor]:
    """Sums the rows of duplicated indices so per-row optimizer state updates once."""
    idx, pos = tf.unique(g.indices)
    vals = tf.math.unsorted_segment_sum(g.values, pos, tf.shape(idx)[0])
    return idx, vals


class Optimizer(tf.Module):
    """SGD, momentum, Adam and Adagrad with lazy (row-sparse) updates for IndexedSlices.

    SGD, momentum and Adagrad use TensorFlow's fused kernels (ResourceApply* and
    ResourceSparseApply*); Adam, which has no lazy kernel, is written out here. Duplicate rows
    of a sparse gradient are summed first, so per-row state updates once per step.

    The learning rate is a tf.Variable so per-rank schedules change it without retracing.
    Weight decay is added to the gradient of the parameters an update touches.
    """

    def __init__(self, variables: Sequence[tf.Variable], cfg: OptimConfig):
        super().__init__(name="optimizer")
        self.cfg = cfg
        self.lr = tf.Variable(cfg.lr, dtype=tf.float32, trainable=False, name="lr")
        self.t = tf.Variable(0.0, dtype=tf.float32, trainable=False, name="t")
        nslots = {"sgd": 0, "momentum": 1, "adagrad": 1, "adam": 2}[cfg.name]
        self.slots = [[tf.Variable(tf.zeros_like(v), trainable=False) for _ in range(nslots)]
                      for v in variables]

    def slot_variables(self) -> list[tf.Variable]:
        return [s for group in self.slots for s in group] + [self.t]

    def apply(self, grads, variables) -> None:
        c = self.cfg
        self.t.assign_add(1.0)
        for g, v, slots in zip(grads, variables, self.slots):
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
                v.scatter_sub(tf.IndexedSlices(upd, idx))
            else:
                v.assign_sub(upd)

    def _fused(self, name: str, v, slots, g, idx) -> None:
        """TensorFlow's fused update kernels (one pass over the touched rows)."""
        lr = tf.cast(self.lr, v.dtype)
        if name == "sgd":
            if idx is None:
                tf.raw_ops.ResourceApplyGradientDescent(var=v.handle, alpha=lr, delta=g)
            else:
                v.scatter_sub(tf.IndexedSlices(lr * g, idx))
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

    @staticmethod
    def _read(slot, idx):
        return slot if idx is None else tf.gather(slot, idx)

    @staticmethod
    def _write(slot, idx, value):
        if idx is None:
            slot.assign(value)
        else:
            slot.scatter_update(tf.IndexedSlices(value, idx))
