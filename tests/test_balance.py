"""Batch-size, learning-rate and merge-weight policies (pure functions, no MPI)."""
import numpy as np
import pytest

from hvd_adaptive import balance


def test_batch_shares():
    assert balance.batch_shares([3, 1]).tolist() == [0.75, 0.25]
    assert balance.batch_shares([0, 0]).tolist() == [0.5, 0.5]


def test_additive_rule_hand_checked():
    b = balance.additive_batch_sizes(np.array([256, 256]), np.array([0.6, 0.4]), 32, 32, 1024)
    assert b.tolist() == [288, 224]
    # bounds hold
    b = balance.additive_batch_sizes(np.array([1024, 32]), np.array([0.6, 0.4]), 32, 32, 1024)
    assert b.tolist() == [1024, 32]
    # fair shares change nothing
    b = balance.additive_batch_sizes(np.array([100, 200, 300]), np.full(3, 1 / 3), 32, 32, 1024)
    assert b.tolist() == [100, 200, 300]


def test_additive_rule_converges_to_equal_update_counts():
    # rank 1 is 2x slower: in a window of S rows, time per batch = b * cost_i.
    b = np.array([512, 512])
    cost = np.array([1.0, 2.0])
    for _ in range(200):
        rate = 1.0 / cost                       # rows per second
        batches = rate / b                      # batches per second
        p = balance.batch_shares(batches)
        b = balance.additive_batch_sizes(b, p, 32, 32, 1024)
    counts = (1.0 / cost) / b
    assert abs(counts[0] - counts[1]) / counts.max() < 0.15
    assert b[0] > b[1]


def test_proportional_rule():
    b = balance.proportional_batch_sizes(np.array([400, 400]), np.array([2 / 3, 1 / 3]), 32, 1024, 0.0)
    assert b.tolist() == [533, 267]
    b = balance.proportional_batch_sizes(np.array([400, 400]), np.array([2 / 3, 1 / 3]), 32, 1024, 0.5)
    assert b.tolist() == [467, 333]  # 0.5*400 + 0.5*533.3, 0.5*400 + 0.5*266.7


def test_learning_rates():
    assert balance.adaptive_lr(1.0, 512, 1024, 5, 0, 0.0) == 0.5
    assert balance.adaptive_lr(1.0, 1024, 1024, 3, 1, 0.5) == pytest.approx(0.5)
    assert balance.warmup_lr(1.0, 32, 1024, 0.0, 2.0) == pytest.approx(32 / 1024 / 100)
    assert balance.warmup_lr(1.0, 32, 1024, 2.0, 2.0) == pytest.approx(32 / 1024)


@pytest.mark.parametrize("seed", range(20))
def test_merge_weights_sum_to_one(seed):
    rng = np.random.default_rng(seed)
    p = balance.batch_shares(rng.integers(0, 10, size=rng.integers(1, 6)))
    for boost in (False, True):
        w = balance.merge_weights(p, boost, 0.1)
        assert w.sum() == pytest.approx(1.0) and (w >= 0).all()


def test_merge_weights_boost_direction():
    w = balance.merge_weights(np.array([0.6, 0.4]), True, 0.1)
    assert w[0] == pytest.approx(0.66 / 1.02)
    assert balance.merge_weights(np.array([0.6, 0.4]), False).tolist() == pytest.approx([0.6, 0.4])


def test_norm_trend():
    assert balance.norm_trend_flag("grow", 1.0, 2.0) and not balance.norm_trend_flag("grow", 2.0, 1.0)
    assert balance.norm_trend_flag("shrink", 2.0, 1.0)
    assert not balance.norm_trend_flag("off", 1.0, 2.0) and not balance.norm_trend_flag("grow", None, 2.0)


@pytest.mark.parametrize("seed", range(20))
def test_proportional_partition_invariants(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 6))
    total = int(rng.integers(8 * n, 5000))
    speeds = rng.uniform(0.1, 10, n)
    parts = balance.proportional_partition(total, speeds, 8)
    assert parts.sum() == total and (parts >= 8).all()
    fast, slow = int(np.argmax(speeds)), int(np.argmin(speeds))
    assert parts[fast] >= parts[slow]


def test_partition_too_small():
    with pytest.raises(ValueError, match="too small"):
        balance.proportional_partition(10, np.ones(4), 8)


def test_split_evenly():
    assert balance.split_evenly(10, 3).tolist() == [0, 3, 6, 10]
