"""The weighted merge of model replicas (adaptive SGD, local SGD): the merge rule in one place.

Every rank holds a replica theta_i and a merge weight w_i (the weights sum to 1 over ranks,
known to every rank after the timing allgather). The merged model, which every rank continues
from, is

    merged = sum_i w_i theta_i                                   (dense layers, biases)
    merged[r] = sum_{i touched r} w_i theta_i[r] / sum_{i touched r} w_i   (row_norm)

The second line is the row-normalized rule for the row-sparse layers (input layer; output
layer and bias under the sampled loss): a row that only some ranks trained since the last merge
takes their weighted average, not an average diluted by the untouched replicas' old values.
Optimizer slots merged with the model (adaptive.opt_state: average) use the first line.

Horovod refuses per-rank prescale factors ("Mismatched prescale and/or postscale factors"), so
each rank scales its own tensors by w_i locally and one fused grouped_allreduce (op=Sum) adds
them up: one collective per merge (per piece, below), whatever the layers.

Sparse merge (merge.sparse): rows of the row-sparse layers that no rank touched since the last
merge are identical on every rank, so only the union U of touched rows travels. Each rank marks
the rows its training steps reached (SparseMLP.touched: features of its batches, candidate
labels under the sampled loss); the union is agreed by one bitwise-or MPI allreduce of the
packed masks (features / 8 + labels / 8 bytes a rank), then the rows U of every row-sparse
variable (and of its optimizer slots) are gathered, merged and scattered back. The result equals
the dense merge up to float rounding; the bytes moved follow |U| instead of the row count.
The rows travel in pieces of at most merge.chunk_mb each (one allreduce a piece, the dense
layers with the first): a merge's send and receive buffers then stay bounded whatever |U| is.

float16 (merge.dtype): each rank sends w_i (theta_i - anchor) in 16 bits, where the anchor is
the merged model of the previous merge kept in 32 bits on every rank; the summed change is added
to the anchor in 32 bits. Rounding then applies to one window's change, not to the weights.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from hvd_adaptive.config import MergeConfig
from hvd_adaptive.model import SparseMLP


class Merge:
    """merged = the rule above, over all ranks, in fused Horovod allreduces (one per piece).

    Args:
        model: this rank's replica; its `touched` masks say which rows it trained.
        slots: optimizer slot variables merged with the model, one list per model variable
            (empty lists or None: slots stay per rank).
        cfg: the merge section of the config (sparse, dtype).
        row_norm: the row-normalized rule for the row-sparse layers.
        comm: mpi4py communicator (the union of touched rows).
    """

    def __init__(self, model: SparseMLP, slots: Optional[Sequence[Sequence[tf.Variable]]],
                 cfg: MergeConfig, row_norm: bool, comm):
        self.model, self.cfg, self.row_norm, self.comm = model, cfg, row_norm, comm
        variables = model.variables_list
        masks = model.row_sparse
        # (variable, which touched-mask indexes its rows or None, row-normalized?)
        self.items = [(v, m, row_norm and m is not None) for v, m in zip(variables, masks)]
        for group, m in zip(slots or [[] for _ in variables], masks):
            self.items += [(s, m, False) for s in group]
        self.used_masks = sorted({m for _, m, _ in self.items if m is not None})
        self.wire = tf.float16 if cfg.dtype == "float16" else tf.float32
        self.anchor = ([tf.Variable(v, trainable=False) for v, _, _ in self.items]
                       if cfg.dtype == "float16" else None)
        self.last_bytes = 0
        self.dense_bytes = sum(int(np.prod(v.shape)) * self.wire.size for v, _, _ in self.items)
        # Values on the wire: the variables without a row mask travel whole; for each mask, one
        # row of every variable it indexes, plus its row-normalization share.
        self.fixed_values = sum(int(np.prod(v.shape)) for v, m, _ in self.items if m is None)
        self.row_values = {m: sum(int(np.prod(v.shape[1:])) for v, mm, _ in self.items if mm == m)
                          + any(norm for _, mm, norm in self.items if mm == m)
                          for m in self.used_masks}
        self.last_pieces = 0
        # The first piece carries the dense variables too; later pieces only rows.
        self._merge_first = self._build(cfg.sparse, with_dense=True, name="weighted_merge")
        self._merge_rows = (self._build(True, with_dense=False, name="weighted_merge_rows")
                            if cfg.sparse else None)

    def _build(self, sparse: bool, with_dense: bool, name: str):
        """The merge of the items it covers as one tf.function: rows (or whole variables),
        weighted, one grouped Horovod allreduce, divided by the row shares, written back."""
        import horovod.tensorflow as hvd

        items = [(j, v, m, norm) for j, (v, m, norm) in enumerate(self.items)
                 if with_dense or (sparse and m is not None)]
        # Per mask of model.touched: the rows that travel and whether this rank touched each.
        n = len(self.model.touched)
        signature = ((tf.TensorSpec([None], tf.int64),) * n + (tf.TensorSpec([None], tf.float32),) * n
                     + (tf.TensorSpec([], tf.float32),))

        @tf.function(input_signature=signature, autograph=False)
        def merge(*args):
            rows, mine, weight = args[:n], args[n:2 * n], args[2 * n]
            sent, shares = [], {}
            for j, v, m, norm in items:
                x = tf.gather(v, rows[m]) if (sparse and m is not None) else tf.identity(v)
                if self.anchor is not None:
                    a = self.anchor[j]
                    x = x - (tf.gather(a, rows[m]) if (sparse and m is not None) else a)
                scale = weight * mine[m] if norm else weight
                if norm:
                    scale = tf.reshape(scale, [-1] + [1] * (len(v.shape) - 1))
                sent.append(tf.cast(x * scale, self.wire))
            for m in sorted({m for _, _, m, norm in items if norm}):
                shares[m] = len(sent)
                sent.append(tf.cast(weight * mine[m], self.wire))
            summed = hvd.grouped_allreduce(sent, op=hvd.Sum, name=name)
            for k, (j, v, m, norm) in enumerate(items):
                y = tf.cast(summed[k], tf.float32)
                part = sparse and m is not None
                if norm:
                    share = tf.cast(summed[shares[m]], tf.float32)
                    share = tf.reshape(share, [-1] + [1] * (len(v.shape) - 1))
                    y = y / tf.maximum(share, 1e-30)
                if self.anchor is not None:
                    a = self.anchor[j]
                    y = (tf.gather(a, rows[m]) if part else a) + y
                if norm and not part:
                    # Dense merge: rows nobody touched keep their (common) value.
                    y = tf.where(share > 0, y, v)
                if part:
                    v.scatter_update(tf.IndexedSlices(y, rows[m]))
                    if self.anchor is not None:
                        self.anchor[j].scatter_update(tf.IndexedSlices(y, rows[m]))
                else:
                    v.assign(y)
                    if self.anchor is not None:
                        self.anchor[j].assign(y)

        return merge

    def reset_anchor(self) -> None:
        """The float16 merge's 32-bit anchor follows the model (after broadcast or restore)."""
        if self.anchor is not None:
            for a, (v, _, _) in zip(self.anchor, self.items):
                a.assign(v)

    def __call__(self, weight: float) -> None:
        """Merges with this rank's weight (weights sum to 1 over ranks). The masks are cleared at
        each window's start (Algorithm.run_round), not here."""
        from mpi4py import MPI

        touched = self.model.touched.numpy()
        rows: list = [np.zeros(0, np.int64) for _ in touched]  # masks no variable uses stay empty
        mine: list = [np.zeros(0, np.float32) for _ in touched]
        for m in self.used_masks:
            if self.cfg.sparse:
                packed = np.packbits(touched[m])
                union = np.empty_like(packed)
                self.comm.Allreduce(packed, union, op=MPI.BOR)
                rows[m] = np.flatnonzero(np.unpackbits(union, count=touched[m].size)).astype(np.int64)
                mine[m] = touched[m][rows[m]].astype(np.float32)
            else:
                mine[m] = touched[m].astype(np.float32)
        pieces = self._pieces(rows)
        split_rows = [np.array_split(r, pieces) for r in rows]
        split_mine = [np.array_split(x, pieces) for x in mine]
        for k in range(pieces):
            step = self._merge_first if k == 0 else self._merge_rows
            step(*(tf.constant(r[k]) for r in split_rows), *(tf.constant(x[k]) for x in split_mine),
                 tf.constant(weight, tf.float32))
        self.last_pieces = pieces
        self.last_bytes = self._bytes(rows)

    def _pieces(self, rows: list) -> int:
        """How many allreduces the touched rows travel in: each piece's rows stay under
        merge.chunk_mb on the wire (the same on every rank: the rows are the union)."""
        if not self.cfg.sparse or self.cfg.chunk_mb <= 0:
            return 1
        total = self._row_values(rows) * self.wire.size
        return max(1, int(np.ceil(total / (self.cfg.chunk_mb * 2**20))))

    def _row_values(self, rows: list) -> int:
        """Values of the masked variables' rows one rank sends (all rows when not sparse)."""
        return sum((len(rows[m]) if self.cfg.sparse else self.model.touched.sizes[m])
                   * self.row_values[m] for m in self.used_masks)

    def _bytes(self, rows: list) -> int:
        """Bytes one rank puts into the merge's allreduces."""
        return (self.fixed_values + self._row_values(rows)) * self.wire.size
