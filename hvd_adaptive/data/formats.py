"""Reading, writing and caching of XMC datasets in the Extreme Classification format.

Text format: an optional header ``N_points N_features N_labels``, then one row
per line, ``l1,l2,... f1:v1 f2:v2 ...`` with 0-based ids. A row without labels
starts with whitespace (or with a feature token); a row may have no features;
LIBSVM multi-label files are the same rows without the header.

The file is read in blocks of complete lines. Each block is first parsed by a
vectorised numpy path (byte masks validate every token, ``np.fromstring``
converts all numbers at once); if anything in the block looks wrong, the block
is re-parsed line by line in Python, which pinpoints the line and the problem.
The vectorised path parses several times faster than the line-by-line path alone
(docs/benchmark.md, "Figures behind the code's defaults"); a cached reload only
memory-maps the arrays.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np

from .batching import Dataset

CACHE_VERSION = 1
_BLOCK = 1 << 22  # bytes of text handled per vectorised step; bounds temporary memory
_INT32_MAX = 2**31 - 1
_DTYPES = {"indptr": np.int64, "indices": np.int32, "values": np.float32,
           "label_indptr": np.int64, "label_indices": np.int32}
_ARRAYS = tuple(_DTYPES)
_VALUE_CHARS = frozenset("0123456789.eE+-")
_WS = np.zeros(256, bool)
_WS[[9, 10, 11, 12, 13, 32]] = True
_DIGIT = np.zeros(256, bool)
_DIGIT[48:58] = True
_VALCH = _DIGIT.copy()
_VALCH[list(b".eE+-")] = True
_TO_SPACE = bytes.maketrans(b":,", b"  ")
_warned_unwritable = False


class DataError(ValueError):
    """Malformed dataset file; the message starts with ``"<path>:<line>: "``."""


def _err(path, line, what: str) -> DataError:
    return DataError(f"{path}:{line}: {what}" if line else f"{path}: {what}")


# ----------------------------------------------------------------------------- parsing


def _fast_block(buf: bytes, n_lines: int, f_lim: int, l_lim: int):
    """Vectorised parse of complete lines; returns None when anything is off."""
    a = np.frombuffer(buf, np.uint8)  # buf ends with b"\n", so a[-1] is whitespace
    ws = _WS[a]
    starts = ~ws
    starts[1:] &= ws[:-1]
    spos = np.flatnonzero(starts)
    nl_pos = np.flatnonzero(a == 10)
    tok_line = np.searchsorted(nl_pos, spos)
    line_start = np.concatenate(([0], nl_pos[:-1] + 1))
    tok_id = np.cumsum(starts, dtype=np.int32) - 1
    colon, comma = np.flatnonzero(a == 58), np.flatnonzero(a == 44)
    ntok = len(spos)
    n_colon = np.bincount(tok_id[colon], minlength=ntok)
    n_comma = np.bincount(tok_id[comma], minlength=ntok)
    # The labels are the first token of a line, and only when it has no colon.
    is_label = (spos == line_start[tok_line]) & (n_colon == 0)
    is_feat = ~is_label
    if np.any(is_feat & ((n_colon != 1) | (n_comma != 0))):
        return None
    # Colons need text on both sides and commas digits on both sides; index -1
    # wraps to the final newline, which conveniently counts as "bad".
    if _WS[a[colon - 1]].any() or _WS[a[colon + 1]].any():
        return None
    if not (_DIGIT[a[comma - 1]].all() and _DIGIT[a[comma + 1]].all()):
        return None
    odd = np.flatnonzero(~_DIGIT[a] & ~ws & (a != 58) & (a != 44))
    if odd.size:  # non-digits are only allowed in the value part of a feature
        tok_colon = np.full(ntok, len(a), dtype=np.int64)
        tok_colon[is_feat] = colon
        t = tok_id[odd]
        if not (is_feat[t] & (odd > tok_colon[t]) & _VALCH[a[odd]]).all():
            return None
    pieces = np.where(is_label, n_comma + 1, 2)
    expected = int(pieces.sum())
    nums = np.zeros(0)
    if expected:  # fromstring on whitespace-only text returns a bogus [-1.]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                nums = np.fromstring(buf.translate(_TO_SPACE), dtype=np.float64, sep=" ")
        except (ValueError, DeprecationWarning):
            return None
    if len(nums) != expected:
        return None
    lab_piece = np.repeat(is_label, pieces)
    labels, fv = nums[lab_piece], nums[~lab_piece]
    with np.errstate(over="ignore"):  # overflow to inf is rejected just below
        idx, vals = fv[0::2], fv[1::2].astype(np.float32)
    if (idx.size and idx.max() >= f_lim) or (labels.size and labels.max() >= l_lim):
        return None
    if not np.isfinite(vals).all():
        return None
    f_cnt = np.bincount(tok_line[is_feat], minlength=n_lines)
    l_cnt = np.bincount(tok_line[is_label], weights=pieces[is_label], minlength=n_lines)
    return f_cnt, l_cnt.astype(np.int64), idx.astype(np.int32), vals, labels.astype(np.int32)


def _slow_block(buf: bytes, first_line: int, f_lim: int, l_lim: int, path):
    """Line-by-line parse of a block; raises DataError at the first bad line."""
    f_cnt, l_cnt, idx, vals, labels = [], [], [], [], []

    def fail(what):
        raise _err(path, line, what)

    def limit(lim, what):
        return f"n_{what}={lim}" if lim < _INT32_MAX else "the int32 range"

    for line, raw in enumerate(buf.split(b"\n")[:-1], start=first_line):
        s = raw.decode("utf-8", "replace")
        toks = s.split()
        n_lab = 0
        if toks and not s[0].isspace() and ":" not in toks[0]:
            lab = toks.pop(0)
            for p in lab.split(","):
                if not (p.isascii() and p.isdigit()):
                    fail(f"bad label token {lab!r}: expected comma-separated non-negative integers")
                if int(p) >= l_lim:
                    fail(f"label index {p} out of range (must be < {limit(l_lim, 'labels')})")
                labels.append(int(p))
                n_lab += 1
        for t in toks:
            i, sep, v = t.partition(":")
            if not sep or not i or not v or ":" in v or "," in t:
                fail(f"bad feature token {t!r}: expected 'index:value'")
            if not (i.isascii() and i.isdigit()):
                fail(f"bad feature index in {t!r}: expected a non-negative integer")
            if int(i) >= f_lim:
                fail(f"feature index {i} out of range (must be < {limit(f_lim, 'features')})")
            try:
                with np.errstate(over="ignore"):
                    x = np.float32(float(v))
            except ValueError:
                x = None
            if x is not None and not np.isfinite(x):
                fail(f"non-finite feature value in {t!r} (as float32)")
            if x is None or not set(v) <= _VALUE_CHARS:
                fail(f"bad feature value in {t!r}")
            idx.append(int(i))
            vals.append(x)
        f_cnt.append(len(toks))
        l_cnt.append(n_lab)
    return (np.array(f_cnt, np.int64), np.array(l_cnt, np.int64), np.array(idx, np.int32),
            np.array(vals, np.float32), np.array(labels, np.int32))


def _read_header(first: bytes, fmt: str, path, n_features, n_labels):
    """Return header ``(n_points, n_features, n_labels)`` or None for a LIBSVM file."""
    toks = first.split()
    if fmt == "libsvm" or (fmt == "auto" and (len(toks) < 2 or b":" in first or b"," in first)):
        return None
    if len(toks) != 3 or not all(t.isdigit() for t in toks):
        raise _err(path, 1, f"bad header {first.decode('utf-8', 'replace').strip()!r}: expected "
                   "'N_points N_features N_labels' as three non-negative integers")
    head = tuple(int(t) for t in toks)
    _check_header_shape(path, head[1], head[2], n_features, n_labels)
    return head


def read_header(path, *, fmt="auto", n_features=None, n_labels=None):
    """An XC file's header ``(n_points, n_features, n_labels)`` from its first line alone, or
    None for a LIBSVM file: the shape errors a run can report before it loads any data.

    Raises:
        DataError: An empty file, a malformed header, or a shape other than the one expected.
    """
    src = os.fspath(path)
    with open(src, "rb") as f:
        first = f.readline()
    if not first:
        raise _err(src, 1, "empty file")
    return _read_header(first, fmt, src, n_features, n_labels)


def _check_header_shape(path, nf, nl, want_nf, want_nl):
    for name, have, want in (("n_features", nf, want_nf), ("n_labels", nl, want_nl)):
        if want is not None and have != want:
            raise _err(path, 1, f"header says {name}={have} but {want} was expected "
                       "(e.g. from the training file)")


def _open_rows(f, path, fmt, n_features, n_labels):
    """Reads the header (if any) of an open file; returns (head, f_lim, l_lim, carry, line)."""
    if fmt not in ("auto", "xc", "libsvm"):
        raise ValueError(f"fmt must be 'auto', 'xc' or 'libsvm', got {fmt!r}")
    first = f.readline()
    if not first:
        raise _err(path, 1, "empty file")
    head = _read_header(first, fmt, path, n_features, n_labels)
    if head is not None:
        return head, head[1], head[2], b"", 2
    f_lim = _INT32_MAX if n_features is None else n_features
    l_lim = _INT32_MAX if n_labels is None else n_labels
    return head, f_lim, l_lim, first, 1


def _parsed_blocks(f, path, f_lim, l_lim, carry, line):
    """Parses the rest of an open file in blocks of complete lines (about `_BLOCK` bytes).

    Yields:
        (first line number, lines in the block, (f_cnt, l_cnt, idx, vals, labels)).
    """
    eof = False
    while not eof:
        block = f.read(_BLOCK)
        eof = not block
        data = carry + block
        cut = len(data) if eof else data.rfind(b"\n") + 1
        ready, carry = data[:cut], data[cut:]
        if eof and ready and not ready.endswith(b"\n"):
            ready += b"\n"
        # Hold back trailing empty lines: at end of file they are not rows.
        body = ready.rstrip(b"\r\n")
        keep = ready.find(b"\n", len(body)) + 1 if body else 0
        ready, carry = ready[:keep], ready[keep:] + carry
        if not ready:
            continue
        n = ready.count(b"\n")
        got = _fast_block(ready, n, f_lim, l_lim)
        yield line, n, got if got is not None else _slow_block(ready, line, f_lim, l_lim, path)
        line += n


def _check_rows(path, head, n_rows: int, last_line: int) -> None:
    if head is not None and n_rows != head[0]:
        raise _err(path, last_line, f"header says {head[0]} rows but the file has {n_rows}")


def _parse(path, fmt, n_features, n_labels):
    """Parse a text file; returns ``(Dataset, info)`` where info feeds the cache meta."""
    path = os.fspath(path)
    parts: list[tuple] = []
    with open(path, "rb") as f:
        head, f_lim, l_lim, carry, line = _open_rows(f, path, fmt, n_features, n_labels)
        for first, n, got in _parsed_blocks(f, path, f_lim, l_lim, carry, line):
            parts.append(got)
            line = first + n
    f_cnt, l_cnt, idx, vals, labels = (
        np.concatenate([p[k] for p in parts]) if parts else np.zeros(0, dt)
        for k, dt in enumerate((np.int64, np.int64, np.int32, np.float32, np.int32)))
    n_rows = len(f_cnt)
    if head is None and not idx.size and not labels.size:
        raise _err(path, 1, "empty file (no labels or features)")
    _check_rows(path, head, n_rows, line - 1)
    max_f = int(idx.max()) if idx.size else -1
    max_l = int(labels.max()) if labels.size else -1
    if head is not None:
        nf, nl = head[1], head[2]
    else:
        nf = max_f + 1 if n_features is None else n_features
        nl = max_l + 1 if n_labels is None else n_labels
    ds = _dataset(path, f_cnt, l_cnt, idx, vals, labels, nf, nl)
    # The cache keeps a LIBSVM file's natural shape; a forced shape is re-applied on load.
    info = {"fmt": "xc" if head is not None else "libsvm", "max_feature": max_f,
            "max_label": max_l, "n_features": head[1] if head else max_f + 1,
            "n_labels": head[2] if head else max_l + 1}
    return ds, info


def _dataset(path, f_cnt, l_cnt, idx, vals, labels, nf, nl) -> Dataset:
    indptr, lptr = (np.concatenate(([0], np.cumsum(c))).astype(np.int64) for c in (f_cnt, l_cnt))
    return Dataset(indptr, idx, vals, lptr, labels, nf, nl, path)


def iter_rows(path, *, fmt="auto", n_features=None):
    """Streams a text file in blocks of rows (about 4 MB of text each), without any cache.

    Memory stays bounded by a block whatever the file's size: for prediction over files too
    large to hold. Labels are parsed (any non-negative id) and may be ignored by the caller.

    Args:
        path: The text file (XC with header, or LIBSVM).
        fmt: ``"auto"``, ``"xc"`` or ``"libsvm"`` (see :func:`parse_file`).
        n_features: The model's feature count: a larger feature id (or an XC header with
            another count) raises, naming the line.

    Yields:
        (line number of the block's first row, :class:`Dataset` of the block's rows).

    Raises:
        DataError: On malformed input, naming the file and line.
    """
    path = os.fspath(path)
    n_rows = 0
    with open(path, "rb") as f:
        head, f_lim, l_lim, carry, line = _open_rows(f, path, fmt, n_features, None)
        for first, n, got in _parsed_blocks(f, path, f_lim, l_lim, carry, line):
            labels = got[4]
            nl = head[2] if head else (int(labels.max()) + 1 if labels.size else 0)
            yield first, _dataset(path, *got, f_lim, nl)
            n_rows, line = n_rows + n, first + n
    _check_rows(path, head, n_rows, line - 1)


def parse_file(path, *, fmt="auto", n_features=None, n_labels=None) -> Dataset:
    """Parse an XC (with header) or LIBSVM multi-label text file, without any cache.

    Args:
        path: The text file.
        fmt: ``"auto"`` (header detected from the first line), ``"xc"`` or ``"libsvm"``.
        n_features: Expected feature count. For XC a different header raises; for
            LIBSVM it sets the shape (default: largest index + 1).
        n_labels: Same for labels.

    Returns:
        The parsed :class:`Dataset` (in-memory arrays).

    Raises:
        DataError: On malformed input, naming the file and line.
    """
    return _parse(path, fmt, n_features, n_labels)[0]


# ----------------------------------------------------------------------------- writing


def _format_values(v: np.ndarray) -> list[str]:
    """Shortest of %.6g / %.9g that reads back to the same float32 (9 digits always do)."""
    short = list(map("{:.6g}".format, v.tolist()))
    if short:
        back = np.array(short, dtype=np.float64).astype(np.float32)
        for i in np.flatnonzero(back != v).tolist():
            short[i] = "{:.9g}".format(float(v[i]))
    return short


@contextlib.contextmanager
def atomic_text(path, encoding: str = "utf-8"):
    """A text file opened for writing whose content replaces ``path`` only when the block ends
    without an error (a temporary file in the same folder, synced, then renamed over it), so
    readers never see a half-written file and an error leaves the old one in place."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding=encoding, newline="\n") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_xc(path, ds: Dataset, *, header=True) -> None:
    """Write a dataset as XC text (or LIBSVM text with ``header=False``), atomically.

    The text goes to a temporary file in the destination folder which then
    replaces ``path``, so readers never see a half-written file.

    Args:
        path: Destination file.
        ds: Dataset to write.
        header: Whether to write the ``N_points N_features N_labels`` header.
    """
    with atomic_text(path, encoding="ascii") as f:
        if header:
            f.write(f"{ds.n_rows} {ds.n_features} {ds.n_labels}\n")
        step = 20000
        for a in range(0, ds.n_rows, step):
            b = min(a + step, ds.n_rows)
            ip = np.asarray(ds.indptr[a:b + 1]) - int(ds.indptr[a])
            lp = np.asarray(ds.label_indptr[a:b + 1]) - int(ds.label_indptr[a])
            sl = slice(int(ds.indptr[a]), int(ds.indptr[b]))
            feats = list(map("{}:{}".format, ds.indices[sl].tolist(),
                             _format_values(np.asarray(ds.values[sl], np.float32))))
            labs = list(map(str, ds.label_indices[ds.label_indptr[a]:ds.label_indptr[b]]
                            .tolist()))
            lines = []
            for r in range(b - a):
                lab = ",".join(labs[lp[r]:lp[r + 1]])
                feat = " ".join(feats[ip[r]:ip[r + 1]])
                # A label-less row must start with a space; a feature-less one needs none.
                lines.append(f"{lab} {feat}\n" if feat or not lab else f"{lab}\n")
            f.write("".join(lines))


# ----------------------------------------------------------------------------- binary cache


def _cache_path(src: str, cache_dir) -> Path:
    if cache_dir is None:
        return Path(src + ".hvdcache")
    key = hashlib.sha256(os.path.abspath(src).encode()).hexdigest()[:16]
    return Path(cache_dir) / f"{Path(src).name}-{key}.hvdcache"


def _read_cache(cdir: Path, st: os.stat_result, src: str):
    """Return ``(arrays, meta)`` of a complete, current cache, else None."""
    try:
        meta = json.loads((cdir / "meta.json").read_text())
        if (meta.get("version") != CACHE_VERSION or meta.get("size") != st.st_size
                or meta.get("mtime_ns") != st.st_mtime_ns):
            return None
        arrays = {k: np.load(cdir / f"{k}.npy", mmap_mode="r", allow_pickle=False)
                  for k in _ARRAYS}
        want = {"indptr": meta["n_rows"] + 1, "label_indptr": meta["n_rows"] + 1,
                "indices": meta["nnz"], "values": meta["nnz"],
                "label_indices": meta["n_label_entries"]}
        for k, arr in arrays.items():
            if arr.dtype != _DTYPES[k] or arr.shape != (want[k],):
                return None
        Dataset(**arrays, n_features=0, n_labels=0, source=src)  # length consistency
        return arrays, meta
    except Exception:  # any damage means "not trusted"; the caller re-parses
        return None


def _write_cache(cdir: Path, ds: Dataset, info: dict, st: os.stat_result) -> None:
    global _warned_unwritable
    tmp = None
    try:
        cdir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=cdir.parent, prefix=f".{cdir.name}.tmp-"))
        for k in _ARRAYS:
            np.save(tmp / f"{k}.npy", np.ascontiguousarray(getattr(ds, k), dtype=_DTYPES[k]))
        meta = dict(info, version=CACHE_VERSION, size=st.st_size, mtime_ns=st.st_mtime_ns,
                    n_rows=ds.n_rows, nnz=len(ds.indices), n_label_entries=len(ds.label_indices))
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        try:
            os.rename(tmp, cdir)  # atomic: a cache folder only ever appears complete
        except OSError:  # a stale cache (or one another process just built) is in the way
            trash = Path(tempfile.mkdtemp(dir=cdir.parent, prefix=f".{cdir.name}.old-"))
            with contextlib.suppress(OSError):
                os.rename(cdir, trash / "c")
            with contextlib.suppress(OSError):
                os.rename(tmp, cdir)
            shutil.rmtree(trash, ignore_errors=True)
    except OSError as e:
        if not _warned_unwritable:
            _warned_unwritable = True
            warnings.warn(f"cannot write dataset cache {cdir}: {e}; parsing text every time",
                          RuntimeWarning, stacklevel=3)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def load_dataset(path, *, fmt="auto", n_features=None, n_labels=None, cache_dir=None,
                 use_cache=True) -> Dataset:
    """Load a dataset, using (and maintaining) a memory-mapped binary cache.

    The first load parses the text and stores the CSR arrays as ``.npy`` files
    plus ``meta.json`` in ``<path>.hvdcache/`` (or under ``cache_dir``, keyed by
    a hash of the absolute path). Later loads memory-map them while the
    source's size and mtime are unchanged; stale or damaged caches are rebuilt.

    Args:
        path: The text file.
        fmt: ``"auto"``, ``"xc"`` or ``"libsvm"`` (see :func:`parse_file`).
        n_features: Expected/forced feature count (see :func:`parse_file`).
        n_labels: Expected/forced label count.
        cache_dir: Folder for caches; default is beside the source.
        use_cache: False parses the text and neither reads nor writes a cache.

    Returns:
        The :class:`Dataset`; its arrays are read-only memory maps on a cache hit.

    Raises:
        DataError: On malformed input or a header that contradicts the expected shape.
    """
    src = os.fspath(path)
    if not use_cache:
        return parse_file(src, fmt=fmt, n_features=n_features, n_labels=n_labels)
    st = os.stat(src)
    cdir = _cache_path(src, cache_dir)
    hit = _read_cache(cdir, st, src)
    if hit is not None and fmt in ("auto", hit[1]["fmt"]):
        arrays, meta = hit
        if meta["fmt"] == "xc":
            _check_header_shape(src, meta["n_features"], meta["n_labels"], n_features, n_labels)
            return Dataset(**arrays, n_features=meta["n_features"], n_labels=meta["n_labels"],
                           source=src)
        # LIBSVM: a forced shape is fine if it covers every index; otherwise fall
        # through to the text parse, which reports the offending line.
        nf = meta["n_features"] if n_features is None else n_features
        nl = meta["n_labels"] if n_labels is None else n_labels
        if nf > meta["max_feature"] and nl > meta["max_label"]:
            return Dataset(**arrays, n_features=nf, n_labels=nl, source=src)
    ds, info = _parse(src, fmt, n_features, n_labels)
    _write_cache(cdir, ds, info, st)
    return ds
