"""Tests for hvd_adaptive.data.formats: text reader/writer and the binary cache."""
import json
import os
import warnings

import numpy as np
import pytest

from hvd_adaptive.data import DataError, Dataset, load_dataset, parse_file, write_xc
from hvd_adaptive.data import formats

ARRAYS = ("indptr", "indices", "values", "label_indptr", "label_indices")


def small_dataset() -> Dataset:
    """Rows: labels+features, no labels, no features, neither, labels+features."""
    return Dataset(
        indptr=np.array([0, 2, 3, 3, 3, 5], np.int64),
        indices=np.array([1, 7, 2, 9, 0], np.int32),
        values=np.array([0.5, 1.0, 0.1, 2.5e-7, 3.14159274], np.float32),
        label_indptr=np.array([0, 2, 2, 3, 3, 4], np.int64),
        label_indices=np.array([0, 3, 4, 1], np.int32),
        n_features=10, n_labels=5, source="small")


def assert_same(a: Dataset, b: Dataset):
    for k in ARRAYS:
        x, y = getattr(a, k), getattr(b, k)
        assert np.array_equal(x, y), k
        assert x.dtype == y.dtype, k
    assert (a.n_features, a.n_labels, a.n_rows) == (b.n_features, b.n_labels, b.n_rows)


def write(tmp_path, text, name="data.txt"):
    p = tmp_path / name
    p.write_bytes(text.encode())
    return p


# ----------------------------------------------------------------------------- round trips


def test_write_xc_exact_text(tmp_path):
    p = tmp_path / "out.txt"
    write_xc(p, small_dataset())
    assert p.read_text().splitlines() == [
        "5 10 5", "0,3 1:0.5 7:1", " 2:0.1", "4", " ", "1 9:2.5e-07 0:3.14159274"]
    assert not [q for q in tmp_path.iterdir() if q.name != "out.txt"]  # no temp file left


@pytest.mark.parametrize("header", [True, False])
def test_round_trip(tmp_path, header):
    ds = small_dataset()
    p = tmp_path / "rt.txt"
    write_xc(p, ds, header=header)
    back = load_dataset(p, n_features=10 if not header else None, use_cache=False)
    if not header:  # LIBSVM: shape from the largest index unless given
        assert parse_file(p).n_labels == 5 and parse_file(p).n_features == 10
        back = load_dataset(p, n_features=10, n_labels=5, use_cache=False)
    assert_same(back, ds)


def test_round_trip_random_values(tmp_path):
    rng = np.random.default_rng(3)
    n, nnz = 300, 4000
    ptr = np.concatenate(([0], np.sort(rng.integers(0, nnz, n - 1)), [nnz])).astype(np.int64)
    lptr = np.concatenate(([0], np.sort(rng.integers(0, 900, n - 1)), [900])).astype(np.int64)
    ds = Dataset(ptr, rng.integers(0, 5000, nnz).astype(np.int32),
                 (rng.random(nnz) * 10.0 ** rng.integers(-8, 8, nnz)).astype(np.float32),
                 lptr, rng.integers(0, 77, 900).astype(np.int32), 5000, 77)
    write_xc(tmp_path / "r.txt", ds)
    assert_same(load_dataset(tmp_path / "r.txt", use_cache=False), ds)


def test_parse_hand_checked(tmp_path):
    p = write(tmp_path, "4 10 5\n0,3 1:0.5 7:1\n 2:0.25\n4\n1 9:2\n\n")  # blank trailing line
    ds = parse_file(p)
    assert ds.indptr.tolist() == [0, 2, 3, 3, 4]
    assert ds.indices.tolist() == [1, 7, 2, 9]
    assert ds.values.tolist() == [0.5, 1.0, 0.25, 2.0]
    assert ds.label_indptr.tolist() == [0, 2, 2, 3, 4]
    assert ds.label_indices.tolist() == [0, 3, 4, 1]
    assert ds.indices.dtype == np.int32 and ds.values.dtype == np.float32
    assert ds.label_frequencies().tolist() == [1, 1, 0, 1, 1]


def test_libsvm_crlf_and_feature_first_row(tmp_path):
    # A row starting with a feature token has no labels; CRLF endings are fine.
    p = write(tmp_path, "3:1 4:2\r\n2,0 1:1e-3\r\n")
    ds = parse_file(p)
    assert (ds.n_rows, ds.n_features, ds.n_labels) == (2, 5, 3)
    assert ds.label_indices.tolist() == [2, 0] and ds.label_indptr.tolist() == [0, 0, 2]
    assert parse_file(p, n_features=100).n_features == 100


def test_small_blocks_match_default(tmp_path, monkeypatch):
    """Block boundaries (and the fast path's fallback) must not change the result."""
    from hvd_adaptive.data import synth
    train, _ = synth.synthesize(synth.SynthSpec(200, 1, 50, 20, nnz_mean=8, labels_mean=2))
    ds = train.subset(np.r_[np.arange(100), 5, 5])
    p = tmp_path / "s.txt"
    write_xc(p, ds)
    ref = parse_file(p)
    monkeypatch.setattr(formats, "_BLOCK", 37)
    assert_same(parse_file(p), ref)
    monkeypatch.setattr(formats, "_fast_block", lambda *a: None)  # line-by-line only
    assert_same(parse_file(p), ref)
    assert_same(ref, ds)


# ----------------------------------------------------------------------------- malformed input

H = "3 10 5\n"
MALFORMED = [
    ("empty", "", 1, "empty"),
    ("blank-only", "\n\n", 1, "empty"),
    ("header-2-tokens", "3 10\n0 1:1\n", 1, "header"),
    ("header-non-int", "3 1.5 5\n", 1, "header"),
    ("header-word", "3 x 5\n", 1, "header"),
    ("header-negative", "3 -10 5\n", 1, "header"),
    ("feat-abc", H + "0 1:1\n1 3:abc\n2 1:1\n", 3, "3:abc"),
    ("feat-no-colon", H + "0 1:1\n1 3\n2 1:1\n", 3, "'3'"),
    ("feat-no-index", H + "0 1:1\n1 :5\n2 1:1\n", 3, ":5"),
    ("feat-no-value", H + "0 1:1\n1 3:\n2 1:1\n", 3, "3:"),
    ("feat-two-colons", H + "0 1:1\n1 3:4:5\n2 1:1\n", 3, "3:4:5"),
    ("feat-x-index", H + "0 1:1\n1 x:1\n2 1:1\n", 3, "x:1"),
    ("feat-negative", H + "0 1:1\n1 -1:0.5\n2 1:1\n", 3, "-1:0.5"),
    ("feat-float-index", H + "0 1:1\n1 1e3:0.5\n2 1:1\n", 3, "1e3:0.5"),
    ("label-letter", H + "0 1:1\n1 2:1\na,2 1:1\n", 4, "a,2"),
    ("label-empty", H + "0 1:1\n1,,2 2:1\n2 1:1\n", 3, "1,,2"),
    ("label-trailing-comma", H + "1, 2:1\n0 1:1\n2 1:1\n", 2, "1,"),
    ("feat-out-of-range", H + "0 1:1\n1 10:1\n2 1:1\n", 3, "feature index 10"),
    ("label-out-of-range", H + "0 1:1\n5 2:1\n2 1:1\n", 3, "label index 5"),
    ("too-few-rows", H + "0 1:1\n1 2:1\n", 3, "rows"),
    ("too-many-rows", H + "0 1:1\n1 2:1\n1 2:1\n1 2:1\n\n", 5, "rows"),
    ("nan", H + "0 1:1\n1 2:nan\n2 1:1\n", 3, "non-finite"),
    ("inf", H + "0 1:1\n1 2:-inf\n2 1:1\n", 3, "non-finite"),
    ("float32-overflow", H + "0 1:1\n1 2:1e39\n2 1:1\n", 3, "non-finite"),
    ("libsvm-bad", "0 1:1\n1 2:1\n2 1:zz\n", 3, "1:zz"),
]


@pytest.mark.parametrize("text,line,frag", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed(tmp_path, text, line, frag):
    p = write(tmp_path, text, "bad_input.txt")
    with pytest.raises(DataError) as ei:
        load_dataset(p, use_cache=False)
    msg = str(ei.value)
    assert msg.startswith(f"{p}:{line}: "), msg
    assert frag in msg, msg
    assert not (tmp_path / "bad_input.txt.hvdcache").exists()


def test_error_line_number_in_later_block(tmp_path, monkeypatch):
    monkeypatch.setattr(formats, "_BLOCK", 100)
    rows = [f"{i % 5} {i % 10}:1.5" for i in range(300)]
    rows[236] = "1 4:1.5 8:oops"
    p = write(tmp_path, "300 10 5\n" + "\n".join(rows) + "\n")
    with pytest.raises(DataError, match=rf"^{p}:238: .*8:oops"):
        parse_file(p)


def test_header_shape_mismatch(tmp_path):
    p = write(tmp_path, "1 10 5\n0 1:1\n", "test.txt")
    with pytest.raises(DataError, match=r"test\.txt:1: .*n_features=10"):
        load_dataset(p, n_features=12)
    load_dataset(p)  # now cached ...
    with pytest.raises(DataError, match=r"test\.txt:1: .*n_labels=5"):
        load_dataset(p, n_labels=6)  # ... and the cached path checks too


def test_libsvm_index_beyond_forced_shape(tmp_path):
    p = write(tmp_path, "0 1:1\n1 7:1\n")
    with pytest.raises(DataError, match=rf"^{p}:2: feature index 7"):
        parse_file(p, n_features=5)


# ----------------------------------------------------------------------------- cache


def is_mapped(arr) -> bool:
    return isinstance(arr, np.memmap) or isinstance(getattr(arr, "base", None), np.memmap)


def test_cache_memory_maps_second_load(tmp_path):
    p = tmp_path / "d.txt"
    write_xc(p, small_dataset())
    first = load_dataset(p)
    assert not is_mapped(first.indices)
    cdir = tmp_path / "d.txt.hvdcache"
    meta = json.loads((cdir / "meta.json").read_text())
    assert meta["fmt"] == "xc" and meta["n_rows"] == 5 and meta["size"] == p.stat().st_size
    second = load_dataset(p)
    assert all(is_mapped(getattr(second, k)) for k in ARRAYS)
    assert_same(second, small_dataset())
    assert sorted(q.name for q in tmp_path.iterdir()) == ["d.txt", "d.txt.hvdcache"]


def test_cache_invalidated_by_source_change(tmp_path):
    p = tmp_path / "d.txt"
    write_xc(p, small_dataset())
    load_dataset(p)
    p.write_text("2 10 5\n1 1:1\n2 3:0.5\n")
    st = p.stat()
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    ds = load_dataset(p)
    assert ds.n_rows == 2 and ds.label_indices.tolist() == [1, 2]
    assert is_mapped(load_dataset(p).indices)


@pytest.mark.parametrize("damage", ["no-meta", "bad-meta", "truncated", "missing-array",
                                    "wrong-version"])
def test_damaged_cache_is_rebuilt(tmp_path, damage):
    p = tmp_path / "d.txt"
    write_xc(p, small_dataset())
    load_dataset(p)
    cdir = tmp_path / "d.txt.hvdcache"
    if damage == "no-meta":
        (cdir / "meta.json").unlink()
    elif damage == "bad-meta":
        (cdir / "meta.json").write_text("{not json")
    elif damage == "truncated":
        f = cdir / "indices.npy"
        f.write_bytes(f.read_bytes()[:-8])
    elif damage == "missing-array":
        (cdir / "values.npy").unlink()
    else:
        meta = json.loads((cdir / "meta.json").read_text())
        meta["version"] = -1
        (cdir / "meta.json").write_text(json.dumps(meta))
    ds = load_dataset(p)
    assert not is_mapped(ds.indices)  # parsed again, not trusted
    assert_same(ds, small_dataset())
    assert_same(load_dataset(p), small_dataset())  # and the rebuilt cache is good
    assert is_mapped(load_dataset(p).values)


def test_cache_dir_and_unwritable(tmp_path, monkeypatch):
    p = tmp_path / "d.txt"
    write_xc(p, small_dataset())
    caches = tmp_path / "caches"
    load_dataset(p, cache_dir=caches)
    assert is_mapped(load_dataset(p, cache_dir=caches).indices)
    (entry,) = caches.iterdir()
    assert entry.name.startswith("d.txt-") and (entry / "meta.json").exists()
    assert not (tmp_path / "d.txt.hvdcache").exists()

    # A cache folder under a regular file cannot be created (works even as root).
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    monkeypatch.setattr(formats, "_warned_unwritable", False)
    with pytest.warns(RuntimeWarning, match="cannot write dataset cache"):
        assert_same(load_dataset(p, cache_dir=blocker / "sub"), small_dataset())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once only
        assert_same(load_dataset(p, cache_dir=blocker / "sub"), small_dataset())


def test_cache_libsvm_forced_shape(tmp_path):
    p = write(tmp_path, "0 1:1\n2 7:1\n")
    assert load_dataset(p).n_features == 8
    ds = load_dataset(p, n_features=20, n_labels=4)
    assert (ds.n_features, ds.n_labels) == (20, 4) and is_mapped(ds.indices)
    with pytest.raises(DataError, match=rf"^{p}:2: "):
        load_dataset(p, n_features=5)
    assert load_dataset(p).n_features == 8


def test_use_cache_false_writes_nothing(tmp_path):
    p = tmp_path / "d.txt"
    write_xc(p, small_dataset())
    load_dataset(p, use_cache=False)
    assert [q.name for q in tmp_path.iterdir()] == ["d.txt"]


# ----------------------------------------------------------------------------- Dataset


def test_subset_matches_per_row_reference():
    ds = small_dataset()
    rows = np.array([4, 0, 2, 2, 3, 1])
    sub = ds.subset(rows)
    for j, r in enumerate(rows):
        a, b = ds.indptr[r], ds.indptr[r + 1]
        assert sub.indices[sub.indptr[j]:sub.indptr[j + 1]].tolist() == ds.indices[a:b].tolist()
        assert sub.values[sub.indptr[j]:sub.indptr[j + 1]].tolist() == ds.values[a:b].tolist()
        a, b = ds.label_indptr[r], ds.label_indptr[r + 1]
        got = sub.label_indices[sub.label_indptr[j]:sub.label_indptr[j + 1]]
        assert got.tolist() == ds.label_indices[a:b].tolist()
    assert ds.subset(np.array([], np.int64)).n_rows == 0
    with pytest.raises(IndexError):
        ds.subset(np.array([5]))


def test_dataset_rejects_inconsistent_arrays():
    ds = small_dataset()
    with pytest.raises(ValueError):
        Dataset(ds.indptr, ds.indices[:-1], ds.values[:-1], ds.label_indptr,
                ds.label_indices, 10, 5)


def test_atomic_text_replaces_the_file_only_when_the_write_ends(tmp_path):
    """write_xc's and the PyPI builder's files: an error part way leaves the old file as it
    was and no temporary file behind; a finished write replaces it."""
    atomic_text = formats.atomic_text
    path = tmp_path / "labels.txt"
    path.write_text("old\n")
    with pytest.raises(RuntimeError):
        with atomic_text(path) as f:
            f.write("half of the new\n")
            raise RuntimeError("interrupted")
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["labels.txt"]
    with atomic_text(path) as f:
        f.write("new\n")
    assert path.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["labels.txt"]
