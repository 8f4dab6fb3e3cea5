"""Evaluation on the test set: every label ranked, in label blocks of bounded memory.

Test rows are spread over the ranks (rank r takes rows r, r + n, ...); each rank ranks all
labels for its rows chunk by chunk, and within a chunk block by block: a block's logits
([chunk rows x block labels] floats) never exceed `train.eval_memory_mb`, and a running top-k
is kept across blocks. The metric sums are then reduced over ranks by MPI, so the result
equals a one-process evaluation of the same model.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from hvd_adaptive.tfload import tf

from hvd_adaptive.data import Dataset, make_batch
from hvd_adaptive.parallel.distributed import Cluster, allreduce_sum_np
from hvd_adaptive.model.metrics import finalize, metric_sums, sum_names
from hvd_adaptive.model.network import SparseMLP

K = 5  # P@k and nDCG@k for k = 1, 3, 5


def plan_blocks(n_labels: int, rows: int, memory_mb: float, k: int = K) -> int:
    """Labels per block so that rows x block x 4 bytes stays within memory_mb (at least k)."""
    if memory_mb <= 0:
        raise ValueError(f"train.eval_memory_mb: must be > 0, got {memory_mb}")
    fit = int(memory_mb * 2**20 // (4 * max(rows, 1)))
    return max(min(k, n_labels), min(n_labels, fit))


class Evaluator:
    """Ranks every label for test rows with a running top-k over label blocks."""

    def __init__(self, model: SparseMLP, memory_mb: float, chunk: int = 2048, k: int = K,
                 inv_prop: Optional[np.ndarray] = None):
        """inv_prop: the labels' inverse propensities; given, PSP@k and PSnDCG@k are added."""
        self.model, self.k, self.inv_prop = model, min(k, model.n_labels), inv_prop
        # Rows per chunk: at most `chunk`, fewer when even one k-label block would not fit.
        self.chunk = max(1, min(chunk, int(memory_mb * 2**20 // (4 * max(self.k, 1)))))
        if model.linear:  # its "hidden activations" are the chunk's dense input rows
            self.chunk = max(1, min(self.chunk, int(memory_mb * 2**20 // (4 * model.n_features))))
        self.block = plan_blocks(model.n_labels, self.chunk, memory_mb, self.k)
        spec = (tf.TensorSpec([None], tf.int64), tf.TensorSpec([None], tf.float32),
                tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int32))
        self._hidden = tf.function(lambda *a: model.hidden(*a), input_signature=spec,
                                   autograph=False)
        self._topk = tf.function(lambda h: self._topk_blocks(h)[1], input_signature=(
            tf.TensorSpec([None, None], tf.float32),), autograph=False)
        self._scored = tf.function(self.scored_top_k, input_signature=(
            tf.TensorSpec([None, None], tf.float32),), autograph=False)

    def warm_up(self, test: Dataset) -> None:
        """Traces and runs the ranking functions once, on one test row: the trainer calls it
        before a rank's CPU quota starts (tracing at a sixteenth of a core took seconds)."""
        self.top_labels(test, np.arange(min(1, test.n_rows)))

    def _topk_blocks(self, h, scores: bool = False):
        """(values, labels, log-sum-exp of all logits: only with `scores`, else -inf)."""
        n, k, block = self.model.n_labels, self.k, self.block
        rows = tf.shape(h)[0]

        def one_block(start, best_v, best_i, lse):
            z = self.model.block_logits(h, start, tf.minimum(start + block, n))
            if scores:  # softmax's normalizer, accumulated over the blocks like the top-k
                lse = tf.reduce_logsumexp(tf.stack([lse, tf.reduce_logsumexp(z, 1)], 1), 1)
            # A last block narrower than k is padded with -inf (never chosen over a real label).
            z = tf.pad(z, [[0, 0], [0, tf.maximum(k - tf.shape(z)[1], 0)]], constant_values=-np.inf)
            v, i = tf.math.top_k(z, k=k)
            best_v, pick = tf.math.top_k(tf.concat([best_v, v], 1), k=k)
            best_i = tf.gather(tf.concat([best_i, i + start], 1), pick, batch_dims=1)
            return start + block, best_v, best_i, lse

        # One while loop over the label blocks, whatever their number.
        lowest = tf.constant(-np.inf, tf.float32)
        _, best_v, best_i, lse = tf.while_loop(
            lambda start, *_: start < n, one_block,
            (tf.constant(0, tf.int32), tf.fill([rows, k], lowest), tf.zeros([rows, k], tf.int32),
             tf.fill([rows], lowest)),
            shape_invariants=(tf.TensorShape([]), tf.TensorShape([None, k]),
                              tf.TensorShape([None, k]), tf.TensorShape([None])))
        return best_v, best_i, lse

    def scored_top_k(self, h):
        """The k best labels of hidden activations `h` and their scores, best first: the
        softmax's probabilities over all labels, or under model.loss sigmoid each label's
        sigmoid; ([rows x k] int32, [rows x k] float32). Traceable (export)."""
        v, i, lse = self._topk_blocks(h, scores=not self.model.sigmoid)
        return i, tf.sigmoid(v) if self.model.sigmoid else tf.exp(v - lse[:, None])

    def _per_chunk(self, ds: Dataset, rows: np.ndarray, fn) -> list:
        out = []
        for i in range(0, len(rows), self.chunk):
            b = make_batch(ds, rows[i:i + self.chunk])
            h = self._hidden(tf.constant(b.feat_ids), tf.constant(b.feat_vals),
                             tf.constant(b.feat_seg), tf.constant(b.size, tf.int32))
            out.append(fn(h))
        return out

    def top_labels(self, test: Dataset, rows: np.ndarray) -> np.ndarray:
        """The k best labels of each test row in `rows`, best first, [len(rows) x k]."""
        out = self._per_chunk(test, rows, lambda h: self._topk(h).numpy())
        return np.concatenate(out) if out else np.zeros((0, self.k), np.int32)

    def top_scores(self, ds: Dataset, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The k best labels of each row in `rows` and their scores (`scored_top_k`), best
        first: ([len(rows) x k] int32, [len(rows) x k] float32)."""
        out = self._per_chunk(ds, rows, lambda h: [t.numpy() for t in self._scored(h)])
        if not out:
            return np.zeros((0, self.k), np.int32), np.zeros((0, self.k), np.float32)
        return np.concatenate([o[0] for o in out]), np.concatenate([o[1] for o in out])

    def __call__(self, test: Dataset, cluster: Cluster, rows: Optional[int]) -> dict:
        """P@k and nDCG@k (and PSP@k, PSnDCG@k) over the first `rows` test rows (all: None),
        spread over ranks."""
        n = min(rows or test.n_rows, test.n_rows)
        mine = np.arange(cluster.rank, n, cluster.size)
        names = sum_names(self.inv_prop is not None)
        acc = np.zeros(len(names))
        for i in range(0, len(mine), self.chunk):
            r = mine[i:i + self.chunk]
            top = self.top_labels(test, r)
            sub = test.subset(r)
            s = metric_sums(top, sub.label_indptr, sub.label_indices, self.inv_prop)
            acc += np.array([s[k] for k in names])
        total = allreduce_sum_np(cluster.comm, acc)
        return finalize(dict(zip(names, total.tolist())))
