"""Tests for hvd_adaptive.data.synth: shapes, statistics, determinism, learnability."""
import time

import numpy as np
import pytest
import scipy.sparse as sp

from hvd_adaptive.data import PRESETS, SynthSpec, load_dataset, preset, synth_to_files, synthesize

SPEC = SynthSpec(n_train=3000, n_test=2000, n_features=2000, n_labels=200, seed=1)


@pytest.fixture(scope="module")
def data():
    return synthesize(SPEC)


def row_ids(indptr):
    return np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))


def test_shapes_and_dtypes(data):
    train, test = data
    assert (train.n_rows, test.n_rows) == (3000, 2000)
    for ds in data:
        assert (ds.n_features, ds.n_labels) == (2000, 200)
        assert ds.indptr.dtype == ds.label_indptr.dtype == np.int64
        assert ds.indices.dtype == ds.label_indices.dtype == np.int32
        assert ds.values.dtype == np.float32
        assert 0 <= ds.indices.min() and ds.indices.max() < 2000
        assert 0 <= ds.label_indices.min() and ds.label_indices.max() < 200


def test_rows_are_valid(data):
    for ds in data:
        assert np.all(np.diff(ds.label_indptr) >= 1)  # every row has a label
        assert np.all(ds.values > 0)
        rows = row_ids(ds.indptr)
        norms = np.bincount(rows, weights=ds.values.astype(np.float64) ** 2)
        np.testing.assert_allclose(norms, 1.0, rtol=1e-5)
        for ptr, idx, n in ((ds.indptr, ds.indices, ds.n_features),
                            (ds.label_indptr, ds.label_indices, ds.n_labels)):
            key = row_ids(ptr) * n + idx
            assert len(np.unique(key)) == len(key)  # no duplicates inside a row


def test_distribution_statistics(data):
    train, _ = data
    nnz = np.diff(train.indptr)
    assert abs(nnz.mean() - SPEC.nnz_mean) < 0.1 * SPEC.nnz_mean
    assert nnz.min() >= 1 and nnz.max() > 4 * np.median(nnz)  # long right tail
    k = np.diff(train.label_indptr)
    assert abs(k.mean() - SPEC.labels_mean) < 0.15 * SPEC.labels_mean
    freq = np.sort(train.label_frequencies())[::-1]
    share = np.cumsum(freq) / freq.sum()
    # Head labels hold several times their uniform share (1% -> 0.01, 5% -> 0.05).
    assert share[len(freq) // 100 - 1] > 0.06 and share[len(freq) // 20 - 1] > 0.2
    big = preset("amazon670k", scale=0.02)
    t0 = time.perf_counter()
    btrain, btest = synthesize(big)
    assert time.perf_counter() - t0 < 10
    bfreq = np.sort(btrain.label_frequencies())[::-1]
    assert bfreq[: len(bfreq) // 100].sum() / bfreq.sum() > 0.2  # power law at scale
    assert abs(np.diff(btrain.indptr).mean() - 76) < 7.6


def test_deterministic_in_seed(data):
    again = synthesize(SPEC)
    other = synthesize(SynthSpec(**{**SPEC.__dict__, "seed": 2}))
    for k in ("indptr", "indices", "values", "label_indptr", "label_indices"):
        for a, b in zip(data, again):
            assert np.array_equal(getattr(a, k), getattr(b, k))
    assert not np.array_equal(data[0].indices[:500], other[0].indices[:500])


def test_learnable_without_tensorflow(data):
    """Label centroids from the train set beat the most-frequent-label baseline 3x on test."""
    train, test = data

    def feats(ds):
        return sp.csr_matrix((ds.values, ds.indices, ds.indptr), (ds.n_rows, ds.n_features))

    def labels(ds):
        ones = np.ones(len(ds.label_indices))
        return sp.csr_matrix((ones, ds.label_indices, ds.label_indptr), (ds.n_rows, ds.n_labels))

    centroids = (labels(train).T @ feats(train)).toarray()
    centroids /= np.linalg.norm(centroids, axis=1, keepdims=True) + 1e-12
    pred = np.asarray((feats(test) @ centroids.T).argmax(axis=1)).ravel()
    y = labels(test)
    p_at_1 = np.asarray(y[np.arange(test.n_rows), pred]).mean()
    most = np.argmax(train.label_frequencies())
    baseline = y[:, most].toarray().mean()
    assert p_at_1 >= 3 * baseline, (p_at_1, baseline)


def test_presets():
    assert set(PRESETS) == {"amazon670k", "delicious200k", "eurlex4k"}
    full = preset("amazon670k")
    assert (full.n_train, full.n_test, full.n_features, full.n_labels) == (
        490_449, 153_025, 135_909, 670_091)
    assert preset("delicious200k").labels_mean == 75.5
    small = preset("eurlex4k", scale=0.1, seed=5)
    assert (small.n_train, small.n_test, small.n_features, small.n_labels, small.seed) == (
        1554, 381, 5000, 399, 5)
    tiny = preset("delicious200k", scale=1e-6)
    assert tiny.n_train >= 100 and tiny.n_labels >= 2 * tiny.labels_mean
    with pytest.raises(ValueError, match="amazon670k.*delicious200k.*eurlex4k"):
        preset("nope")
    with pytest.raises(ValueError):
        preset("eurlex4k", scale=0)


def test_synth_to_files(tmp_path):
    spec = SynthSpec(n_train=150, n_test=40, n_features=300, n_labels=30, nnz_mean=12, seed=4)
    tr_path, te_path = synth_to_files(spec, tmp_path / "out")
    assert (tr_path.name, te_path.name) == ("train.txt", "test.txt")
    assert tr_path.read_text().splitlines()[0] == "150 300 30"
    train, test = synthesize(spec)
    for path, ds in ((tr_path, train), (te_path, test)):
        back = load_dataset(path, use_cache=False)
        for k in ("indptr", "indices", "values", "label_indptr", "label_indices"):
            assert np.array_equal(getattr(back, k), getattr(ds, k))


def test_cached_synthetic_data_equals_generated_and_survives_damage(tmp_path):
    from hvd_adaptive.data import synthesize_cached
    spec = preset("eurlex4k", scale=0.02, seed=5)
    want = synthesize(spec)
    first = synthesize_cached(spec, tmp_path)
    again = synthesize_cached(spec, tmp_path)  # memory-mapped from the cache
    (folder,) = [p for p in tmp_path.iterdir() if p.name.startswith("synth-")]
    assert isinstance(again[0].indices, np.memmap)
    for got in (first, again):
        for a, b in zip(got, want):
            for k in ("indptr", "indices", "values", "label_indptr", "label_indices"):
                np.testing.assert_array_equal(getattr(a, k), getattr(b, k))
    (folder / "train.indices.npy").write_bytes(b"garbage")  # damaged: rebuilt, not trusted
    rebuilt = synthesize_cached(spec, tmp_path)
    np.testing.assert_array_equal(rebuilt[0].indices, want[0].indices)
    other = synthesize_cached(preset("eurlex4k", scale=0.02, seed=6), tmp_path)
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("synth-")]) == 2
    assert not np.array_equal(other[0].indices[:50], want[0].indices[:50])
