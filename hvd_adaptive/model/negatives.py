"""The sampled loss's negatives: which labels a batch's softmax is computed over besides its own,
and the correction each needs. The project's network (hvd_adaptive.model.network) and the
benchmark's plain Horovod script draw them here, so that from the same seeds both train on the
same draws."""
from __future__ import annotations

from typing import Optional

import numpy as np

from hvd_adaptive.tfload import tf


def draws_for(p: np.ndarray, m: int) -> float:
    """The number of draws T with replacement from the distribution `p` whose expected count of
    distinct labels is `m`: sum_i 1 - (1 - p_i)^T = m (bisection; `m` below the label count)."""
    log_miss = np.log1p(-np.asarray(p, np.float64))

    def distinct(t: float) -> float:
        return float(-np.expm1(t * log_miss).sum())

    lo = hi = float(m)  # m draws give at most m distinct labels
    while distinct(hi) < m:
        hi *= 2.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if distinct(mid) < m else (lo, mid)
    return hi


class Negatives(tf.Module):
    """The sampled loss's negatives for one batch: `tries` labels drawn with replacement from
    the proposal p (uniform, or TensorFlow's frequency proposal: (training count + 1)^0.75),
    each kept once, with the log of its expected count log(1 - (1 - p)^tries) as the correction
    sampled softmax subtracts. `tries` is fixed (`draws_for`) so that `m` (model.negatives)
    distinct labels are expected; the correction is then each label's exact probability of
    being among them.

    The draws are stateless: a batch's come from (model.init_seed, a counter that each draw
    advances), the counter starting at `stream` << 40 (each rank its own stream). A run's
    negatives are fixed by its seeds, and steps that put the counter back with the model
    (tune.unchanged: each of the rate probe's candidates) draw the same negatives, so the
    probe compares its candidates on the same draws."""

    def __init__(self, n_labels: int, m: int, seed: int, stream: int = 0,
                 label_freq: Optional[np.ndarray] = None):
        super().__init__(name="negatives")
        if label_freq is None:
            p = np.full(n_labels, 1.0 / n_labels)
        else:
            w = (np.asarray(label_freq, np.float64) + 1.0) ** 0.75
            p = w / w.sum()
        self.n_labels, self.tries = n_labels, max(1, int(round(draws_for(p, m))))
        self.cdf = None if label_freq is None else tf.constant(np.cumsum(p), tf.float64)
        self.log_expected = tf.constant(np.log(-np.expm1(self.tries * np.log1p(-p))), tf.float32)
        self.seed = tf.constant(seed, tf.int64)
        self.count = tf.Variable(np.int64(stream) << 40, trainable=False, name="draws")

    def restart(self, stream: int) -> None:
        """The next draws are `stream`'s first (the rate probe's candidates: one stream on
        every rank, whichever rank trains the candidate)."""
        self.count.assign(np.int64(stream) << 40)

    def draw(self):
        """(distinct labels int64, their log expected counts float32) for the next batch."""
        u = tf.random.stateless_uniform([self.tries], tf.stack([self.seed, self.count.assign_add(1)]),
                                        dtype=tf.float64)
        if self.cdf is None:
            drawn = tf.cast(u * self.n_labels, tf.int64)
        else:
            drawn = tf.searchsorted(self.cdf, u, side="right", out_type=tf.int64)
        labels, _ = tf.unique(tf.minimum(drawn, self.n_labels - 1))
        return labels, tf.gather(self.log_expected, labels)
