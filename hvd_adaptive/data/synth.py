"""Synthetic, learnable XMC datasets shaped like the public benchmarks.

Generative model (all vectorised with numpy, rows produced in fixed-size chunks):

* Labels get Zipf weights ``(rank+1) ** -label_power`` (ranks shuffled) and are
  grouped into *topics* of ``~4 * labels_mean`` labels. A row picks a topic with
  probability proportional to its total weight, then ``k >= 1`` distinct labels of
  that topic (Gumbel top-k, so proportional to the weights, without replacement).
  Overall label frequencies therefore follow the power law, and labels of one
  topic co-occur.
* Each topic owns a pool of features and each label a few private "signature"
  features. A row's signal non-zeros come half from its topic pool and half from
  its labels' signatures; a fraction ``noise`` of its non-zeros is noise drawn
  from a Zipf law over all features (think stop words), and noise also tops up
  rows whose signal candidates run out. The row's total number
  of non-zeros is lognormal with mean ``nnz_mean`` (a long right tail).
* Values are tf-idf like: ``idf * tf`` with idf growing with a feature's
  rarity, tf random, and each row L2-normalised.
* With ``label_noise`` > 0, that fraction of rows then has its labels redrawn
  the same way from another random topic: features no longer tell those
  labels, so a model that fits them on the training rows has memorized them.
* With ``rare_features`` > 0, each row also gets that many times its non-zeros
  of features drawn uniformly over all features: at 135,909 features each
  falls in a few rows, like the words of real text that occur in a document or
  two. A network can tie a training row's labels to them (memorize the row),
  and they pull a test row towards the labels of whatever training rows shared
  them. With label noise as well, the test P@1 peaks and then falls as
  training goes on, as on real XMC data (docs/accuracy.md, "Data that
  overfits").

Train and test rows come from the same stream, so they share the distribution.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from .formats import Dataset, write_xc

_CHUNK = 20000  # rows generated per step; fixed so output depends only on the seed
_NNZ_SIGMA = 0.7  # lognormal shape: median ~0.8 * mean, max over 10k rows ~10x median
_NOISE_POWER = 1.0


@dataclass(frozen=True)
class SynthSpec:
    """Shape and distribution parameters of a synthetic dataset."""

    n_train: int
    n_test: int
    n_features: int
    n_labels: int
    nnz_mean: float = 76.0
    labels_mean: float = 5.45
    label_power: float = 1.1
    noise: float = 0.3
    seed: int = 0
    label_noise: float = 0.0
    rare_features: float = 0.0


PRESETS: dict[str, SynthSpec] = {
    "amazon670k": SynthSpec(490_449, 153_025, 135_909, 670_091, nnz_mean=76.0, labels_mean=5.45),
    "delicious200k": SynthSpec(196_606, 100_095, 782_585, 205_443, nnz_mean=301.0,
                               labels_mean=75.5),
    "eurlex4k": SynthSpec(15_539, 3_809, 5_000, 3_993, nnz_mean=236.0, labels_mean=5.3),
}


def preset(name: str, scale: float = 1.0, **overrides) -> SynthSpec:
    """Return a benchmark-shaped spec, optionally scaled down.

    Args:
        name: One of the keys of :data:`PRESETS`.
        scale: Multiplies the row and label counts (features are kept); results
            are kept at sensible minimums (100 train rows, 20 test rows, and
            enough labels for a row's label set).
        **overrides: Fields of :class:`SynthSpec` to set after scaling.

    Raises:
        ValueError: For an unknown name or a non-positive scale.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}")
    if not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    base = PRESETS[name]
    min_labels = max(10, math.ceil(2 * base.labels_mean))
    spec = dataclasses.replace(
        base,
        n_train=max(100, round(base.n_train * scale)),
        n_test=max(20, round(base.n_test * scale)),
        n_labels=max(min_labels, round(base.n_labels * scale)),
    )
    return dataclasses.replace(spec, **overrides)


def _check(spec: SynthSpec) -> None:
    ok = (spec.n_train >= 1 and spec.n_test >= 0 and spec.n_features >= 1 and spec.n_labels >= 1
          and spec.nnz_mean >= 1 and spec.labels_mean >= 1 and spec.label_power > 0
          and 0 <= spec.noise <= 1 and spec.seed >= 0 and 0 <= spec.label_noise <= 1
          and spec.rare_features >= 0)
    if not ok:
        raise ValueError(f"invalid SynthSpec: {spec}")


class _Model:
    """The random 'world': topics, label weights, feature pools and signatures."""

    def __init__(self, spec: SynthSpec, rng: np.random.Generator):
        L, F = spec.n_labels, spec.n_features
        self.topic_size = S = min(L, max(8, math.ceil(4 * spec.labels_mean)))
        n_topics = math.ceil(L / S)
        slots = np.full(n_topics * S, -1, dtype=np.int64)
        slots[:L] = rng.permutation(L)
        self.topic_labels = slots.reshape(n_topics, S)
        valid = self.topic_labels >= 0
        self.topic_len = valid.sum(axis=1)
        weight = (rng.permutation(L) + 1.0) ** -spec.label_power
        w = np.where(valid, weight[np.maximum(self.topic_labels, 0)], 0.0)
        with np.errstate(divide="ignore"):
            self.topic_logw = np.log(w)  # -inf on padding slots, never selected
        self.topic_cdf = np.cumsum(w.sum(axis=1))
        self.topic_cdf /= self.topic_cdf[-1]
        pool = min(F, max(16, math.ceil(spec.nnz_mean)))
        self.pools = rng.integers(0, F, size=(n_topics, pool))
        n_sig = min(F, max(4, math.ceil(spec.nnz_mean / (2 * spec.labels_mean))))
        self.signatures = rng.integers(0, F, size=(L, n_sig))
        f_rank = rng.permutation(F)
        noise_w = (f_rank + 1.0) ** -_NOISE_POWER
        self.noise_cdf = np.cumsum(noise_w) / noise_w.sum()
        self.idf = np.log(2.0 + f_rank).astype(np.float32)  # frequent features weigh less


def _dedupe_quota(rows, feats, quota, n_features):
    """Keep, per row, the first ``quota[row]`` distinct features (array order = priority).

    Returns the kept ``(rows, feats)`` grouped by row.
    """
    key = rows * n_features + feats
    _, first = np.unique(key, return_index=True)
    first.sort()  # back to priority order
    order = np.argsort(rows[first], kind="stable")
    first = first[order]
    r = rows[first]
    counts = np.bincount(r, minlength=len(quota))
    group_start = np.cumsum(counts) - counts
    rank = np.arange(len(r)) - group_start[r]
    keep = first[rank < quota[r]]
    return rows[keep], feats[keep]


def _chunk(model: _Model, spec: SynthSpec, m: int, rng: np.random.Generator):
    """Generate ``m`` rows: returns (feature counts, feats, vals, label counts, labels)."""
    F = spec.n_features
    topic = np.searchsorted(model.topic_cdf, rng.random(m), side="right")
    topic = np.minimum(topic, len(model.topic_cdf) - 1)
    k, labels = _draw_labels(model, spec, topic, rng)
    lab_start = np.cumsum(k) - k

    mu = math.log(spec.nnz_mean) - _NNZ_SIGMA**2 / 2
    nnz = np.clip(np.rint(rng.lognormal(mu, _NNZ_SIGMA, size=m)), 1, F).astype(np.int64)
    sig_target = np.rint((1.0 - spec.noise) * nnz).astype(np.int64)

    # Signal: oversample (duplicates are dropped), half topic pool, half signatures.
    n_draw = np.where(sig_target > 0, 2 * sig_target + 2, 0)
    rows = np.repeat(np.arange(m), n_draw)
    from_pool = rng.random(len(rows)) < 0.5
    pool_f = model.pools[topic[rows], rng.integers(0, model.pools.shape[1], len(rows))]
    own = labels[lab_start[rows] + (rng.random(len(rows)) * k[rows]).astype(np.int64)]
    sig_f = model.signatures[own, rng.integers(0, model.signatures.shape[1], len(rows))]
    rows, feats = _dedupe_quota(rows, np.where(from_pool, pool_f, sig_f), sig_target, F)

    # Noise fills each row up to its nnz; later rounds draw uniformly so that
    # rows needing more distinct features than the Zipf head offers still fill.
    for rnd in range(6):
        need = nnz - np.bincount(rows, minlength=m)
        if not need.any():
            break
        extra = np.repeat(np.arange(m), np.where(need > 0, 2 * need + 2, 0))
        if rnd == 0:
            f_new = np.searchsorted(model.noise_cdf, rng.random(len(extra)), side="right")
            f_new = np.minimum(f_new, F - 1)
        else:
            f_new = rng.integers(0, F, len(extra))
        rows, feats = _dedupe_quota(np.concatenate((rows, extra)), np.concatenate((feats, f_new)),
                                    nnz, F)

    if spec.rare_features > 0:  # only then: at 0 no pass over the chunk's rows
        n_rare = np.rint(spec.rare_features * nnz).astype(np.int64)
        extra = np.repeat(np.arange(m), n_rare)
        rows, feats = _dedupe_quota(np.concatenate((rows, extra)),
                                    np.concatenate((feats, rng.integers(0, F, len(extra)))),
                                    nnz + n_rare, F)
    vals = model.idf[feats] * rng.gamma(2.0, 0.5, size=len(feats)).astype(np.float32)
    norms = np.sqrt(np.bincount(rows, weights=vals.astype(np.float64) ** 2, minlength=m))
    vals = (vals / norms[rows]).astype(np.float32)
    if spec.label_noise > 0:  # drawn last: label_noise 0 leaves every other draw as it was
        other = np.searchsorted(model.topic_cdf, rng.random(m), side="right")
        other = np.minimum(other, len(model.topic_cdf) - 1)
        noisy = rng.random(m) < spec.label_noise
        k2, labels2 = _draw_labels(model, spec, other[noisy], rng)
        k, labels = _replace_rows(k, labels, noisy, k2, labels2)
    return np.bincount(rows, minlength=m), feats, vals, k, labels


def _replace_rows(k, labels, which, k2, labels2):
    """Flat per-row labels (counts `k`) with the rows `which` replaced by (`k2`, `labels2`):
    both keep their rows' order, so each fills its own positions of the result in order."""
    k_out = k.copy()
    k_out[which] = k2
    out = np.empty(int(k_out.sum()), labels.dtype)
    new = np.repeat(which, k_out)
    out[~new] = labels[np.repeat(~which, k)]
    out[new] = labels2
    return k_out, out


def _draw_labels(model: _Model, spec: SynthSpec, topic: np.ndarray, rng: np.random.Generator):
    """Each row's label count and labels (flat, row after row) from its topic."""
    k = np.minimum(rng.geometric(1.0 / spec.labels_mean, size=len(topic)), model.topic_len[topic])
    # Gumbel top-k: sorting log-weight + Gumbel noise samples without replacement.
    g = model.topic_logw[topic] + rng.gumbel(size=(len(topic), model.topic_size))
    order = np.argsort(-g, axis=1)
    take = np.arange(model.topic_size) < k[:, None]
    return k, model.topic_labels[topic[:, None], order][take]


def _slice_rows(ds: Dataset, a: int, b: int) -> Dataset:
    ip, lp = ds.indptr[a:b + 1], ds.label_indptr[a:b + 1]
    return Dataset(ip - ip[0], ds.indices[ip[0]:ip[-1]], ds.values[ip[0]:ip[-1]],
                   lp - lp[0], ds.label_indices[lp[0]:lp[-1]], ds.n_features, ds.n_labels,
                   ds.source)


def synthesize(spec: SynthSpec, progress: Optional[Callable[[int, int], None]] = None
               ) -> tuple[Dataset, Dataset]:
    """Generate a (train, test) pair from one distribution; deterministic in ``spec.seed``.

    Args:
        spec: The dataset shape and distribution.
        progress: Called as ``progress(rows_done, rows_total)`` after each chunk of rows.

    Returns:
        ``(train, test)`` in-memory datasets with ``spec.n_train`` / ``spec.n_test`` rows.
    """
    _check(spec)
    total = spec.n_train + spec.n_test
    n_chunks = math.ceil(total / _CHUNK)
    seeds = np.random.SeedSequence(spec.seed).spawn(n_chunks + 1)
    model = _Model(spec, np.random.default_rng(seeds[0]))
    parts = []
    for c, s in enumerate(seeds[1:]):
        parts.append(_chunk(model, spec, min(_CHUNK, total - c * _CHUNK), np.random.default_rng(s)))
        if progress is not None:
            progress(min((c + 1) * _CHUNK, total), total)
    f_cnt, feats, vals, l_cnt, labels = (np.concatenate([p[i] for p in parts]) for i in range(5))
    ptr = np.concatenate(([0], np.cumsum(f_cnt))).astype(np.int64)
    lptr = np.concatenate(([0], np.cumsum(l_cnt))).astype(np.int64)
    src = f"synth(seed={spec.seed})"
    full = Dataset(ptr, feats.astype(np.int32), vals, lptr, labels.astype(np.int32),
                   spec.n_features, spec.n_labels, src)
    return _slice_rows(full, 0, spec.n_train), _slice_rows(full, spec.n_train, total)


_SYNTH_CACHE_VERSION = 1
_SPLIT_ARRAYS = ("indptr", "indices", "values", "label_indptr", "label_indices")


def synthesize_cached(spec: SynthSpec, cache_dir, progress=None) -> tuple[Dataset, Dataset]:
    """`synthesize`, kept as memory-mapped ``.npy`` arrays under ``cache_dir`` (keyed by the
    spec): the first call generates and writes them (into a temporary folder, renamed when
    complete), later calls map them in milliseconds. A damaged cache is rebuilt."""
    _check(spec)
    key = hashlib.sha256(json.dumps([_SYNTH_CACHE_VERSION, dataclasses.asdict(spec)],
                                    sort_keys=True).encode()).hexdigest()[:16]
    cdir = Path(cache_dir) / f"synth-{key}"
    src = f"synth(seed={spec.seed})"
    try:
        meta = json.loads((cdir / "meta.json").read_text())
        out = []
        for part in ("train", "test"):
            arrays = {k: np.load(cdir / f"{part}.{k}.npy", mmap_mode="r") for k in _SPLIT_ARRAYS}
            out.append(Dataset(**arrays, n_features=meta["n_features"], n_labels=meta["n_labels"],
                               source=src))
        if (out[0].n_rows, out[1].n_rows) == (spec.n_train, spec.n_test):
            return out[0], out[1]
    except (OSError, ValueError, KeyError):
        pass  # missing or damaged: generate
    train, test = synthesize(spec, progress)
    cdir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=cdir.parent, prefix=f".{cdir.name}.tmp-"))
    try:
        for part, ds in (("train", train), ("test", test)):
            for k in _SPLIT_ARRAYS:
                np.save(tmp / f"{part}.{k}.npy", np.ascontiguousarray(getattr(ds, k)))
        (tmp / "meta.json").write_text(json.dumps(
            {"spec": dataclasses.asdict(spec), "n_features": spec.n_features,
             "n_labels": spec.n_labels}, indent=1))
        if cdir.exists():
            shutil.rmtree(cdir, ignore_errors=True)
        os.rename(tmp, cdir)  # a cache folder only ever appears complete
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return train, test


def as_counts(ds: Dataset, per_unit: float) -> Dataset:
    """The same rows with raw-count-like feature values: each value (an L2-normalized TF-IDF
    weight) times `per_unit`, rounded, at least 1; rows are no longer normalized."""
    counts = np.maximum(1.0, np.rint(np.asarray(ds.values, np.float64) * per_unit)).astype(np.float32)
    return dataclasses.replace(ds, values=counts)


def synth_to_files(spec: SynthSpec, out_dir, counts: Optional[float] = None) -> tuple[Path, Path]:
    """Generate a dataset and write ``out_dir/train.txt`` and ``out_dir/test.txt``.

    Args:
        spec: The dataset shape and distribution.
        out_dir: Destination folder (created if missing).
        counts: write raw-count-like values instead (`as_counts` with this factor).

    Returns:
        The paths of the train and test files (XC format with header).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train, test = synthesize(spec)
    if counts:
        train, test = as_counts(train, counts), as_counts(test, counts)
    paths = out / "train.txt", out / "test.txt"
    write_xc(paths[0], train)
    write_xc(paths[1], test)
    return paths
