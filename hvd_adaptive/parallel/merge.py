"""The weighted merge of model replicas (adaptive SGD, local SGD): the merge rule in one place.

Every rank holds a replica theta_i and a merge weight w_i (the weights sum to 1 over ranks,
known to every rank after the timing allgather). The merged model, which every rank continues
from, is

    merged = sum_i w_i theta_i                                   (hidden layers, biases)
    merged[r] = sum_{i touched r} w_i theta_i[r] / sum_{i touched r} w_i   (normalized rows)

The second line is the row-normalized rule, for rows some rank touched since the last merge
(model.TouchedRows; rows nobody touched take the first line): a row that only some ranks
trained takes their weighted average, not an average diluted by the other replicas' values.
adaptive.row_norm applies it to the input layer (rows: the batches' features) and, under the
sampled loss, to the output layer and its bias (rows: the candidates); adaptive.label_norm
applies it to the full softmax's output layer and bias (rows: the labels a rank trained as
positives). Without the latter, a label that one rank of two saw in a window kept half of
that rank's step (Adagrad's first step on a label is about lr whatever the gradient's size),
which cost adaptive SGD more rows than sync at 67,009 labels (docs/benchmark.md, "Where the
defaults come from").
Optimizer slots merged with the model (adaptive.opt_state: average) use the first line.

Horovod refuses per-rank prescale factors ("Mismatched prescale and/or postscale factors"), so
each rank scales its own tensors by w_i locally and one fused grouped_allreduce (op=Sum) adds
them up: one collective per merge (per piece, below), whatever the layers.

Every merge agrees on the union U of each mask's touched rows by one bitwise-or MPI allreduce
of the packed masks (rows / 8 bytes a rank). Sparse merge (merge.sparse): rows of the sparse
layers (model.RowMask.sparse: the input layer, the sampled output layer) that no rank touched
are identical on every rank, so only the rows U of those variables (and of their optimizer
slots) are gathered, merged and scattered back. The result equals the dense merge up to float
rounding; the bytes moved follow |U| instead of the row count.
The rows travel in pieces of at most merge.chunk_mb each (one allreduce a piece, the dense
layers with the first): a merge's send and receive buffers then stay bounded whatever |U| is.

float16 (merge.dtype): each rank sends w_i (theta_i - anchor) in 16 bits, where the anchor is
the merged model of the previous merge kept in 32 bits on every rank; the summed change is added
to the anchor in 32 bits. Rounding then applies to one window's change, not to the weights.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
from hvd_adaptive.tfload import tf

from hvd_adaptive.config import MergeConfig
from hvd_adaptive.model.network import RowMask, SparseMLP


def _normalized_masks(items) -> list:
    """The masks whose rows some of a piece's items normalize, in the order their row shares
    follow the items among the values a rank sends."""
    return sorted({rm.mask for _, _, rm, norm, _ in items if norm})


def _along(x, rm: RowMask, ndim: int):
    """A per-row vector shaped to broadcast along the mask's axis of a variable."""
    shape = [1] * ndim
    shape[rm.axis] = -1
    return tf.reshape(x, shape)


class Merge:
    """merged = the rule above, over all ranks, in fused Horovod allreduces (one per piece).

    Args:
        model: this rank's replica; its `touched` masks say which rows it trained.
        slots: optimizer slot variables merged with the model, one list per model variable
            (empty lists or None: slots stay per rank).
        cfg: the merge section of the config (sparse, dtype).
        row_norm: the row-normalized rule for the sparse layers (adaptive.row_norm).
        comm: mpi4py communicator (the union of touched rows).
        label_norm: the row-normalized rule for the full softmax's output layer and bias, by
            the labels each rank trained as positives (adaptive.label_norm).
    """

    def __init__(self, model: SparseMLP, slots: Optional[Sequence[Sequence[tf.Variable]]],
                 cfg: MergeConfig, row_norm: bool, comm, label_norm: bool = False,
                 central: Optional[Sequence[tf.Variable]] = None):
        self.model, self.cfg, self.comm = model, cfg, comm
        # merge.overlap: the merged model's copy every rank evaluates (the model's variables,
        # in order); the merge in flight, if any (`start`, `finish`).
        self.central = list(central) if central is not None else None
        self._pending: Optional[_Pending] = None
        variables = model.variables_list
        masks = model.row_masks
        # (variable, its RowMask or None, row-normalized?)
        self.items = [(v, rm, rm is not None and (row_norm if rm.sparse else label_norm))
                      for v, rm in zip(variables, masks)]
        for group, rm in zip(slots or [[] for _ in variables], masks):
            self.items += [(s, rm, False) for s in group]
        # Masks whose variables travel as rows of U (sparse merge), and masks whose variables
        # travel whole but have normalized rows: the first get U's rows, the second every row.
        self.partial = sorted({rm.mask for _, rm, _ in self.items if self._part(rm)})
        self.whole = sorted({rm.mask for _, rm, norm in self.items if norm and not self._part(rm)})
        if set(self.partial) & set(self.whole):
            raise ValueError("a mask indexes both rows that travel sparse and whole variables")
        self.wire = tf.float16 if cfg.dtype == "float16" else tf.float32
        self.anchor = ([tf.Variable(v, trainable=False) for v, _, _ in self.items]
                       if cfg.dtype == "float16" else None)
        self.last_bytes = 0
        self.dense_bytes = sum(int(np.prod(v.shape)) * self.wire.size for v, _, _ in self.items)
        # Values on the wire: the variables that travel whole (with each whole mask's row
        # shares); per partial mask, one row of every variable it indexes, plus its share.
        self.fixed_values = (sum(int(np.prod(v.shape)) for v, rm, _ in self.items if not self._part(rm))
                             + sum(model.touched.sizes[m] for m in self.whole))
        self.row_values = {m: sum(int(np.prod(v.shape[1:])) for v, rm, _ in self.items
                                  if self._part(rm) and rm.mask == m)
                          + any(norm for _, rm, norm in self.items if self._part(rm) and rm.mask == m)
                          for m in self.partial}
        self.last_pieces = 0
        # The first piece carries the whole variables too; later pieces only rows.
        self._merge_first = self._build(with_whole=True, name="weighted_merge")
        self._merge_rows = (self._build(with_whole=False, name="weighted_merge_rows")
                            if self.partial else None)
        if cfg.overlap:
            self._overlap_first = self._build_overlap(with_whole=True)
            self._overlap_rows = self._build_overlap(with_whole=False) if self.partial else None

    def _part(self, rm: Optional[RowMask]) -> bool:
        """Whether a variable travels as the rows of U (sparse merge of a sparse layer)."""
        return self.cfg.sparse and rm is not None and rm.sparse

    def _covered(self, with_whole: bool) -> list:
        """(index, variable, mask, row-normalized?, travels as rows?) of the items a piece
        carries: the first piece every item, later pieces the sparse layers' rows only."""
        return [(j, v, rm, norm, self._part(rm)) for j, (v, rm, norm) in enumerate(self.items)
                if with_whole or self._part(rm)]

    def _signature(self) -> tuple:
        """A piece's inputs: per mask its rows and this rank's factor per row, then the weight."""
        n = len(self.model.touched)
        return ((tf.TensorSpec([None], tf.int64),) * n + (tf.TensorSpec([None], tf.float32),) * n
                + (tf.TensorSpec([], tf.float32),))

    def _send(self, items, rows, mine, weight):
        """This rank's part of a piece, weighted for the sum: (what it sends, the position of
        each normalized mask's row shares among them, the anchor's rows (float16), the values
        it took). Per mask of model.touched, `mine` is this rank's factor per row: 1 where it
        touched the row, 0 where another rank did (whole masks: also 1 on rows nobody touched,
        which then take the plain weighted average)."""
        sent, shares, base, taken = [], {}, {}, {}
        for j, v, rm, norm, part in items:
            x = taken[j] = tf.gather(v, rows[rm.mask]) if part else tf.identity(v)
            if self.anchor is not None:
                # The anchor's rows, read once: the change is sent against them and the summed
                # change lands on them (a second gather cost a pass over the rows).
                a = self.anchor[j]
                base[j] = tf.gather(a, rows[rm.mask]) if part else tf.identity(a)
                x = x - base[j]
            scale = _along(weight * mine[rm.mask], rm, len(v.shape)) if norm else weight
            sent.append(tf.cast(x * scale, self.wire))
        for m in _normalized_masks(items):
            shares[m] = len(sent)
            sent.append(tf.cast(weight * mine[m], self.wire))
        return sent, shares, base, taken

    def _land(self, items, rows, summed, shares, base, taken=None) -> None:
        """Writes a piece's sum back: divided by the row shares where normalized, onto the
        anchor (float16). With `taken` (an overlapped merge landing after more steps), each
        variable becomes the merged value plus its change since it was sent, so this rank's
        steps since then stay on top of the merged model; the central copy takes the merged
        value."""
        for k, (j, v, rm, norm, part) in enumerate(items):
            y = tf.cast(summed[k], tf.float32)
            if norm:
                y = y / tf.maximum(_along(tf.cast(summed[shares[rm.mask]], tf.float32), rm,
                                          len(v.shape)), 1e-30)
            if self.anchor is not None:
                y = base[j] + y
            mine = y
            if taken is not None:
                # merged + (now - sent): rows without a step since are the merged value itself,
                # bit for bit the same on every rank.
                now = tf.gather(v, rows[rm.mask]) if part else tf.identity(v)
                mine = y + (now - taken[j])
            targets = [(v, mine)]
            if self.anchor is not None:
                targets.append((self.anchor[j], y))
            if self.central is not None and j < len(self.central):
                targets.append((self.central[j], y))
            for var, value in targets:
                if part:
                    var.scatter_update(tf.IndexedSlices(value, rows[rm.mask]))
                else:
                    var.assign(value)

    def _build(self, with_whole: bool, name: str):
        """The merge of the items it covers as one tf.function: rows (or whole variables),
        weighted, one grouped Horovod allreduce, divided by the row shares, written back."""
        import horovod.tensorflow as hvd

        items, n = self._covered(with_whole), len(self.model.touched)

        @tf.function(input_signature=self._signature(), autograph=False)
        def merge(*args):
            rows, mine, weight = args[:n], args[n:2 * n], args[2 * n]
            sent, shares, base, _ = self._send(items, rows, mine, weight)
            summed = hvd.grouped_allreduce(sent, op=hvd.Sum, name=name)
            self._land(items, rows, summed, shares, base)

        return merge

    def _build_overlap(self, with_whole: bool):
        """The overlapped merge's two halves as tf.functions: `take` (this rank's values and
        what it sends) and `land` (the sum written back under the steps taken since)."""
        items, n = self._covered(with_whole), len(self.model.touched)

        @tf.function(input_signature=self._signature(), autograph=False)
        def take(*args):
            rows, mine, weight = args[:n], args[n:2 * n], args[2 * n]
            sent, _, _, taken = self._send(items, rows, mine, weight)
            return sent, [taken[j] for j, *_ in items]

        masks = _normalized_masks(items)
        shares = {m: len(items) + i for i, m in enumerate(masks)}  # `_send`'s order

        def spec(v, part: bool, dtype):
            return tf.TensorSpec([None, *v.shape[1:]] if part else v.shape, dtype)

        # A full signature, so the row counts of a window never trace it again on the clock.
        @tf.function(input_signature=(
            tuple(tf.TensorSpec([None], tf.int64) for _ in range(n)),
            [spec(v, part, self.wire) for _, v, _, _, part in items]
            + [tf.TensorSpec([None], self.wire)] * len(masks),
            [spec(v, part, tf.float32) for _, v, _, _, part in items]), autograph=False)
        def land(rows, summed, taken):
            self._land(items, rows, summed, shares, {}, dict(zip([j for j, *_ in items], taken)))

        return take, land

    def warm_up(self, weight: float) -> None:
        """A merge of every row, for replicas that are equal (right after the broadcast): it
        leaves them as they are (a weighted average of equal values, up to float rounding) but
        pays the first use of the merge's largest buffers, TensorFlow's, Horovod's and the
        memory pages behind them, before the clock starts. A warm-up of the union alone (empty
        then) left that to the first window's merge, which took far longer than the later ones
        at 8 ranks and 67,009 labels (docs/benchmark.md, "Where the defaults come from"). Under
        merge.overlap the overlapped merge runs once more the same way, tracing its functions
        before the clock too. Every mask is marked for it and cleared after it."""
        merges = [lambda: self(weight)]
        if self.cfg.overlap:
            merges.append(lambda: (self.start(weight), self.finish()))
        for merge in merges:
            for m in self.model.touched.masks:
                m.assign(tf.ones_like(m))
            merge()
        self.model.touched.clear()

    def reset_anchor(self) -> None:
        """The float16 merge's 32-bit anchor follows the model (after broadcast or restore)."""
        if self.anchor is not None:
            for a, (v, _, _) in zip(self.anchor, self.items):
                a.assign(v)

    def packed(self, touched: Optional[list] = None) -> np.ndarray:
        """This rank's touched-row masks that the merge reads (`touched`: as read already),
        packed 8 rows a byte: what the union is made of. A caller that gathers them from every
        rank anyway (adaptive SGD's timing allgather) passes them to the merge, which then needs
        no collective of its own for the union."""
        touched = self.model.touched.numpy() if touched is None else touched
        used = (*self.partial, *self.whole)
        return (np.concatenate([np.packbits(touched[m]) for m in used]) if used
                else np.zeros(0, np.uint8))

    def __call__(self, weight: float, gathered: Optional[Sequence[np.ndarray]] = None) -> None:
        """Merges with this rank's weight (weights sum to 1 over ranks). The masks are cleared at
        each window's start (Algorithm.run_round), not here.

        gathered: every rank's `packed()` of this window, in rank order, if the caller has them;
        else one bitwise-or allreduce makes the union. With Horovod's background thread
        coordinating beside it, each MPI collective cost a long wait at 8 quarter-core ranks,
        whatever its size, so the merge spares one when it can (docs/benchmark.md, "Where the
        defaults come from")."""
        for k, args in enumerate(self._piece_inputs(weight, gathered)):
            (self._merge_first if k == 0 else self._merge_rows)(*args)

    def start(self, weight: float, gathered: Optional[Sequence[np.ndarray]] = None) -> None:
        """merge.overlap: takes this window's values and what this rank sends, now (arguments as
        for a merge, `__call__`); `send` starts summing them over ranks in a background thread,
        `finish` lands the result."""
        if self._pending is not None:
            raise RuntimeError("merge.start: the previous merge has not landed (finish)")
        pending = _Pending()
        n = len(self.model.touched)
        for k, args in enumerate(self._piece_inputs(weight, gathered)):
            take, land = self._overlap_first if k == 0 else self._overlap_rows
            sent, taken = take(*args)
            pending.pieces.append((args[:n], sent, taken, land))
        self._pending = pending

    def send(self) -> None:
        """Starts the sums of the merge `start` took in a background thread, if not yet: the
        training that follows runs beside them. Adaptive SGD sends as the next window begins,
        so the sums travel beside its steps only, not beside an evaluation off the clock."""
        if self._pending is not None and self._pending.thread is None:
            import threading

            self._pending.thread = threading.Thread(target=self._pending.reduce,
                                                    name="hvd-adaptive-merge", daemon=True)
            self._pending.thread.start()

    def finish(self) -> float:
        """Lands the merge in flight (merge.overlap), sending it first if `send` has not and
        waiting for its sums: each variable becomes the merged value plus its change since
        `start`, keeping this rank's steps since then on top of the merged model. Rows without
        a step since become the merged value bit for bit, so with no step since `start` the
        replicas are identical again. The central copy takes the merged model. Returns the
        seconds spent waiting for the sums (0 without a merge in flight)."""
        import time

        if self._pending is None:
            return 0.0
        t0 = time.perf_counter()
        self.send()
        pending, self._pending = self._pending, None
        pending.thread.join()
        waited = time.perf_counter() - t0
        if pending.error is not None:
            raise RuntimeError("the overlapped merge failed in its thread") from pending.error
        for (rows, _, taken, land), summed in zip(pending.pieces, pending.summed):
            land(tuple(rows), list(summed), list(taken))
        return waited

    @property
    def in_flight(self) -> bool:
        """Whether a merge has started and not landed (merge.overlap)."""
        return self._pending is not None

    @property
    def sent(self) -> bool:
        """Whether the merge in flight is summing over ranks already (`send`)."""
        return self._pending is not None and self._pending.thread is not None

    def _piece_inputs(self, weight: float, gathered: Optional[Sequence[np.ndarray]]) -> list:
        """The union of the ranks' touched rows, cut into the pieces that travel (one
        allreduce each), as each piece's tensors (`_signature`); records the bytes and pieces."""
        from mpi4py import MPI

        touched = self.model.touched.numpy()
        rows: list = [np.zeros(0, np.int64) for _ in touched]  # masks no variable uses stay empty
        mine: list = [np.zeros(0, np.float32) for _ in touched]
        used = (*self.partial, *self.whole)
        sizes = [(touched[m].size + 7) // 8 for m in used]
        if gathered is not None:
            if len(gathered) != self.comm.Get_size() or any(g.size != sum(sizes) for g in gathered):
                raise ValueError(f"merge: gathered masks of {[g.size for g in gathered]} bytes "
                                 f"from {len(gathered)} ranks, expected {sum(sizes)} from "
                                 f"{self.comm.Get_size()}")
            union = np.bitwise_or.reduce(np.stack(gathered), axis=0)
        else:
            union = np.empty(sum(sizes), np.uint8)
            if used:
                self.comm.Allreduce(self.packed(touched), union, op=MPI.BOR)
        for m, part in zip(used, np.split(union, np.cumsum(sizes)[:-1])):
            anyone = np.unpackbits(part, count=touched[m].size).astype(bool)
            if m in self.partial:
                rows[m] = np.flatnonzero(anyone).astype(np.int64)
                mine[m] = touched[m][rows[m]].astype(np.float32)
            else:
                mine[m] = np.where(anyone, touched[m], True).astype(np.float32)
        pieces = self._pieces(rows)
        split = [np.array_split(r, pieces) for r in rows]
        split_mine = [np.array_split(x, pieces) if m in self.partial else [x] * pieces
                      for m, x in enumerate(mine)]
        self.last_pieces = pieces
        self.last_bytes = self._bytes(rows)
        return [(*(tf.constant(r[k]) for r in split), *(tf.constant(x[k]) for x in split_mine),
                 tf.constant(weight, tf.float32)) for k in range(pieces)]

    def _pieces(self, rows: list) -> int:
        """How many allreduces the touched rows travel in: each piece's rows stay under
        merge.chunk_mb on the wire (the same on every rank: the rows are the union)."""
        if not self.partial or self.cfg.chunk_mb <= 0:
            return 1
        total = self._row_values(rows) * self.wire.size
        return max(1, int(np.ceil(total / (self.cfg.chunk_mb * 2**20))))

    def _row_values(self, rows: list) -> int:
        """Values of the partial masks' rows one rank sends."""
        return sum(len(rows[m]) * self.row_values[m] for m in self.partial)

    def _bytes(self, rows: list) -> int:
        """Bytes one rank puts into the merge's allreduces."""
        return (self.fixed_values + self._row_values(rows)) * self.wire.size


class _Pending:
    """An overlapped merge in flight: per piece its rows, what this rank sent, the values it
    took and the function that lands it; the thread that sums them over ranks."""

    def __init__(self):
        self.pieces: list = []
        self.summed: list = []
        self.error: Optional[BaseException] = None
        self.thread = None

    def reduce(self) -> None:
        """The sums, piece after piece, in one grouped Horovod allreduce each (every rank
        starts its pieces in the same order)."""
        import horovod.tensorflow as hvd

        try:
            for k, (_, sent, _, _) in enumerate(self.pieces):
                self.summed.append(hvd.grouped_allreduce(list(sent), op=hvd.Sum,
                                                         name=f"overlapped_merge_{k}"))
        except BaseException as e:  # raised again by Merge.finish on the training thread
            self.error = e
