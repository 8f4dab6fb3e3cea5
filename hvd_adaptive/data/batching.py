"""The in-memory :class:`Dataset` (CSR) and its conversion into flat batch arrays.

A batch is represented in "segment" form: the non-zeros of all rows are
concatenated and a parallel segment array says which batch row each entry
belongs to. This is what sparse embedding lookups (``segment_sum`` style ops)
consume directly, and it is built here without any per-row Python loop.

Two ways to select rows, each where it was faster (docs/benchmark.md, "Figures behind the
code's defaults"): `Dataset.subset` (evaluation chunks, test subsets: thousands of rows) uses
scipy.sparse's compiled row indexing over CSR matrices sharing the dataset's arrays, which
beat the numpy positions more the more rows a selection holds; `make_batch` (training
batches: tens to hundreds of rows) keeps the numpy positions (`gather_rows`), as scipy's
fixed cost per selection made it slower on selections that small.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp

# Mixed into the seed so epoch permutations do not coincide with other
# streams a caller may derive from the same (seed, epoch) pair.
_PERM_STREAM = 0x5EED_BA7C


class Batch(NamedTuple):
    """Flat arrays describing a batch of sparse rows and their label sets."""

    feat_ids: np.ndarray  # int64 [nnz]
    feat_vals: np.ndarray  # float32 [nnz]
    feat_seg: np.ndarray  # int32 [nnz], batch row of each non-zero, non-decreasing
    label_ids: np.ndarray  # int32 [m]
    label_seg: np.ndarray  # int32 [m]
    label_w: np.ndarray  # float32 [m], 1/k for a row with k labels
    size: int


def gather_rows(indptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Locate the entries of selected CSR rows.

    Args:
        indptr: CSR row pointer of length ``n_rows + 1``.
        rows: Row ids to select (any order, duplicates allowed), int array.

    Returns:
        ``(new_indptr, positions)``: the int64 row pointer of the selection and
        the int64 positions into the original ``indices``/``values`` arrays, in
        selection order.
    """
    starts = np.asarray(indptr[rows], dtype=np.int64)
    counts = np.asarray(indptr[rows + 1], dtype=np.int64) - starts
    new_indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(counts, out=new_indptr[1:])
    total = int(new_indptr[-1])
    # Entry j of selected row r sits at starts[r] + j; writing this as
    # arange(total) + per-row shift (repeated per entry) keeps it loop-free.
    shift = np.repeat(starts - new_indptr[:-1], counts)
    positions = np.arange(total, dtype=np.int64) + shift
    return new_indptr, positions


@dataclass(frozen=True, eq=False)  # eq on arrays is ambiguous, so identity equality
class Dataset:
    """A sparse multi-label dataset in CSR form (features and labels)."""

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    label_indptr: np.ndarray
    label_indices: np.ndarray
    n_features: int
    n_labels: int
    source: str = ""

    def __post_init__(self):
        # O(1) checks only: arrays may be memory-mapped and must not be scanned.
        n = len(self.indptr) - 1
        if n < 0 or len(self.label_indptr) != n + 1:
            raise ValueError(f"{self.source}: indptr/label_indptr lengths disagree")
        if int(self.indptr[-1]) != len(self.indices) or len(self.indices) != len(self.values):
            raise ValueError(f"{self.source}: indptr[-1], indices and values lengths disagree")
        if int(self.label_indptr[-1]) != len(self.label_indices):
            raise ValueError(f"{self.source}: label_indptr[-1] != len(label_indices)")

    @property
    def n_rows(self) -> int:
        """Number of rows (data points)."""
        return len(self.indptr) - 1

    @property
    def nnz_a_row(self) -> float:
        """Non-zeros a row in mean (0 without rows)."""
        return len(self.indices) / max(self.n_rows, 1)

    def subset(self, rows: np.ndarray) -> "Dataset":
        """Return a new in-memory dataset made of the given rows, in that order.

        Args:
            rows: Row ids (duplicates allowed).
        """
        rows = _check_rows(rows, self.n_rows)
        f, y = self.features[rows], self.labels[rows]
        return Dataset(f.indptr.astype(np.int64), f.indices.astype(np.int32, copy=False),
                       f.data, y.indptr.astype(np.int64), y.indices.astype(np.int32, copy=False),
                       self.n_features, self.n_labels, self.source)

    @cached_property
    def features(self) -> sp.csr_matrix:
        """The features as a scipy CSR matrix [rows, n_features] over the same indices and
        values (not copied; memory-mapped arrays stay on disk)."""
        return sp.csr_matrix((self.values, self.indices, self.indptr),
                             shape=(self.n_rows, self.n_features))

    @cached_property
    def labels(self) -> sp.csr_matrix:
        """The labels as a scipy CSR matrix [rows, n_labels] of ones (int8) over the same
        label indices."""
        ones = np.ones(len(self.label_indices), np.int8)
        return sp.csr_matrix((ones, self.label_indices, self.label_indptr),
                             shape=(self.n_rows, self.n_labels))

    def label_frequencies(self) -> np.ndarray:
        """Return how many rows carry each label, int64 of length ``n_labels``."""
        return np.bincount(self.label_indices, minlength=self.n_labels).astype(np.int64)


def _check_rows(rows, n_rows: int) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    # Negative ids would silently wrap around under numpy indexing.
    if rows.size and (rows.min() < 0 or rows.max() >= n_rows):
        raise IndexError(f"row ids must lie in [0, {n_rows}), got [{rows.min()}, {rows.max()}]")
    return rows


def make_batch(ds: Dataset, rows: np.ndarray) -> Batch:
    """Build the flat batch arrays for the given rows of a dataset.

    Args:
        ds: The dataset (in-memory or memory-mapped arrays).
        rows: Row ids, any order; duplicates and rows without features or
            labels are allowed.

    Returns:
        A :class:`Batch`. ``label_w`` holds ``1/k`` for each of the ``k``
        labels of a row, i.e. the row's normalised multi-hot target, so the
        weights of every row with labels sum to 1.

    Raises:
        IndexError: If a row id is outside ``[0, ds.n_rows)``.
    """
    rows = _check_rows(rows, ds.n_rows)
    size = len(rows)
    seg_ids = np.arange(size, dtype=np.int32)

    f_ptr, f_pos = gather_rows(ds.indptr, rows)
    f_counts = np.diff(f_ptr)
    feat_ids = np.asarray(ds.indices[f_pos], dtype=np.int64)
    feat_vals = np.asarray(ds.values[f_pos], dtype=np.float32)
    feat_seg = np.repeat(seg_ids, f_counts)

    l_ptr, l_pos = gather_rows(ds.label_indptr, rows)
    l_counts = np.diff(l_ptr)
    label_ids = np.asarray(ds.label_indices[l_pos], dtype=np.int32)
    label_seg = np.repeat(seg_ids, l_counts)
    # Rows without labels contribute no entries, so the 0-division there is never used.
    with np.errstate(divide="ignore"):
        inv_k = (1.0 / l_counts).astype(np.float32)
    label_w = np.repeat(inv_k, l_counts)
    return Batch(feat_ids, feat_vals, feat_seg, label_ids, label_seg, label_w, size)


def epoch_permutation(n_rows: int, seed: int, epoch: int) -> np.ndarray:
    """Return the row order for one epoch.

    The result depends only on ``(n_rows, seed, epoch)``, so every process
    computes the same order without communicating.

    Args:
        n_rows: Number of rows to permute.
        seed: Non-negative run seed.
        epoch: Non-negative epoch number.

    Returns:
        An int64 permutation of ``range(n_rows)``.
    """
    if n_rows < 0 or seed < 0 or epoch < 0:
        raise ValueError(f"n_rows, seed and epoch must be >= 0, got {n_rows}, {seed}, {epoch}")
    seq = np.random.SeedSequence([int(seed), int(epoch), _PERM_STREAM])
    rng = np.random.Generator(np.random.PCG64(seq))
    return rng.permutation(n_rows).astype(np.int64, copy=False)
