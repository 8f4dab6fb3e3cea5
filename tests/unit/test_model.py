"""The sparse model: loss against numpy, gradient against finite differences, lazy updates."""
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from hvd_adaptive.config import SAMPLED_FROM_LABELS, ModelConfig, OptimConfig, model_for, output_for
from hvd_adaptive.data import Batch
from hvd_adaptive.train import tune
from hvd_adaptive.model.network import (Optimizer, RowMask, SparseMLP, TouchedRows, _subtract_rows,
                                        batch_tensors, row_sums, summed_rows)


def tiny_batch():
    # 3 rows over 6 features, 4 labels; row 2 has no labels; feature 1 appears twice.
    return Batch(feat_ids=np.array([0, 1, 1, 3, 5], np.int64),
                 feat_vals=np.array([1.0, 0.5, 2.0, 1.0, 0.3], np.float32),
                 feat_seg=np.array([0, 0, 1, 1, 2], np.int32),
                 label_ids=np.array([2, 0, 3], np.int32),
                 label_seg=np.array([0, 1, 1], np.int32),
                 label_w=np.array([1.0, 0.5, 0.5], np.float32), size=3)


def numpy_loss(model, b, smoothing=0.0):
    w = [v.numpy().astype(np.float64) for v in model.variables_list]
    x = np.zeros((b.size, model.n_features))
    np.add.at(x, (b.feat_seg, b.feat_ids), b.feat_vals)
    h = x @ w[0] + w[1]
    for i in range(2, len(w), 2):
        h = np.maximum(h, 0) @ w[i] + w[i + 1]
    lse = np.log(np.exp(h - h.max(1, keepdims=True)).sum(1)) + h.max(1)
    y = np.zeros_like(h)
    np.add.at(y, (b.label_seg, b.label_ids), b.label_w)
    has = y.sum(1)
    y = (1 - smoothing) * y + smoothing * has[:, None] / y.shape[1]  # labelled rows only
    return float(((has * lse) - (y * h).sum(1)).sum() / has.sum())


def test_loss_matches_numpy_and_skips_unlabelled_rows():
    m = SparseMLP(6, 4, ModelConfig(hidden=[5, 3], init_seed=3))
    b = tiny_batch()
    assert float(m.loss(*batch_tensors(b))) == pytest.approx(numpy_loss(m, b), rel=1e-5)


def test_label_smoothing_spreads_the_target_in_training_only():
    m = SparseMLP(6, 4, ModelConfig(hidden=[5], init_seed=3, label_smoothing=0.2))
    b = tiny_batch()
    smoothed = float(m.loss(*batch_tensors(b)))
    assert smoothed == pytest.approx(numpy_loss(m, b, smoothing=0.2), rel=1e-5)
    assert smoothed != pytest.approx(numpy_loss(m, b), rel=1e-3)
    # evaluation, and optim.lr auto's judge, see the plain target
    assert float(m.loss(*batch_tensors(b), training=False)) == pytest.approx(numpy_loss(m, b), rel=1e-5)
    assert float(m.loss_and_top(*batch_tensors(b), *tune.EVERY_LABEL)[0]) == pytest.approx(numpy_loss(m, b), rel=1e-5)


def farthest_of_draws(model, b, plain, draws=5):
    """The training loss's largest relative distance from `plain` over a few draws of the
    dropout mask: one draw lands within 0.1% of the plain loss about once in 250 at these small
    initial weights, five all at once practically never."""
    return max(abs(float(model.loss(*batch_tensors(b))) / plain - 1) for _ in range(draws))


def test_dropout_applies_in_training_from_model_dropout_after_on():
    tf.random.set_seed(11)
    b = tiny_batch()
    late = SparseMLP(6, 4, ModelConfig(hidden=[64], init_seed=3, dropout=0.5, dropout_after=2))
    plain = numpy_loss(late, b)
    assert float(late.loss(*batch_tensors(b))) == pytest.approx(plain, rel=1e-5)  # not yet
    assert not late.dropout_on(1.5)
    assert float(late.loss(*batch_tensors(b))) == pytest.approx(plain, rel=1e-5)
    assert late.dropout_on(2.0) and not late.dropout_on(3.0)  # switched once
    assert farthest_of_draws(late, b, plain) > 1e-3
    assert float(late.loss(*batch_tensors(b), training=False)) == pytest.approx(plain, rel=1e-5)
    first = SparseMLP(6, 4, ModelConfig(hidden=[64], init_seed=3, dropout=0.5))
    assert farthest_of_draws(first, b, plain) > 1e-3  # from the start
    assert not first.dropout_on(0.0)


@pytest.mark.parametrize("output", ["full", "sampled"])
def test_the_judge_scores_every_label_or_the_labels_given_with_their_corrections(output):
    """optim.lr auto's judge (`loss_and_top`): over every label, the loss and top labels of the
    whole softmax; over the labels given (tune.judge_labels), the softmax of those alone, their
    logits less the corrections, and the best label ids among them."""
    m = SparseMLP(6, 40, ModelConfig(hidden=[5], init_seed=3, output=output, negatives=8),
                  label_freq=np.ones(40, np.int64))
    b = tiny_batch()
    w = [v.numpy().astype(np.float64) for v in m.variables_list]
    x = np.zeros((b.size, 6))
    np.add.at(x, (b.feat_seg, b.feat_ids), b.feat_vals)
    z = np.maximum(x @ w[0] + w[1], 0) @ (w[2].T if output == "sampled" else w[2]) + w[3]

    def xent(z, label_ids):
        lse = np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1)
        picked = z[b.label_seg, label_ids]
        return float((lse[:2].sum() - (b.label_w * picked).sum()) / 2)  # row 2 has no labels

    every = m.loss_and_top(*batch_tensors(b), *tune.EVERY_LABEL)
    assert float(every[0]) == pytest.approx(xent(z, b.label_ids), rel=1e-5)
    np.testing.assert_array_equal(every[1].numpy(), np.argsort(-z, 1, kind="stable")[:, :5])
    labels = np.array([0, 2, 3, 9, 17, 25, 31, 39], np.int64)  # the rows' labels 0, 2, 3 and five
    corr = np.array([0, 0, 0, -1.5, -1.5, 0, -1.5, 0], np.float32)
    among = m.loss_and_top(*batch_tensors(b), labels, corr)
    sub = z[:, labels]
    assert float(among[0]) == pytest.approx(xent(sub - corr, np.searchsorted(labels, b.label_ids)),
                                            rel=1e-5)
    np.testing.assert_array_equal(among[1].numpy(), labels[np.argsort(-sub, 1, kind="stable")[:, :5]])
    assert float(among[0]) != pytest.approx(float(every[0]), rel=1e-3)


def test_gradient_is_row_sparse_and_matches_finite_differences():
    m = SparseMLP(6, 4, ModelConfig(hidden=[5], init_seed=4))
    b = tiny_batch()
    with tf.GradientTape() as tape:
        loss = m.loss(*batch_tensors(b))
    grads = tape.gradient(loss, m.variables_list)
    assert isinstance(grads[0], tf.IndexedSlices)      # input layer: only touched rows
    assert set(grads[0].indices.numpy().tolist()) == {0, 1, 3, 5}
    dense0 = tf.convert_to_tensor(grads[0]).numpy()
    eps = 1e-2
    for var, g in ((m.variables_list[0], dense0), (m.variables_list[2], grads[2].numpy())):
        for idx in [(0, 1), (1, 2), (3, 0), (2, 2)] if var.shape[0] == 6 else [(0, 0), (4, 3)]:
            old = var.numpy()
            bumped = old.copy(); bumped[idx] += eps; var.assign(bumped); up = numpy_loss(m, b)
            bumped[idx] -= 2 * eps; var.assign(bumped); down = numpy_loss(m, b)
            var.assign(old)
            assert g[idx] == pytest.approx((up - down) / (2 * eps), abs=2e-3), idx
    assert np.all(dense0[[2, 4]] == 0)                  # untouched rows have no gradient


def dense_rows(b, n_features):
    x = np.zeros((b.size, n_features))
    np.add.at(x, (b.feat_seg, b.feat_ids), b.feat_vals)
    return x


def test_a_linear_model_is_the_rows_times_one_weight_a_feature_and_label():
    m = SparseMLP(6, 4, ModelConfig(hidden=[], loss="softmax"))
    assert [v.shape.as_list() for v in m.variables_list] == [[6, 4], [4]]
    assert all(not v.numpy().any() for v in m.variables_list)  # from zero
    rng = np.random.default_rng(0)
    for v in m.variables_list:
        v.assign(rng.normal(size=v.shape).astype(np.float32))
    b = tiny_batch()
    x = dense_rows(b, 6)
    w, bias = (v.numpy().astype(np.float64) for v in m.variables_list)
    t = batch_tensors(b)
    z = m.logits(t[0], t[1], t[2], t[6]).numpy()
    np.testing.assert_allclose(z, x @ w + bias, rtol=1e-5)
    h = m.hidden(t[0], t[1], t[2], t[6])  # evaluation's input: the dense rows
    np.testing.assert_allclose(h.numpy(), x, rtol=1e-6)
    np.testing.assert_allclose(m.block_logits(h, 1, 3).numpy(), z[:, 1:3], rtol=1e-5)
    assert float(m.loss(*t)) == pytest.approx(numpy_loss_of_logits(x @ w + bias, b), rel=1e-5)
    with tf.GradientTape() as tape:
        loss = m.loss(*t)
    g = tape.gradient(loss, m.variables_list)[0]
    assert isinstance(g, tf.IndexedSlices)  # only the batch's feature rows
    assert set(g.indices.numpy().tolist()) == {0, 1, 3, 5}
    assert m.row_masks == [RowMask(TouchedRows.FEATURES), RowMask(TouchedRows.LABELS, sparse=False)]
    assert m.row_axes == [0, None]
    assert m.touched.numpy()[TouchedRows.FEATURES].nonzero()[0].tolist() == [0, 1, 3, 5]


def numpy_loss_of_logits(z, b):
    """The softmax loss of numpy_loss from logits `z`."""
    lse = np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1)
    y = np.zeros_like(z)
    np.add.at(y, (b.label_seg, b.label_ids), b.label_w)
    has = y.sum(1)
    return float(((has * lse) - (y * z).sum(1)).sum() / has.sum())


@pytest.mark.parametrize("hidden", [[], [5]])
def test_the_sigmoid_loss_is_every_labels_logistic_loss_averaged_over_the_rows(hidden):
    m = SparseMLP(6, 4, ModelConfig(hidden=hidden, loss="sigmoid", init_seed=2))
    rng = np.random.default_rng(1)
    m.variables_list[0].assign(rng.normal(size=m.variables_list[0].shape).astype(np.float32))
    b = tiny_batch()
    t = batch_tensors(b)
    z = m.logits(t[0], t[1], t[2], t[6]).numpy().astype(np.float64)
    y = np.zeros_like(z)
    y[b.label_seg, b.label_ids] = 1.0
    # every row counts, the unlabelled row 2 with every label negative
    want = (np.log1p(np.exp(-np.abs(z))) + np.maximum(z, 0) - y * z).sum() / b.size
    assert float(m.loss(*t)) == pytest.approx(want, rel=1e-5)
    assert float(m.loss(*t)) != pytest.approx(numpy_loss_of_logits(z, b), rel=1e-2)


def test_a_linear_model_larger_than_it_takes_is_a_clear_error():
    from hvd_adaptive.config import ConfigError
    from hvd_adaptive.config import LINEAR_MAX_WEIGHTS
    with pytest.raises(ConfigError, match=r"model.hidden: \[\] \(a linear model\) needs 65,536 features"):
        SparseMLP(2 ** 16, LINEAR_MAX_WEIGHTS // 2 ** 16 + 1, ModelConfig(hidden=[]))


@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "adagrad"])
def test_optimizers_lower_the_loss_and_update_lazily(name):
    m = SparseMLP(6, 4, ModelConfig(hidden=[5], init_seed=5))
    opt = Optimizer(m.variables_list, OptimConfig(name=name, lr=0.05, weight_decay=1e-4))
    b = batch_tensors(tiny_batch())
    untouched = m.variables_list[0].numpy()[[2, 4]].copy()
    first = float(m.loss(*b))
    for _ in range(30):
        with tf.GradientTape() as tape:
            loss = m.loss(*b)
        opt.apply(tape.gradient(loss, m.variables_list), m.variables_list)
    assert float(m.loss(*b)) < first
    np.testing.assert_array_equal(m.variables_list[0].numpy()[[2, 4]], untouched)


def test_same_seed_same_model():
    a = SparseMLP(10, 3, ModelConfig(hidden=[128], init_seed=9))
    b = SparseMLP(10, 3, ModelConfig(hidden=[128], init_seed=9))
    for x, y in zip(a.variables_list, b.variables_list):
        np.testing.assert_array_equal(x.numpy(), y.numpy())


@pytest.mark.parametrize("name", ["sgd", "momentum", "adagrad", "adagrad:acc"])
def test_fused_kernels_follow_the_update_formulas(name):
    """TensorFlow's kernels against the formulas in numpy, dense and row-sparse (duplicates
    summed); `adagrad:acc` starts its accumulators at optim.initial_accumulator."""
    rng = np.random.default_rng(3)
    name, _, acc = name.partition(":")
    start = 0.5 if acc else 0.0
    cfg = OptimConfig(name=name, lr=0.1, momentum=0.9, eps=1e-7, initial_accumulator=start)
    dense, table = tf.Variable(rng.normal(size=(3, 4)).astype(np.float32)), \
        tf.Variable(rng.normal(size=(6, 2)).astype(np.float32))
    opt = Optimizer([dense, table], cfg)
    want_d, want_t = dense.numpy().astype(np.float64), table.numpy().astype(np.float64)
    slot_d, slot_t = np.full_like(want_d, start), np.full_like(want_t, start)
    for _ in range(3):
        gd = rng.normal(size=(3, 4)).astype(np.float32)
        rows = np.array([4, 1, 4])  # row 4 twice: its two gradients are summed
        gt = rng.normal(size=(3, 2)).astype(np.float32)
        opt.apply([tf.constant(gd), tf.IndexedSlices(tf.constant(gt), tf.constant(rows, tf.int64),
                                                    tf.constant([6, 2], tf.int64))], [dense, table])
        summed = np.zeros_like(want_t)
        np.add.at(summed, rows, gt)
        for want, slot, g, touched in ((want_d, slot_d, gd, slice(None)),
                                       (want_t, slot_t, summed, [1, 4])):
            g = g[touched]
            if name == "sgd":
                want[touched] -= 0.1 * g
            elif name == "momentum":
                slot[touched] = 0.9 * slot[touched] + g
                want[touched] -= 0.1 * slot[touched]
            else:
                slot[touched] += g * g
                want[touched] -= 0.1 * g / (np.sqrt(slot[touched]) + 1e-7)
    np.testing.assert_allclose(dense.numpy(), want_d, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(table.numpy(), want_t, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("start", [0.0, 0.5])
def test_rowwise_adagrad_follows_its_formula_dense_and_row_sparse(start):
    """One accumulator per row (the mean of the row's squared gradient) on layers with rows,
    along axis 1 (the full softmax's [hidden x labels]) and axis 0 (row-sparse, duplicates
    summed); Adagrad's per-entry accumulator on a layer without rows; all of them start at
    optim.initial_accumulator."""
    rng = np.random.default_rng(5)
    out, table, bias = (tf.Variable(rng.normal(size=s).astype(np.float32)) for s in ((3, 4), (6, 2), (4,)))
    opt = Optimizer([out, table, bias], OptimConfig(name="rowwise_adagrad", lr=0.1, eps=1e-7,
                                                    initial_accumulator=start,
                                                    initial_accumulator_rows=True),
                    row_axes=[1, 0, None])
    assert [s[0].shape.as_list() for s in opt.slots] == [[1, 4], [6, 1], [4]]
    want = [x.numpy().astype(np.float64) for x in (out, table, bias)]
    acc = [np.full(s[0].shape, start) for s in opt.slots]
    for _ in range(3):
        go, gb = rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=4).astype(np.float32)
        rows = np.array([4, 1, 4])  # row 4 twice: its two gradients are summed first
        gt = rng.normal(size=(3, 2)).astype(np.float32)
        opt.apply([tf.constant(go), tf.IndexedSlices(tf.constant(gt), tf.constant(rows, tf.int64),
                                                    tf.constant([6, 2], tf.int64)), tf.constant(gb)],
                  [out, table, bias])
        summed = np.zeros((6, 2))
        np.add.at(summed, rows, gt)
        acc[0] += (go.astype(np.float64) ** 2).mean(axis=0, keepdims=True)
        want[0] -= 0.1 * go / (np.sqrt(acc[0]) + 1e-7)
        acc[1][[1, 4]] += (summed[[1, 4]] ** 2).mean(axis=1, keepdims=True)
        want[1][[1, 4]] -= 0.1 * summed[[1, 4]] / (np.sqrt(acc[1][[1, 4]]) + 1e-7)
        acc[2] += gb.astype(np.float64) ** 2
        want[2] -= 0.1 * gb / (np.sqrt(acc[2]) + 1e-7)
    for got, w, a, s in zip((out, table, bias), want, acc, opt.slots):
        np.testing.assert_allclose(got.numpy(), w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(s[0].numpy(), a, rtol=1e-5, atol=1e-7)


def test_row_writes_equal_scatter_subtract_to_the_bit_and_summed_rows_the_same_gradient():
    """The optimizer's row write (read, subtract, write back) on distinct rows gives what
    TensorFlow's scatter-subtract gives, bit for bit, and leaves the other rows alone; a
    gradient with its duplicated rows summed is the same gradient with distinct rows."""
    rng = np.random.default_rng(3)
    start = rng.normal(size=(50, 7)).astype(np.float32)
    rows = tf.constant(rng.permutation(50)[:20], tf.int64)
    step = tf.constant(rng.normal(size=(20, 7)).astype(np.float32) * 1e-3)
    ours, theirs = tf.Variable(start), tf.Variable(start)
    _subtract_rows(ours, rows, step)
    theirs.scatter_sub(tf.IndexedSlices(step, rows))
    assert np.array_equal(ours.numpy(), theirs.numpy())
    untouched = np.setdiff1d(np.arange(50), rows.numpy())
    assert np.array_equal(ours.numpy()[untouched], start[untouched])
    dup = tf.IndexedSlices(tf.constant(rng.normal(size=(6, 7)).astype(np.float32)),
                           tf.constant([3, 9, 3, 1, 9, 3], tf.int64), tf.constant([50, 7], tf.int64))
    s = summed_rows(dup)
    assert sorted(s.indices.numpy().tolist()) == [1, 3, 9]
    np.testing.assert_allclose(tf.convert_to_tensor(s).numpy(), tf.convert_to_tensor(dup).numpy(),
                               rtol=1e-6)


def test_row_sums_leave_rows_without_entries_at_zero_and_refuse_rows_out_of_order():
    """The input layer's sum of a row's non-zeros (sorted segment sum) equals the unsorted
    one, with rows without entries in the middle, at the end, and a batch without any."""
    x = tf.constant(np.arange(12, dtype=np.float32).reshape(6, 2))
    seg = tf.constant([0, 0, 2, 2, 2, 3], tf.int32)
    want = tf.math.unsorted_segment_sum(x, seg, 6).numpy()
    np.testing.assert_array_equal(row_sums(x, seg, tf.constant(6)).numpy(), want)
    assert row_sums(x[:0], seg[:0], tf.constant(3)).numpy().tolist() == [[0, 0]] * 3
    with pytest.raises(tf.errors.InvalidArgumentError):
        row_sums(x, tf.constant([0, 2, 0, 2, 2, 3], tf.int32), tf.constant(6))


def test_rowwise_adagrad_keeps_one_value_a_row_of_the_row_sparse_layers():
    """The input layer (and the sampled output layer) have one accumulator a row; the full
    softmax's dense output layer keeps Adagrad's, one a weight."""
    m = SparseMLP(30, 20, ModelConfig(hidden=[8, 6], init_seed=1))
    assert m.row_axes == [0, None, None, None, None, None]
    opt = Optimizer(m.variables_list, OptimConfig(name="rowwise_adagrad"), m.row_axes)
    assert [s[0].shape.as_list() for s in opt.slots] == [[30, 1], [8], [8, 6], [6], [6, 20], [20]]
    assert sampled_model().row_axes == [0, None, 0, None]
    with pytest.raises(ValueError, match="row axes"):
        Optimizer(m.variables_list, OptimConfig(name="rowwise_adagrad"))


# ---- sampled output layer -------------------------------------------------------------------

def sampled_model(n_labels=40, negatives=6, sampler="uniform", hidden=(5,), seed=4):
    cfg = ModelConfig(hidden=list(hidden), init_seed=seed, output="sampled", negatives=negatives,
                      sampler=sampler)
    freq = np.arange(n_labels, 0, -1)  # label 0 most frequent
    return SparseMLP(6, n_labels, cfg, label_freq=freq)


def test_sampled_loss_over_all_labels_equals_the_full_loss():
    m = sampled_model(n_labels=4, negatives=2)
    full = SparseMLP(6, 4, ModelConfig(hidden=[5], init_seed=4))
    b = tiny_batch()
    every = tf.range(4, dtype=tf.int64)
    got = m.candidate_loss(*batch_tensors(b)[:3], every, tf.zeros(4), tf.constant(b.label_ids),
                           tf.constant(b.label_seg), tf.constant(b.label_w), tf.constant(3))
    assert float(got) == pytest.approx(float(full.loss(*batch_tensors(b))), rel=1e-6)
    assert float(got) == pytest.approx(numpy_loss(full, b), rel=1e-5)


@pytest.mark.parametrize("sampler", ["uniform", "frequency"])
def test_candidates_hold_the_positives_first_and_the_negatives(sampler):
    m = sampled_model(n_labels=40, negatives=10, sampler=sampler)
    labels = tf.constant([7, 3, 7, 21], tf.int32)
    cand, corr, pos = m.candidates(labels)
    cand, corr, pos = cand.numpy(), corr.numpy(), pos.numpy()
    assert cand[:3].tolist() == [7, 3, 21] and len(set(cand.tolist())) == len(cand)
    assert cand[pos].tolist() == [7, 3, 7, 21]
    assert 4 <= len(cand) <= 3 + m.negatives.tries  # about 10 distinct negatives, some positives
    np.testing.assert_array_equal(corr[:3], 0.0)
    assert np.all(corr[3:] < 0)  # log of an expected count under 1


@pytest.mark.parametrize("sampler", ["uniform", "frequency"])
def test_the_negatives_are_drawn_as_their_corrections_say(sampler):
    """Negatives: `tries` draws with replacement from the proposal, kept once each, give
    model.negatives distinct labels on average, and each label is among them as often as its
    correction says (exp: the probability of being drawn at least once)."""
    m = sampled_model(n_labels=40, negatives=10, sampler=sampler)
    neg = m.negatives
    p_in = np.exp(neg.log_expected.numpy())
    # draws_for: 10 distinct expected; `tries`, a whole number of draws, moves it by under one
    assert abs(p_in.sum() - 10.0) < 0.3
    if sampler == "uniform":  # 1 - (1 - 1/40)^T = 10/40
        assert neg.tries == round(np.log(1 - 10 / 40) / np.log(1 - 1 / 40))
    else:  # TensorFlow's frequency proposal: (count + 1)^0.75 of the training counts 40 .. 1
        w = (np.arange(40, 0, -1) + 1.0) ** 0.75
        np.testing.assert_allclose(p_in, -np.expm1(neg.tries * np.log1p(-w / w.sum())), rtol=1e-5)
        assert p_in[0] == p_in.max() and p_in[-1] == p_in.min() and p_in[0] > 2 * p_in[-1]
    n = 4000
    seen = np.zeros(40)
    sizes = []
    for _ in range(n):
        labels, corr = neg.draw()
        labels = labels.numpy()
        assert len(set(labels.tolist())) == len(labels)
        np.testing.assert_allclose(corr.numpy(), np.log(p_in[labels]), rtol=1e-6)
        seen[labels] += 1
        sizes.append(len(labels))
    assert np.mean(sizes) == pytest.approx(p_in.sum(), abs=0.15)
    sd = np.sqrt(n * p_in * (1 - p_in))
    assert np.all(np.abs(seen - n * p_in) < 5 * sd), (seen / n, p_in)


def test_a_runs_negatives_are_fixed_by_its_seed_and_put_back_with_the_model():
    """The draws are stateless from (model.init_seed, a counter): the same seed and stream draw
    the same labels; another rank's stream or seed others; putting the counter back
    (tune.unchanged, as the rate probe does for each candidate) draws the same again."""
    from hvd_adaptive.train.tune import unchanged

    def draws(model, k=5):
        return [model.negatives.draw()[0].numpy().tolist() for _ in range(k)]

    cfg = ModelConfig(hidden=[5], init_seed=4, output="sampled", negatives=10)
    a, b = SparseMLP(6, 400, cfg), SparseMLP(6, 400, cfg)
    first = draws(a)
    assert first == draws(b)
    assert first != draws(SparseMLP(6, 400, cfg, stream=1))
    assert first != draws(SparseMLP(6, 400, dataclasses.replace(cfg, init_seed=5)))
    assert len({tuple(x) for x in first}) == 5  # each batch its own
    with unchanged(a.random_state()):
        again = draws(a)
    assert again == draws(a) and again != first  # put back: the next draws repeat
    assert SparseMLP(6, 4, ModelConfig(hidden=[5])).random_state() == []  # full softmax


def test_sampled_gradient_is_row_sparse_and_matches_finite_differences():
    m = sampled_model(n_labels=40, negatives=6)
    b = tiny_batch()
    t = batch_tensors(b)
    cand, corr, pos = m.candidates(tf.constant(b.label_ids))
    args = (*t[:3], cand, corr, pos, *t[4:])

    def loss():
        return float(m.candidate_loss(*args))

    with tf.GradientTape() as tape:
        value = m.candidate_loss(*args)
    grads = tape.gradient(value, m.variables_list)
    w_out, b_out = m.variables_list[-2], m.variables_list[-1]
    for g in grads[0], grads[-2], grads[-1]:
        assert isinstance(g, tf.IndexedSlices)
    assert set(grads[-2].indices.numpy().tolist()) == set(cand.numpy().tolist())
    eps = 1e-2
    for var, g, idx in ((w_out, tf.convert_to_tensor(grads[-2]).numpy(), (int(cand[0]), 1)),
                        (w_out, tf.convert_to_tensor(grads[-2]).numpy(), (int(cand[-1]), 3)),
                        (b_out, tf.convert_to_tensor(grads[-1]).numpy(), (int(cand[1]),))):
        old = var.numpy()
        bumped = old.copy(); bumped[idx] += eps; var.assign(bumped); up = loss()
        bumped[idx] -= 2 * eps; var.assign(bumped); down = loss()
        var.assign(old)
        assert g[idx] == pytest.approx((up - down) / (2 * eps), abs=2e-3), idx


def test_training_marks_the_rows_it_reaches():
    m = sampled_model(n_labels=40, negatives=6)
    b = tiny_batch()
    m.loss(*batch_tensors(b), training=False)
    assert not any(x.any() for x in m.touched.numpy())  # evaluation marks nothing
    m.loss(*batch_tensors(b), training=True)
    features, labels = m.touched.numpy()
    assert np.flatnonzero(features).tolist() == [0, 1, 3, 5]
    out = np.flatnonzero(labels)
    assert {0, 2, 3} <= set(out.tolist()) and len(out) <= 3 + 6
    m.touched.clear()
    assert not any(x.any() for x in m.touched.numpy())


def test_full_softmax_marks_the_positive_labels():
    # adaptive.label_norm normalizes exactly these labels' rows at the merge.
    b = tiny_batch()
    m = SparseMLP(8, 12, ModelConfig(hidden=[4]))
    m.loss(*batch_tensors(b), training=True)
    features, labels = m.touched.numpy()
    assert np.flatnonzero(features).tolist() == [0, 1, 3, 5]
    assert np.flatnonzero(labels).tolist() == sorted(set(b.label_ids.tolist()))


@pytest.mark.parametrize("output", ["full", "sampled"])
def test_each_row_masked_variable_has_a_touched_mask_of_its_rows(output):
    # The merge gathers or normalizes a variable's rows by the mask row_masks names, along its
    # axis: the mask must be as long as the variable has rows there. Only the input layer and
    # the output layer with its bias have one; the output's are sparse only when sampled (the
    # full softmax changes every label's row every step).
    m = SparseMLP(7, 11, ModelConfig(hidden=[4, 3], output=output, negatives=5))
    masks = m.row_masks
    assert len(masks) == len(m.variables_list) == 6
    assert masks[0] == RowMask(TouchedRows.FEATURES) and masks[1:4] == [None] * 3
    sampled = output == "sampled"
    assert [(rm.mask, rm.sparse) for rm in masks[4:]] == [(TouchedRows.LABELS, sampled)] * 2
    for v, rm in zip(m.variables_list, masks):
        if rm is not None:
            assert v.shape[rm.axis] == m.touched.sizes[rm.mask] == (7, 11)[rm.mask]


def test_more_negatives_than_labels_is_a_clear_error():
    from hvd_adaptive.config import ConfigError
    with pytest.raises(ConfigError, match="model.negatives: 40 negatives"):
        sampled_model(n_labels=40, negatives=40)


def test_weight_stats_reads_variables_in_slices_and_matches_numpy():
    # trainer.weight_stats: the eval record's weight_norm and the non-finite guard, read
    # NORM_ROWS rows at a time; every slice counts, the last partial one too.
    from hvd_adaptive.train.trainer import NORM_ROWS, weight_stats

    rng = np.random.default_rng(0)
    big = rng.normal(size=(2 * NORM_ROWS + 7, 3)).astype(np.float32)
    small = rng.normal(size=(5,)).astype(np.float32)
    variables = [tf.Variable(big), tf.Variable(small)]
    finite, norm = weight_stats(variables)
    want = np.sqrt((big.astype(np.float64) ** 2).sum() + (small.astype(np.float64) ** 2).sum())
    assert finite and norm == pytest.approx(want, rel=1e-6)
    variables[0].scatter_update(tf.IndexedSlices(tf.constant([[np.inf, 0, 0]], tf.float32), [2 * NORM_ROWS + 6]))
    assert not weight_stats(variables)[0]  # an inf in the last slice's last row


@pytest.mark.parametrize("n_labels, smoothing, output", [
    (SAMPLED_FROM_LABELS - 1, 0.0, "full"), (SAMPLED_FROM_LABELS, 0.0, "sampled"),
    (SAMPLED_FROM_LABELS, 0.1, "full")])  # label smoothing spreads over every label: full only
def test_output_auto_takes_the_sampled_loss_from_its_label_count(n_labels, smoothing, output):
    cfg = ModelConfig(hidden=[2], label_smoothing=smoothing)  # output auto, the default
    chosen = output_for(cfg, n_labels)
    assert chosen.output == output
    assert chosen.sampler == ("frequency" if output == "sampled" else cfg.sampler)
    m = SparseMLP(3, n_labels, cfg, label_freq=np.ones(n_labels))
    assert m.sampled == (output == "sampled")
    # the sampled loss gathers output rows: its output layer is stored [labels x hidden]
    assert m.layers[-1].shape.as_list() == ([n_labels, 2] if m.sampled else [2, n_labels])
    for pinned in ("full", "sampled"):  # a pinned loss is used as given
        assert output_for(ModelConfig(output=pinned), n_labels).output == pinned
    # a linear model and the sigmoid loss read every label: auto is full for them
    assert output_for(ModelConfig(hidden=[]), n_labels).output == "full"
    assert model_for(ModelConfig(hidden=[2], loss="sigmoid"), 3, n_labels, 1.0).output == "full"


def test_hidden_auto_takes_the_linear_model_where_its_weights_fit_on_sparse_rows():
    """model.hidden auto (the default): a linear model with the sigmoid loss up to
    LINEAR_MAX_WEIGHTS features x labels on rows of up to LINEAR_MAX_NNZ non-zeros in mean; the
    128-unit network with the softmax above either, or where dropout, label smoothing, a sampled
    output or the softmax is set; pinned values stay; the choice is said in the log's words and
    is stable (a resolved model resolves to itself); the model is built only once chosen."""
    from hvd_adaptive.config import LINEAR_MAX_NNZ, LINEAR_MAX_WEIGHTS, linear_refused, model_lines

    side = int(LINEAR_MAX_WEIGHTS ** 0.5)  # 16,384 features x 16,384 labels fit exactly
    auto, nnz = ModelConfig(), 8.0  # npm's words a row
    assert auto.hidden == "auto" and auto.loss == "auto"
    fits = model_for(auto, side, side, LINEAR_MAX_NNZ)  # both limits, exactly
    assert (fits.hidden, fits.loss, fits.output) == ([], "sigmoid", "full")
    assert fits.linear and model_for(fits, side, side, LINEAR_MAX_NNZ) == fits
    big = model_for(auto, side, side + 1, nnz)
    assert (big.hidden, big.loss, big.output) == ([128], "softmax", "sampled")  # 16,385 labels
    assert model_for(big, side, side + 1, nnz) == big
    dense = model_for(auto, 5_000, 3_993, LINEAR_MAX_NNZ + 0.1)  # the EURLex shape has 236
    assert (dense.hidden, dense.loss, dense.output) == ([128], "softmax", "full")
    for asks in (dict(dropout=0.2), dict(label_smoothing=0.1), dict(output="sampled"),
                 dict(loss="softmax")):
        chosen = model_for(ModelConfig(**asks), 100, 10, nnz)
        assert linear_refused(ModelConfig(**asks), 100, 10, nnz) is not None, asks
        assert (chosen.hidden, chosen.loss) == ([128], "softmax"), asks
    assert model_for(ModelConfig(loss="sigmoid"), 100, 10, nnz).hidden == []
    assert model_for(ModelConfig(hidden=[64]), 100, 10, nnz).hidden == [64]  # pinned
    assert model_for(ModelConfig(hidden=[]), side, side + 1, 300.0).hidden == []  # (SparseMLP refuses it)
    assert model_for(ModelConfig(hidden=[64]), 100, 10, nnz).loss == "softmax"
    assert model_for(ModelConfig(hidden=[]), 100, 10, 300.0).loss == "sigmoid"
    with pytest.raises(ValueError, match="model_for"):
        auto.linear  # unresolved: no part may guess
    with pytest.raises(ValueError, match="model_for"):
        SparseMLP(6, 4, auto)
    with pytest.raises(ValueError, match="nnz_a_row"):
        model_for(auto, 6, 4)  # auto reads the rows
    assert model_lines(auto, fits, side, side, LINEAR_MAX_NNZ) == [
        f"model.hidden auto: [] (a linear model: 16,384 features x 16,384 labels = "
        f"{side * side:,} weights, at most {LINEAR_MAX_WEIGHTS:,}; rows of 16.0 non-zeros in "
        "mean, at most 16)", "model.loss auto: sigmoid", "model.output auto: full for 16384 labels"]
    assert model_lines(auto, big, side, side + 1, nnz)[0].startswith(
        f"model.hidden auto: [128] (a linear model would need 16,384 features x 16,385 labels")
    assert model_lines(auto, dense, 5_000, 3_993, 236.0)[0] == (
        "model.hidden auto: [128] (rows of 236.0 non-zeros in mean: a linear model would read "
        "every label's weights of more than 16 a row)")
    assert model_lines(ModelConfig(dropout=0.2), model_for(ModelConfig(dropout=0.2), 100, 10, nnz),
                       100, 10, nnz)[0] == ("model.hidden auto: [128] (the model's settings ask "
                                            "for a hidden layer or a softmax)")
    assert model_lines(fits, fits, side, side, nnz) == []
    m = SparseMLP(6, 4, model_for(auto, 6, 4, nnz))
    assert m.linear and m.sigmoid and [v.shape.as_list() for v in m.variables_list] == [[6, 4], [4]]


def test_the_shipped_workloads_resolve_the_model_their_tables_were_measured_at():
    """configs/default.yaml and bench_quick.yaml (13,402 labels) train the 128-unit network
    with the full softmax under model.hidden and output auto, as their benchmark and accuracy
    tables were measured; configs/bench.yaml (67,009 labels) the network with the sampled loss,
    as its tables were measured. Their 135,909 features x those labels are more weights than a
    linear model takes."""
    from hvd_adaptive.config import load_config
    from hvd_adaptive.data import preset

    for name, scale, output in (("default", 0.02, "full"), ("bench_quick", 0.02, "full"),
                                ("bench", 0.1, "sampled")):
        cfg = load_config(f"configs/{name}.yaml")[0]
        spec = preset("amazon670k", scale=scale)
        chosen = model_for(cfg.model, spec.n_features, spec.n_labels, spec.nnz_mean)
        assert (chosen.hidden, chosen.loss, chosen.output) == ([128], "softmax", output), name
    default = load_config("configs/default.yaml")[0].model
    assert model_for(default, 135_909, 67_009, 76.0).output == "sampled"
    # ... and from 20,103 labels on, where it took 0.75-0.77 of the full softmax's time
    # (docs/scale.md, "Fewer labels")
    assert model_for(default, 135_909, 20_103, 76.0).output == "sampled"


@pytest.mark.parametrize("name", ["adagrad", "rowwise_adagrad"])
@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("rows", [True, False, "auto", 0.25])
@pytest.mark.parametrize("linear", [False, True])
def test_the_row_sparse_layers_start_where_initial_accumulator_rows_says(name, sampled, rows,
                                                                         linear):
    """optim.initial_accumulator starts every Adagrad state but the row-sparse layers' (the
    input layer or a linear model's weights; the sampled output layer), which start at 0 under
    optim.initial_accumulator_rows false, at the start under true, at a number given, and under
    auto at LINEAR_ROWS_START for a linear model and at 0 for a network, in the project's
    optimizer and in the plain Horovod script's alike."""
    from hvd_adaptive.bench import plain_horovod
    from hvd_adaptive.config import LINEAR_ROWS_START

    rng = np.random.default_rng(7)
    table, hidden, out, bias = (tf.Variable(rng.normal(size=s).astype(np.float32))
                                for s in ((6, 3), (3, 3), (3, 5) if not sampled else (5, 3), (5,)))
    variables = [table, hidden, out, bias]
    cfg = OptimConfig(name=name, lr=0.1, initial_accumulator=0.5, initial_accumulator_rows=rows)
    row_sparse = [True, False, sampled, False]
    opt = Optimizer(variables, cfg, row_axes=[0 if r else None for r in row_sparse], linear=linear)
    rows_at = {True: 0.5, False: 0.0, "auto": LINEAR_ROWS_START if linear else 0.0, 0.25: 0.25}
    want = [float(np.float32(rows_at[rows] if r else 0.5)) for r in row_sparse]
    assert [float(np.unique(s[0].numpy())[0]) for s in opt.slots] == want
    plain = plain_horovod.Optimizer(cfg, variables, (0, 2) if sampled else (0,), linear=linear)
    assert [float(np.unique(s.numpy())[0]) for s in plain.slots] == want


def test_a_linear_models_weights_start_above_zero_by_default():
    """configs/npm.yaml (model.hidden auto: a linear model at npm's 6,183 features x 7,390
    labels; optim.initial_accumulator_rows auto): the weights' accumulators start at
    LINEAR_ROWS_START, so a feature seen in a row or two does not take a step of about lr towards
    its labels; the bias's at optim.initial_accumulator. (The plain Horovod script's start
    equals the project's: mpi/test_horovod_reference.py.)"""
    from hvd_adaptive.config import LINEAR_ROWS_START, load_config

    cfg = load_config("configs/npm.yaml", [])[0]
    assert cfg.optim.initial_accumulator_rows == "auto"
    chosen = model_for(cfg.model, 6_183, 7_390, 8.0)
    assert (chosen.hidden, chosen.loss) == ([], "sigmoid")
    model = SparseMLP(50, 40, chosen)
    assert model.linear and model.row_axes == [0, None]
    want = [float(np.float32(LINEAR_ROWS_START)), float(np.float32(cfg.optim.initial_accumulator))]
    assert want[0] > want[1] > 0
    opt = Optimizer.for_model(model, cfg.optim)
    assert [float(np.unique(s[0].numpy())[0]) for s in opt.slots] == want


def test_the_default_config_starts_every_layer_but_the_input_layer_above_zero():
    """configs/default.yaml (row-wise Adagrad, the full softmax at 13,402 labels): the input
    layer's accumulators start at 0, so its first steps are about lr as the rate's rule assumes;
    the hidden and output layers' and the biases' at optim.initial_accumulator, above 0, so the
    tiny gradients of every negative label's output weights take small first steps."""
    from hvd_adaptive.config import load_config

    cfg = load_config("configs/default.yaml", [])[0]
    chosen = model_for(cfg.model, 135_909, 13_402, 76.0)  # its data's shape
    assert chosen.hidden == [128]
    model = SparseMLP(50, 40, chosen)
    opt = Optimizer.for_model(model, cfg.optim)
    starts = [float(np.unique(s[0].numpy())[0]) for s in opt.slots]
    start = float(np.float32(cfg.optim.initial_accumulator))  # the slots are float32
    assert start > 0
    assert starts == [0.0 if axis is not None else start for axis in model.row_axes]
    assert starts[0] == 0.0 and model.row_axes[0] == 0  # the input layer
