"""CPU+GPU Hogbatch and Adaptive Hogbatch without ranks: the batch-size policy, the shares, the
workers' batches and threads, and their config checks."""
import numpy as np
import pytest

from hvd_adaptive.config import ConfigError, load_config, resolve
from hvd_adaptive.parallel.distributed import require_one_node
from hvd_adaptive.train.algorithms import worker_threads
from hvd_adaptive.train.algorithms.hogbatch import worker_batch
from hvd_adaptive.train.balance import adapt_batch, update_shares


def test_adapt_batch_keeps_batch_inside_the_dead_band():
    assert adapt_batch(64, [10.0, 11.5], 0, 0.1, 4, 512) == (64, False)  # 10 / 10.75 = 0.93
    assert adapt_batch(64, [10.0, 11.5], 1, 0.1, 4, 512) == (64, False)  # 11.5 / 10.75 = 1.07


def test_adapt_batch_grows_the_fast_and_shrinks_the_slow():
    rates = [30.0, 10.0]  # mean 20: the fast worker is at 1.5, the slow one at 0.5
    assert adapt_batch(64, rates, 0, 0.2, 4, 512) == (96, True)
    assert adapt_batch(64, rates, 1, 0.2, 4, 512) == (32, True)


def test_adapt_batch_hysteresis_settles_within_half_the_threshold():
    rates = [11.5, 10.0]  # 1.07 of the mean: inside a 0.1 band, outside half of it
    assert adapt_batch(64, rates, 0, 0.1, 4, 512, adjusting=False) == (64, False)
    assert adapt_batch(64, rates, 0, 0.1, 4, 512, adjusting=True) == (68, True)
    assert adapt_batch(64, [10.4, 10.0], 0, 0.1, 4, 512, adjusting=True) == (64, False)


def test_adapt_batch_respects_bounds_and_always_moves_outside_the_band():
    assert adapt_batch(400, [30.0, 10.0], 0, 0.2, 4, 512) == (512, True)
    assert adapt_batch(6, [30.0, 10.0], 1, 0.2, 4, 512) == (4, True)
    # 1.0 / 1.15 = 0.87 is outside a 0.1 band, but round(2 * 0.87) = 2: it still moves.
    assert adapt_batch(2, [1.0, 1.3], 0, 0.1, 1, 512) == (1, True)
    assert adapt_batch(2, [1.3, 1.0], 0, 0.1, 1, 512) == (3, True)


def test_adapt_batch_waits_for_two_known_rates():
    assert adapt_batch(64, [30.0, 0.0], 0, 0.2, 4, 512) == (64, False)
    assert adapt_batch(64, [0.0, 10.0], 0, 0.2, 4, 512) == (64, False)


@pytest.mark.parametrize("speeds", [[1.0, 4.0], [1.0, 2.0, 7.0], [3.0, 3.0, 1.0, 0.5]])
def test_one_simultaneous_step_balances_rates_proportional_to_speed_over_batch(speeds):
    # With rate_i = speed_i / b_i, every worker applying the rule at once equalizes the rates.
    speeds = np.array(speeds)
    b = np.full(len(speeds), 256)
    rates = speeds / b
    new = np.array([adapt_batch(int(b[i]), rates, i, 0.0, 1, 10**6)[0] for i in range(len(b))])
    after = speeds / new
    np.testing.assert_allclose(after, after.mean(), rtol=0.01)


def test_update_shares_and_cpu_share():
    shares, cpu = update_shares([30, 10, 60], [1, 2])
    np.testing.assert_allclose(shares, [0.3, 0.1, 0.6])
    assert cpu == pytest.approx(0.7)
    assert update_shares([0, 0], [])[1] is None


def test_worker_batch_defaults_and_config_errors():
    cfg, _ = load_config(None, ["train.batch_size=128", "hogbatch.cpu_ranks=[1]"])
    cfg = resolve(cfg, threads=1)  # as every run's config is before its algorithm is built
    assert worker_batch(cfg, 0) == ("gpu", 128, 16, 1024)
    assert worker_batch(cfg, 1) == ("cpu", 16, 16, 1024)
    for bad in ("hogbatch.cpu_ranks=[1, 1]", "hogbatch.threshold=-0.1", "hogbatch.cpu_batch=0",
                "hogbatch.b_max=2", "hogbatch.unknown=1"):
        with pytest.raises(ConfigError, match="hogbatch"):
            load_config(None, [bad])


def test_worker_threads_apply_to_cpu_workers_of_hogbatch_only():
    cfg, _ = load_config(None, ["train.algorithm=hogbatch", "train.threads=1", "hogbatch.cpu_ranks=[1]",
                                "hogbatch.cpu_threads=2"])
    assert (worker_threads(cfg, 0), worker_threads(cfg, 1)) == (1, 2)
    cfg, _ = load_config(None, ["train.algorithm=sync", "hogbatch.cpu_ranks=[1]", "hogbatch.cpu_threads=2"])
    assert worker_threads(cfg, 1) is None


def test_several_nodes_fail_clearly():
    require_one_node(3, 3)
    with pytest.raises(RuntimeError, match="one node's memory.*future work"):
        require_one_node(2, 4)


