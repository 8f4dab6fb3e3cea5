"""Batch-size, learning-rate and merge-weight policies (pure functions, no MPI)."""
import numpy as np
import pytest

from hvd_adaptive.train import balance


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


# ---- balanced_partition: sync's proportional partition (LB-BSP) --------------------------------
# Rank i's step takes per_step[i] + per_row[i] * b_i; the split equalizes these. Each case
# below is worked by hand and differs from what the per-row costs alone would give.

def test_balanced_partition_per_step_cost_moves_rows_to_the_other_rank():
    # Equal per-row costs; rank 1 pays 20 s more a step. T = (100 + 0 + 20) / 2 = 60, so
    # b = (60 - 0, 60 - 20) = (60, 40): both steps take 60 s. Without the term: 50 / 50.
    assert balance.balanced_partition(100, np.array([1.0, 1.0]), np.array([0.0, 20.0])).tolist() == [60, 40]
    assert balance.balanced_partition(100, np.array([1.0, 1.0]), np.zeros(2)).tolist() == [50, 50]


def test_balanced_partition_per_step_cost_with_unequal_per_row_costs():
    # a = (1, 2), c = (10, 0), 90 rows: T = (90 + 10/1) / (1/1 + 1/2) = 66.67, b = (56.67, 33.33);
    # with the minimum of 1 row each the split is 1 + 88 x (0.6296, 0.3704) = (56.41, 33.59),
    # whose largest remainder takes the leftover row: (56, 34). The per-row costs alone give
    # T = 60, b = (60, 30).
    a = np.array([1.0, 2.0])
    assert balance.balanced_partition(90, a, np.array([10.0, 0.0])).tolist() == [56, 34]
    assert balance.balanced_partition(90, a, np.zeros(2)).tolist() == [60, 30]


def test_balanced_partition_a_step_cost_beyond_the_batch_leaves_the_minimum():
    # c = (0, 100) with 50 rows: T = (50 + 100) / 2 = 75, b = (75, -25); the negative share is
    # cut to 0 and rank 1 keeps the minimum of 8 rows: (42, 8).
    got = balance.balanced_partition(50, np.array([1.0, 1.0]), np.array([0.0, 100.0]), minimum=8)
    assert got.tolist() == [42, 8]


def test_balanced_partition_without_measurements_is_equal():
    # The first window has no costs yet (per-row 0): an equal split, whatever per_step says.
    got = balance.balanced_partition(10, np.zeros(3), np.array([5.0, 0.0, 0.0]))
    assert got.tolist() == [4, 3, 3] and got.sum() == 10


def test_deadband_keeps_the_split_until_a_share_moves_beyond_it():
    cur = np.array([256, 256])
    # a noisy measurement between equal ranks: 6 rows either way, within 12.8 (5% of 256)
    assert balance.keep_within_deadband(cur, np.array([250, 262]), 12.8).tolist() == [256, 256]
    # a real 1.25x difference: 284 / 228, 28 rows away: taken
    assert balance.keep_within_deadband(cur, np.array([284, 228]), 12.8).tolist() == [284, 228]
    # exactly at the band still counts as noise; no band takes every change
    assert balance.keep_within_deadband(cur, np.array([268, 244]), 12.0).tolist() == [256, 256]
    assert balance.keep_within_deadband(cur, np.array([257, 255]), 0.0).tolist() == [257, 255]


def test_auto_measures_both_modes_then_takes_the_better_goodput_and_probes_the_other():
    none = {"grad": None, "avg": None}
    assert balance.choose_mode(0, none, {}, 1.15, 6) == "grad"
    assert balance.choose_mode(1, {"grad": 100.0, "avg": None}, {"grad": 0}, 1.15, 6) == "avg"
    last = {"grad": 0, "avg": 1}
    # averaging 10% faster in rows/s does not pay for its 15% more rows: gradients
    assert balance.choose_mode(2, {"grad": 100.0, "avg": 110.0}, last, 1.15, 6) == "grad"
    # 20% faster does
    assert balance.choose_mode(2, {"grad": 100.0, "avg": 120.0}, last, 1.15, 6) == "avg"
    # the mode not chosen is probed after probe_every windows without it (windows 1-6 here)
    assert balance.choose_mode(6, {"grad": 100.0, "avg": 120.0}, {"grad": 0, "avg": 5}, 1.15, 6) == "avg"
    assert balance.choose_mode(7, {"grad": 100.0, "avg": 120.0}, {"grad": 0, "avg": 6}, 1.15, 6) == "grad"
    assert balance.choose_mode(8, {"grad": 100.0, "avg": 120.0}, {"grad": 7, "avg": 6}, 1.15, 6) == "avg"
    assert balance.choose_mode(9, {"grad": 100.0, "avg": 90.0}, {"grad": 8, "avg": 1}, 1.15, 6) == "avg"


def test_smoothed_costs_take_the_first_measurement_then_blend():
    # Nothing measured yet (all zero): the first window's costs as they are, not halved.
    assert balance.smoothed([0.0, 0.0], [2.0, 4.0], 0.5).tolist() == [2.0, 4.0]
    # Then keep x old + (1 - keep) x new: a quarter of the way with keep 0.75.
    assert balance.smoothed([2.0, 4.0], [6.0, 0.0], 0.75).tolist() == [3.0, 3.0]
    assert balance.smoothed([2.0, 4.0], [6.0, 0.0], 0.0).tolist() == [6.0, 0.0]
