"""P@k and nDCG@k against a slow, obviously correct version; all four metrics, PSP@k and
PSnDCG@k included, against napkinXC on random cases."""
import math

import numpy as np
import pytest

from hvd_adaptive.model.metrics import (METRIC_NAMES, finalize, hits_matrix, inverse_propensities, metric_sums,
                                  most_frequent_label_p1, sum_names)


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


def random_case(seed, n=80, n_labels=15, n_train=200):
    """Random predictions and labels (some rows without labels) and training frequencies."""
    rng = np.random.default_rng(seed)
    labels = [sorted(set(rng.integers(0, n_labels, rng.integers(0, 8)).tolist())) for _ in range(n)]
    topk = np.array([rng.permutation(n_labels)[:5] for _ in range(n)])
    # Skewed training frequencies, so propensities differ a lot between labels.
    train = [sorted(set(rng.zipf(1.5, rng.integers(1, 5)).clip(1, n_labels) - 1)) for _ in range(n_train)]
    return topk, labels, train


def test_inverse_propensities_formula():
    # N = 100 rows, A = 0.55, B = 1.5: C = (ln 100 - 1) * 2.5^0.55
    c = (math.log(100) - 1) * 2.5 ** 0.55
    ip = inverse_propensities(np.array([0, 1, 50]), 100)
    assert ip.tolist() == pytest.approx([1 + c * 1.5 ** -0.55, 1 + c * 2.5 ** -0.55, 1 + c * 51.5 ** -0.55])
    assert ip[0] > ip[1] > ip[2] > 1  # rarer labels weigh more
    assert inverse_propensities([3], 50, a=0.6, b=2.6)[0] == pytest.approx(
        1 + (math.log(50) - 1) * 3.6 ** 0.6 * 5.6 ** -0.6)


def test_propensity_scored_hand_checked_case():
    inv = np.array([1.0, 2.0, 3.0, 8.0, 1.0, 1.0])
    topk = np.array([[0, 3, 1, 4, 5], [0, 1, 2, 3, 4]])
    labels = [[1, 3], []]  # the second row adds nothing to either total
    m = finalize(metric_sums(topk, *csr(labels), inv_prop=inv))
    assert m["psp_at_1"] == 0.0  # label 0 is not a hit
    assert m["psp_at_3"] == pytest.approx(1.0)  # both labels within the top 3: the best possible
    # PSnDCG@3: gains 8 at position 1 and 2 at position 2, against 8 then 2 at positions 0 and 1
    dcg, ideal = 8 / math.log2(3) + 2 / math.log2(4), 8 + 2 / math.log2(3)
    assert m["psndcg_at_3"] == pytest.approx(dcg / ideal)
    assert m["p_at_3"] == pytest.approx((2 / 3) / 2)  # unchanged by inv_prop
    assert set(finalize(metric_sums(topk, *csr(labels)))) == set(METRIC_NAMES)  # no PS keys


@pytest.mark.parametrize("seed", range(4))
def test_matches_napkinxc(seed):
    from napkinxc import metrics as nx  # test dependency (launch/setup.sh)
    from scipy.sparse import csr_matrix

    topk, labels, train = random_case(seed)
    n_labels = 15
    t_ptr, t_idx = csr(train)
    y_train = csr_matrix((np.ones(len(t_idx)), t_idx, t_ptr), shape=(len(train), n_labels))
    inv = inverse_propensities(np.bincount(t_idx, minlength=n_labels), len(train))
    np.testing.assert_allclose(inv, nx.Jain_et_al_inverse_propensity(y_train), rtol=1e-12)

    mine = finalize(metric_sums(topk, *csr(labels), inv_prop=inv))
    pred = [[int(x) for x in row] for row in topk]
    theirs = {"p": nx.precision_at_k(labels, pred, k=5), "ndcg": nx.ndcg_at_k(labels, pred, k=5),
              "psp": nx.psprecision_at_k(labels, pred, inv, k=5),
              "psndcg": nx.psndcg_at_k(labels, pred, inv, k=5)}
    for name, values in theirs.items():
        for k in (1, 3, 5):
            assert mine[f"{name}_at_{k}"] == pytest.approx(values[k - 1], rel=1e-12, abs=1e-15), (name, k)


def test_sums_over_parts_equal_the_whole():
    # What distributed evaluation relies on: ranks sum their rows' sums, then finalize once.
    topk, labels, train = random_case(7)
    inv = inverse_propensities(np.bincount(csr(train)[1], minlength=15), len(train))
    whole = finalize(metric_sums(topk, *csr(labels), inv_prop=inv))
    parts = [metric_sums(topk[rows], *csr([labels[i] for i in rows]), inv_prop=inv)
             for rows in (np.arange(0, 80, 3), np.setdiff1d(np.arange(80), np.arange(0, 80, 3)))]
    assert list(parts[0]) == list(sum_names(propensity=True))
    summed = finalize({k: parts[0][k] + parts[1][k] for k in parts[0]})
    for k, v in whole.items():
        assert summed[k] == pytest.approx(v, rel=1e-12), k
