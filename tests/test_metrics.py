"""P@k and nDCG@k against a slow, obviously correct version."""
import math

import numpy as np
import pytest

from hvd_adaptive.metrics import finalize, hits_matrix, metric_sums, most_frequent_label_p1


def slow_metrics(topk, labels):
    out = {}
    for k in (1, 3, 5):
        p = nd = 0.0
        for pred, truth in zip(topk, labels):
            hits = [1.0 if pred[j] in truth else 0.0 for j in range(k)]
            p += sum(hits) / k
            dcg = sum(h / math.log2(j + 2) for j, h in enumerate(hits))
            idcg = sum(1 / math.log2(j + 2) for j in range(min(k, len(truth))))
            nd += dcg / idcg if idcg > 0 else 0.0
        out[f"p_at_{k}"] = p / len(topk)
        out[f"ndcg_at_{k}"] = nd / len(topk)
    return out


def csr(labels):
    indptr = np.concatenate([[0], np.cumsum([len(l) for l in labels])]).astype(np.int64)
    indices = np.array([x for l in labels for x in l], dtype=np.int32)
    return indptr, indices


def test_hand_checked_case():
    topk = np.array([[3, 1, 2, 0, 4], [0, 1, 2, 3, 4]])
    labels = [[1, 7], []]
    m = finalize(metric_sums(topk, *csr(labels)))
    assert m["p_at_1"] == 0.0
    assert m["p_at_3"] == pytest.approx((1 / 3) / 2)
    # row 0: hit at position 1 -> DCG 1/log2(3); IDCG@3 = 1 + 1/log2(3)
    assert m["ndcg_at_3"] == pytest.approx((1 / math.log2(3)) / (1 + 1 / math.log2(3)) / 2)


@pytest.mark.parametrize("seed", range(5))
def test_matches_slow_version(seed):
    rng = np.random.default_rng(seed)
    n, L = 50, 12
    labels = [sorted(set(rng.integers(0, L, rng.integers(0, 6)).tolist())) for _ in range(n)]
    topk = np.array([rng.permutation(L)[:5] for _ in range(n)])
    fast = finalize(metric_sums(topk, *csr(labels)))
    slow = slow_metrics(topk, [set(l) for l in labels])
    for k, v in slow.items():
        assert fast[k] == pytest.approx(v, abs=1e-12), k


def test_hits_with_offset_indptr():
    # A CSR slice whose indptr does not start at 0 (a subset view) must still work.
    indptr = np.array([2, 3, 5], np.int64)
    indices = np.array([9, 9, 4, 1, 2], np.int32)
    h = hits_matrix(np.array([[4, 0], [2, 1]]), indptr, indices)
    assert h.tolist() == [[True, False], [True, True]]


def test_most_frequent_label_baseline():
    indptr, indices = csr([[0], [0, 2], [1], []])
    assert most_frequent_label_p1(np.array([5, 1, 1]), indptr, indices) == pytest.approx(0.5)
