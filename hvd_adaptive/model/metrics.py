"""Ranking metrics of extreme classification, vectorized: P@k, nDCG@k and, given inverse
propensities, the propensity-scored PSP@k and PSnDCG@k (k = 1, 3, 5).

Definitions follow the Extreme Classification Repository: P@k = |top-k ∩ labels| / k;
nDCG@k = DCG@k / IDCG@k with DCG@k = sum_{j<k} hit_j / log2(j + 2) and IDCG@k the DCG of a
perfect ranking of min(k, |labels|) hits. Rows without labels score 0 on both and still count
in the mean (they cannot be predicted).

Propensity-scored metrics (Jain et al. 2016), as the XC repository and napkinXC define them:
a hit on label l gains its inverse propensity ip_l instead of 1, and the total over all rows is
divided by the total of the best achievable gains (each row's labels ranked by ip, highest
first), so 1.0 means every row's top k holds its rarest labels. PSP@k is
sum_rows sum_{j<k} hit_j ip_{top_j} / sum_rows sum_{j<min(k,|labels|)} ip_(j) (the 1/k of
both cancels); PSnDCG@k uses the same ratio of sums, with each row's gains discounted by
1 / log2(j + 2) and divided by its IDCG@k. A ratio of sums, not a mean of per-row ratios:
rows without labels add 0 to both totals.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np

KS = (1, 3, 5)
METRIC_NAMES = tuple(f"{m}_at_{k}" for m in ("p", "ndcg") for k in KS)
PS_METRIC_NAMES = tuple(f"{m}_at_{k}" for m in ("psp", "psndcg") for k in KS)
# The denominators of the propensity-scored metrics: totals of the best achievable gains.
PS_IDEAL_NAMES = tuple(f"{name}_ideal" for name in PS_METRIC_NAMES)


def sum_names(propensity: bool = False) -> tuple[str, ...]:
    """Keys of `metric_sums`' result, in a fixed order (what ranks reduce, element by element)."""
    return ("rows", *METRIC_NAMES, *((*PS_METRIC_NAMES, *PS_IDEAL_NAMES) if propensity else ()))


def inverse_propensities(label_freq: np.ndarray, n_rows: int, a: float = 0.55,
                         b: float = 1.5) -> np.ndarray:
    """Jain et al. (2016) inverse propensity of every label: 1 + C (N_l + B)^(-A).

    Args:
        label_freq: N_l, how many training rows carry each label.
        n_rows: N, the number of training rows; C = (ln N - 1)(B + 1)^A.
        a, b: A and B. The defaults are the paper's general ones; it uses A=0.6, B=2.6 for
            Amazon data sets and A=0.5, B=0.4 for Wikipedia ones.

    Returns:
        float64 array of the labels' inverse propensities (rarer labels weigh more).
    """
    if n_rows < 1:
        raise ValueError(f"n_rows must be positive, got {n_rows}")
    freq = np.asarray(label_freq, dtype=np.float64)
    c = (math.log(n_rows) - 1.0) * (b + 1.0) ** a
    return 1.0 + c * (freq + b) ** (-a)


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


def best_gains(label_indptr: np.ndarray, label_indices: np.ndarray, inv_prop: np.ndarray,
               k: int) -> np.ndarray:
    """float64 [rows, k]: each row's labels' inverse propensities, highest first, 0-padded.

    The gains of the best possible top-k ranking of the row, the denominator of PSP@k.
    """
    n = len(label_indptr) - 1
    counts = np.diff(label_indptr)
    rows = np.repeat(np.arange(n, dtype=np.int64), counts)
    gains = inv_prop[label_indices[label_indptr[0]:label_indptr[-1]]]
    order = np.lexsort((-gains, rows))  # by row, then by gain descending
    rank = np.arange(len(order)) - np.repeat(label_indptr[:-1] - label_indptr[0], counts)
    out = np.zeros((n, k))
    keep = rank < k
    out[rows[order][keep], rank[keep]] = gains[order][keep]
    return out


def metric_sums(topk: np.ndarray, label_indptr: np.ndarray, label_indices: np.ndarray,
                inv_prop: Optional[np.ndarray] = None) -> dict:
    """Sums over rows, ready to be reduced over ranks (then `finalize`).

    Args:
        topk: int [rows, k] predicted label ids, best first.
        label_indptr, label_indices: the rows' labels in CSR form.
        inv_prop: the labels' inverse propensities (`inverse_propensities`); when given, the
            sums of PSP@k and PSnDCG@k and their ideal totals are added.

    Returns:
        {name: float} with the keys of `sum_names(inv_prop is not None)`.
    """
    hits = hits_matrix(topk, label_indptr, label_indices).astype(np.float64)
    n_lab = np.diff(label_indptr)
    disc = 1.0 / np.log2(np.arange(2, topk.shape[1] + 2))
    cum_disc = np.concatenate([[0.0], np.cumsum(1.0 / np.log2(np.arange(2, max(KS) + 2)))])
    out = {"rows": float(len(topk))}
    idcg = {k: cum_disc[np.minimum(n_lab, k)] for k in KS}
    for k in KS:
        out[f"p_at_{k}"] = float(hits[:, :k].sum() / k)
        dcg = (hits[:, :k] * disc[:k]).sum(axis=1)
        out[f"ndcg_at_{k}"] = float(_safe_div(dcg, idcg[k]).sum())
    if inv_prop is None:
        return {name: out[name] for name in sum_names()}
    inv_prop = np.asarray(inv_prop, dtype=np.float64)
    gain = hits * inv_prop[topk]
    best = best_gains(label_indptr, label_indices, inv_prop, max(KS))
    best_disc = 1.0 / np.log2(np.arange(2, max(KS) + 2))
    for k in KS:
        out[f"psp_at_{k}"] = float(gain[:, :k].sum() / k)
        out[f"psp_at_{k}_ideal"] = float(best[:, :k].sum() / k)
        out[f"psndcg_at_{k}"] = float(_safe_div((gain[:, :k] * disc[:k]).sum(axis=1), idcg[k]).sum())
        out[f"psndcg_at_{k}_ideal"] = float(
            _safe_div((best[:, :k] * best_disc[:k]).sum(axis=1), idcg[k]).sum())
    return {name: out[name] for name in sum_names(propensity=True)}


def _safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    return np.divide(num, den, out=np.zeros_like(num, dtype=np.float64), where=den > 0)


def finalize(sums: dict) -> dict:
    """Turns (reduced) sums into the metrics: means over rows; PSP and PSnDCG (when the sums
    have them) as totals over ideal totals (0 when no row has a label)."""
    n = max(sums["rows"], 1.0)
    out = {name: sums[name] / n for name in METRIC_NAMES}
    if PS_METRIC_NAMES[0] in sums:
        for name in PS_METRIC_NAMES:
            ideal = sums[f"{name}_ideal"]
            out[name] = sums[name] / ideal if ideal > 0 else 0.0
    return out


def most_frequent_label_p1(train_freq: np.ndarray, label_indptr: np.ndarray,
                           label_indices: np.ndarray) -> float:
    """P@1 of always predicting the most frequent training label: the baseline to beat."""
    top = int(np.argmax(train_freq))
    rows = np.repeat(np.arange(len(label_indptr) - 1), np.diff(label_indptr))
    return float(len(np.unique(rows[label_indices[label_indptr[0]:label_indptr[-1]] == top]))
                 / max(len(label_indptr) - 1, 1))
