"""A run's train and test sets on every rank (collective), and the checks that they fit the job."""
from __future__ import annotations

import os
import time
from typing import Callable, Optional

import numpy as np

from hvd_adaptive.config import Config, ConfigError
from hvd_adaptive.data.formats import DataError, Dataset, load_dataset, read_header
from hvd_adaptive.data.synth import PRESETS, SynthSpec, preset, synthesize, synthesize_cached


def load_data(cfg: Config, root: bool = True,
              barrier: Optional[Callable[[], None]] = None) -> tuple[Dataset, Dataset]:
    """Train and test sets on every rank: synthetic (same seed everywhere) or files.

    Rank 0 parses files first and writes the binary caches; the others then memory-map them,
    so ranks never race to build one cache.

    Args:
        cfg: the run's config (its data section).
        root: whether this process is the job's rank 0 (a single process is).
        barrier: waits for every rank of the job (for example `comm.Barrier`); None for a
            single process outside any job.
    """
    check_sources(cfg)
    d = cfg.data
    barrier = barrier or (lambda: None)
    if d.train == "synthetic":
        spec = synth_spec(cfg)
        say = _progress("generating synthetic data", root)
        if d.cache_dir is None:
            return synthesize(spec, say)
        # Rank 0 generates and writes the cache; the others then memory-map it.
        out = synthesize_cached(spec, d.cache_dir, say) if root else None
        barrier()
        return out if out is not None else synthesize_cached(spec, d.cache_dir)

    def load() -> tuple[Dataset, Dataset]:
        train = load_dataset(d.train, fmt=d.format, cache_dir=d.cache_dir)
        test = load_dataset(d.test, fmt=d.format, cache_dir=d.cache_dir,
                            n_features=train.n_features, n_labels=train.n_labels)
        return train, test

    out = load() if root else None
    barrier()
    return out if out is not None else load()


SYNTHETIC = "the synthetic training set"  # where messages name the training file


def split_validation(cfg: Config, train: Dataset) -> tuple[Dataset, Optional[Dataset]]:
    """The training rows without the validation split, and the split (None without one).

    The split's rows are drawn by data.validation_seed, the same on every rank; both parts
    keep the file's row order. Raises ConfigError when the split would take every row or none.
    """
    k = cfg.data.validation_rows(train.n_rows, train.source or SYNTHETIC)
    if k == 0:
        return train, None
    held = np.random.default_rng(cfg.data.validation_seed).permutation(train.n_rows)[:k]
    keep = np.ones(train.n_rows, bool)
    keep[held] = False
    return train.subset(np.flatnonzero(keep)), train.subset(np.sort(held))


def synth_spec(cfg: Config) -> SynthSpec:
    """The synthetic data set's shape and seed from data.synth (a preset, scaled, overridden)."""
    s = cfg.data.synth
    overrides = {k: getattr(s, k) for k in ("n_train", "n_test", "n_features", "n_labels",
                                             "nnz_mean", "labels_mean") if getattr(s, k) is not None}
    for k in ("label_noise", "rare_features"):  # 0: the spec's own
        if getattr(s, k):
            overrides[k] = getattr(s, k)
    return preset(s.preset, scale=s.scale, seed=s.seed, **overrides)


def check_sources(cfg: Config, ranks: Optional[int] = None) -> Optional[int]:
    """The data errors a rank can see before MPI starts: an unknown synthetic preset, a missing
    file, a validation split that takes every row or none, and from XC files' headers (their
    first lines) a test file of another shape than the training file, a batch larger than the
    training rows, or fewer rows than `ranks` (the job's size where the launcher told it, else
    None).

    Returns:
        The rows that train, the validation split taken out (the window stream's, which
        --resume checks), where known without reading the data (synthetic, or a file with a
        header), else None.

    Raises:
        ConfigError: data.synth.preset is not a name of PRESETS; train.batch_size too large.
        DataError: data.train or data.test is not a file, or their headers disagree.
    """
    d = cfg.data
    if d.train == "synthetic":
        if d.synth.preset not in PRESETS:
            raise ConfigError(f"data.synth.preset: unknown preset {d.synth.preset!r}; "
                              f"known: {sorted(PRESETS)}")
        n = synth_spec(cfg).n_train
        held = cfg.data.validation_rows(n, SYNTHETIC)
        _check_ranks(n, ranks, SYNTHETIC)
        return n - held
    for key, path in (("data.train", d.train), ("data.test", d.test)):
        if not os.path.isfile(path):
            raise DataError(f"{path}: data file not found ({key})")
    head = read_header(d.train, fmt=d.format)
    if head is not None:
        read_header(d.test, fmt=d.format, n_features=head[1], n_labels=head[2])
        held = cfg.data.validation_rows(head[0], d.train)
        _check_ranks(head[0], ranks, d.train)
        _check_batch(cfg, head[0], d.train)
        return head[0] - held
    return None


def check_fits(cfg: Config, train_ds: Dataset, ranks: int) -> None:
    """Set-up errors that would otherwise surface as hangs or odd numbers mid-run."""
    n, src = train_ds.n_rows, train_ds.source or SYNTHETIC
    _check_ranks(n, ranks, src)
    _check_batch(cfg, n, src)


def _check_ranks(n: int, ranks: Optional[int], src: str) -> None:
    if ranks is not None and n < ranks:
        raise DataError(f"{src}: only {n} training rows for {ranks} ranks; run at most {n} ranks")


def _check_batch(cfg: Config, n: int, src: str) -> None:
    if cfg.train.batch_size > n:
        raise ConfigError(f"train.batch_size: {cfg.train.batch_size} is larger than the {n} "
                          f"training rows of {src}")


def _progress(what: str, active: bool, every_s: float = 10.0) -> Callable[[int, int], None]:
    """A progress callback (done, total) that prints at most every `every_s` seconds."""
    last = [time.perf_counter()]

    def say(done: int, total: int) -> None:
        if active and (time.perf_counter() - last[0] >= every_s or done == total) and total > 100_000:
            last[0] = time.perf_counter()
            print(f"{what}: {done:,} of {total:,} rows\n", end="", flush=True)
    return say
