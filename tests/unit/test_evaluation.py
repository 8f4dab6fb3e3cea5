"""Blocked evaluation: a running top-k over label blocks equals ranking all labels at once."""
import numpy as np
import pytest
import tensorflow as tf

from hvd_adaptive.config import ModelConfig
from hvd_adaptive.data import make_batch, preset, synthesize
from hvd_adaptive.train.evaluation import Evaluator, plan_blocks
from hvd_adaptive.model.network import SparseMLP


def test_block_plan_respects_the_memory_bound():
    assert plan_blocks(670_091, 2048, 256) == 32768      # 2048 rows x 32768 x 4 B = 256 MB
    assert plan_blocks(100, 2048, 256) == 100             # small label spaces: one block
    assert plan_blocks(100, 10**9, 1) == 5                # never under k labels
    with pytest.raises(ValueError, match="eval_memory_mb"):
        plan_blocks(100, 10, 0)


@pytest.mark.parametrize("output", ["full", "sampled"])  # two layouts of the output layer
@pytest.mark.parametrize("memory_mb", [0.0008, 0.003, 64.0])
def test_blocked_top_k_equals_unblocked(memory_mb, output):
    train, test = synthesize(preset("eurlex4k", scale=0.05, seed=2, n_test=150))
    model = SparseMLP(train.n_features, train.n_labels,
                      ModelConfig(hidden=[16], init_seed=3, output=output, negatives=10))
    ev = Evaluator(model, memory_mb, chunk=64)
    if memory_mb < 1:
        assert ev.block < model.n_labels  # really blocked (several blocks, a ragged last one)
    rows = np.arange(test.n_rows)
    got = ev.top_labels(test, rows)
    b = make_batch(test, rows)
    z = model.logits(tf.constant(b.feat_ids), tf.constant(b.feat_vals), tf.constant(b.feat_seg),
                     tf.constant(b.size, tf.int32))
    want = tf.math.top_k(z, k=5).indices.numpy()
    np.testing.assert_array_equal(got, want)


def test_warm_up_traces_the_ranking_once_for_every_later_evaluation():
    # The trainer warms the evaluator up before a rank's CPU quota starts: tracing there, not
    # at the first evaluation under the quota (3 s of a sixteenth-core rank's run here).
    train, test = synthesize(preset("eurlex4k", scale=0.05, seed=2, n_test=150))
    model = SparseMLP(train.n_features, train.n_labels, ModelConfig(hidden=[16], init_seed=3))
    ev = Evaluator(model, 64.0, chunk=64)
    ev.warm_up(test)
    traced = [f.experimental_get_tracing_count() for f in (ev._hidden, ev._topk)]
    assert traced == [1, 1]
    ev.top_labels(test, np.arange(test.n_rows))  # several chunks, a ragged last one
    assert [f.experimental_get_tracing_count() for f in (ev._hidden, ev._topk)] == traced
