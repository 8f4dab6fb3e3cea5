"""The label tree beside the network: napkinXC's probabilistic label tree (PLT) trained on the
run's own training rows (the validation split left out, as the network trains), measured on its
test rows with the project's metrics, so P@k and PSP@k compare exactly. The rows reach napkinXC
as files (its own reader); train_s times its fit alone, not the writing.

`hvd-adaptive trees --config FILE` runs it in one process (no MPI); napkinXC is a test
dependency (launch/setup.sh installs it), imported only here. Its defaults are napkinXC's
(hierarchical k-means tree of arity 2, 100 labels a leaf, liblinear logistic nodes); `threads`
is the cores the network's ranks have together on this machine unless told. `method="br"`
trains napkinXC's binary relevance instead: one liblinear logistic model a label, no tree,
slower to fit (46 s against 2.2 s at 7,390 labels here, 504 s against 21 s at 12,320) and
ahead of the tree on the real text measured (docs/accuracy.md, "Few labels of short text").
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Optional

import numpy as np

from hvd_adaptive.config import Config
from hvd_adaptive.data import load_data, split_validation, write_xc
from hvd_adaptive.model.metrics import finalize, inverse_propensities, metric_sums, sum_names

K = 5


def top_k(predicted: list, frequent: np.ndarray, k: int = K) -> np.ndarray:
    """napkinXC's predictions ([label, ...] or [(label, score), ...] a row) as an int [rows, k]
    array; a row with fewer than k labels is filled with the most frequent labels it lacks."""
    out = np.empty((len(predicted), k), np.int64)
    for r, row in enumerate(predicted):
        labels = [int(x[0]) if isinstance(x, (tuple, list)) else int(x) for x in row][:k]
        fill = (l for l in frequent if l not in labels)
        out[r] = labels + [int(next(fill)) for _ in range(k - len(labels))]
    return out


def run_napkinxc(cfg: Config, threads: Optional[int] = None, say=print, method: str = "plt") -> dict:
    """Trains napkinXC's PLT (or, `method` "br", its binary relevance) on the config's training
    rows and measures it on its test rows.

    Returns:
        {"method", "model", "train_s", "predict_s", "threads", "train_rows", "test_rows",
        "metrics"}: model is the napkinXC class that trained, train_s its fit alone (wall
        clock), metrics as the trainer's eval records.
    """
    from napkinxc.models import BR, PLT  # test dependency, needed only here

    kinds = {"plt": PLT, "br": BR}
    if method not in kinds:
        raise ValueError(f"trees: unknown method {method!r} (known: {', '.join(kinds)})")
    kind = kinds[method]

    train, test = load_data(cfg)  # one process, no job
    train, _ = split_validation(cfg, train)
    threads = threads or os.cpu_count() or 1
    freq = train.label_frequencies()
    say(f"trees: napkinXC {kind.__name__} on {train.n_rows:,} training rows, "
        f"{train.n_labels:,} labels, {threads} thread(s)")
    with tempfile.TemporaryDirectory(prefix="hvd-napkinxc-") as where:
        # Through files: napkinXC's fit on in-memory CSR rows ended in a segmentation fault
        # here on some runs and not on others with the same rows; its file reader never did.
        files = Path(where) / "train.txt", Path(where) / "test.txt"
        write_xc(files[0], train, header=False)
        write_xc(files[1], test, header=False)
        model = kind(str(Path(where) / "model"), threads=threads, seed=cfg.train.seed + 1)
        t0 = time.perf_counter()
        model.fit_on_file(str(files[0]))
        train_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        predicted = model.predict_for_file(str(files[1]), top_k=K)
        predict_s = time.perf_counter() - t0
    top = top_k(predicted, np.argsort(-freq, kind="stable")[:2 * K], min(K, train.n_labels))
    inv_prop = inverse_propensities(freq, train.n_rows, cfg.data.propensity_a, cfg.data.propensity_b)
    sums = metric_sums(top, np.asarray(test.label_indptr), np.asarray(test.label_indices), inv_prop)
    metrics = finalize({n: sums[n] for n in sum_names(True)})
    out = {"method": f"napkinxc-{method}", "model": type(model).__name__,
           "train_s": round(train_s, 3), "predict_s": round(predict_s, 3), "threads": threads, "train_rows": train.n_rows, "test_rows": test.n_rows,
           "metrics": {k: round(v, 5) for k, v in metrics.items()}}
    m = out["metrics"]
    say(f"trees: trained in {train_s:.1f} s; P@1 {m['p_at_1']:.4f} P@3 {m['p_at_3']:.4f} "
        f"P@5 {m['p_at_5']:.4f} | PSP@5 {m['psp_at_5']:.4f} on {test.n_rows:,} test rows")
    return out
