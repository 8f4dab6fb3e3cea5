"""Ranking metrics of extreme classification: P@k and nDCG@k (k = 1, 3, 5), vectorized.

Definitions follow the Extreme Classification Repository: P@k = |top-k ∩ labels| / k;
nDCG@k = DCG@k / IDCG@k with DCG@k = sum_{j<k} hit_j / log2(j + 2) and IDCG@k the DCG of a
perfect ranking of min(k, |labels|) hits. Rows without labels score 0 on both and still count
in the mean (they cannot be predicted).
"""
from __future__ import annotations

import numpy as np

KS = (1, 3, 5)
METRIC_NAMES = tuple(f"{m}_at_{k}" for m in ("p", "ndcg") for k in KS)


def hits_matrix(topk: np.ndarray, label_indptr: np.ndarray, label_indices: np.ndarray) -> np.ndarray:
    """Boolean [rows, k]: whether topk[r, j] is one of row r's labels.

    Args:
        topk: int [rows, k] predicted label ids, best first.
        label_indptr, label_indices: the rows' labels in CSR form (rows aligned with topk).
    """
    n, k = topk.shape
    counts = np.diff(label_indptr)
    if n == 0:
        return np.zeros((0, k), bool)
    big = np.int64(max(int(topk.max(initial=0)), int(label_indices.max(initial=0))) + 1)
    rows = np.repeat(np.arange(n, dtype=np.int64), counts)
    truth = np.sort(rows * big + label_indices[label_indptr[0]:label_indptr[-1]].astype(np.int64))
    query = np.arange(n, dtype=np.int64)[:, None] * big + topk.astype(np.int64)
    pos = np.searchsorted(truth, query)
    pos = np.minimum(pos, max(len(truth) - 1, 0))
    return (truth[pos] == query) if len(truth) else np.zeros((n, k), bool)


def metric_sums(topk: np.ndarray, label_indptr: np.ndarray, label_indices: np.ndarray) -> dict:
    """Sums over rows of P@k and nDCG@k, plus the row count, ready to be reduced over ranks."""
    hits = hits_matrix(topk, label_indptr, label_indices).astype(np.float64)
    n_lab = np.diff(label_indptr)
    disc = 1.0 / np.log2(np.arange(2, topk.shape[1] + 2))
    cum_disc = np.concatenate([[0.0], np.cumsum(disc)])
    out = {"rows": float(len(topk))}
    for k in KS:
        out[f"p_at_{k}"] = float(hits[:, :k].sum() / k)
        dcg = (hits[:, :k] * disc[:k]).sum(axis=1)
        idcg = cum_disc[np.minimum(n_lab, k)]
        out[f"ndcg_at_{k}"] = float(np.divide(dcg, idcg, out=np.zeros_like(dcg), where=idcg > 0).sum())
    return out


def finalize(sums: dict) -> dict:
    """Turns (reduced) sums into means."""
    n = max(sums["rows"], 1.0)
    return {name: sums[name] / n for name in METRIC_NAMES}


def most_frequent_label_p1(train_freq: np.ndarray, label_indptr: np.ndarray,
                           label_indices: np.ndarray) -> float:
    """P@1 of always predicting the most frequent training label: the baseline to beat."""
    top = int(np.argmax(train_freq))
    rows = np.repeat(np.arange(len(label_indptr) - 1), np.diff(label_indptr))
    return float(len(np.unique(rows[label_indices[label_indptr[0]:label_indptr[-1]] == top]))
                 / max(len(label_indptr) - 1, 1))
