"""Tests for hvd_adaptive.data.batching."""
import numpy as np
import pytest

from hvd_adaptive.data import Batch, Dataset, epoch_permutation, make_batch


def random_dataset(rng, n_rows=60, n_features=40, n_labels=15) -> Dataset:
    nnz = rng.integers(0, 6, n_rows)
    nnz[::7] = 0  # rows without features
    k = rng.integers(0, 4, n_rows)
    k[::5] = 0  # rows without labels
    ptr = np.concatenate(([0], np.cumsum(nnz))).astype(np.int64)
    lptr = np.concatenate(([0], np.cumsum(k))).astype(np.int64)
    return Dataset(ptr, rng.integers(0, n_features, ptr[-1]).astype(np.int32),
                   rng.random(ptr[-1]).astype(np.float32), lptr,
                   rng.integers(0, n_labels, lptr[-1]).astype(np.int32), n_features, n_labels)


def reference_batch(ds: Dataset, rows) -> Batch:
    """Slow, obviously correct per-row construction."""
    fi, fv, fs, li, ls, lw = [], [], [], [], [], []
    for pos, r in enumerate(rows):
        a, b = ds.indptr[r], ds.indptr[r + 1]
        fi += ds.indices[a:b].tolist()
        fv += ds.values[a:b].tolist()
        fs += [pos] * (b - a)
        a, b = ds.label_indptr[r], ds.label_indptr[r + 1]
        li += ds.label_indices[a:b].tolist()
        ls += [pos] * (b - a)
        lw += [1.0 / (b - a) if b > a else 0.0] * (b - a)
    return Batch(np.array(fi, np.int64), np.array(fv, np.float32), np.array(fs, np.int32),
                 np.array(li, np.int32), np.array(ls, np.int32), np.array(lw, np.float32),
                 len(rows))


DTYPES = (np.int64, np.float32, np.int32, np.int32, np.int32, np.float32)


@pytest.mark.parametrize("seed", range(5))
def test_make_batch_matches_reference(seed):
    rng = np.random.default_rng(seed)
    ds = random_dataset(rng)
    rows = rng.integers(0, ds.n_rows, 25)
    rows[3] = rows[4]  # a duplicated row id
    rows[5] = 0  # row 0 has neither features nor labels (0 % 7 == 0 % 5 == 0)
    got, want = make_batch(ds, rows), reference_batch(ds, rows)
    assert got.size == want.size == 25
    for g, w, dt in zip(got[:6], want[:6], DTYPES):
        assert g.dtype == dt
        np.testing.assert_array_equal(g, w)
    # Each row with labels has a normalised target.
    sums = np.bincount(got.label_seg, weights=got.label_w, minlength=got.size)
    has = np.diff(ds.label_indptr)[rows] > 0
    np.testing.assert_allclose(sums[has], 1.0, rtol=1e-6)
    assert np.all(sums[~has] == 0)


def test_make_batch_empty_and_bad_rows():
    ds = random_dataset(np.random.default_rng(0))
    empty = make_batch(ds, np.array([], np.int64))
    assert empty.size == 0 and all(len(a) == 0 for a in empty[:6])
    assert all(a.dtype == dt for a, dt in zip(empty[:6], DTYPES))
    for bad in ([ds.n_rows], [-1]):
        with pytest.raises(IndexError):
            make_batch(ds, np.array(bad))


def test_epoch_permutation():
    p = epoch_permutation(1000, seed=7, epoch=3)
    assert p.dtype == np.int64
    assert np.array_equal(np.sort(p), np.arange(1000))
    assert np.array_equal(p, epoch_permutation(1000, 7, 3))
    assert not np.array_equal(p, epoch_permutation(1000, 7, 4))
    assert not np.array_equal(p, epoch_permutation(1000, 8, 3))
    assert len(epoch_permutation(0, 0, 0)) == 0
    with pytest.raises(ValueError):
        epoch_permutation(10, -1, 0)


def test_subset_selects_what_make_batch_selects(tmp_path):
    # subset (scipy's row indexing) and make_batch (numpy positions) must agree row for row,
    # also on memory-mapped arrays (the parsed-file cache), whose data scipy must not copy.
    rng = np.random.default_rng(3)
    ds = random_dataset(rng, n_rows=300)
    arrays = {}
    for k in ("indptr", "indices", "values", "label_indptr", "label_indices"):
        np.save(tmp_path / f"{k}.npy", getattr(ds, k))
        arrays[k] = np.load(tmp_path / f"{k}.npy", mmap_mode="r")
    mapped = Dataset(**arrays, n_features=ds.n_features, n_labels=ds.n_labels)
    assert np.shares_memory(mapped.features.indices, arrays["indices"])
    rows = np.r_[rng.integers(0, 300, 2000), 0, 0, 7]  # duplicates, rows without features/labels
    sub, b = mapped.subset(rows), make_batch(mapped, rows)
    assert sub.n_rows == len(rows) and sub.indptr.dtype == np.int64 and sub.indices.dtype == np.int32
    np.testing.assert_array_equal(sub.indices, b.feat_ids)
    np.testing.assert_array_equal(sub.values, b.feat_vals)
    np.testing.assert_array_equal(np.repeat(np.arange(len(rows)), np.diff(sub.indptr)), b.feat_seg)
    np.testing.assert_array_equal(sub.label_indices, b.label_ids)
    np.testing.assert_array_equal(np.repeat(np.arange(len(rows)), np.diff(sub.label_indptr)), b.label_seg)
