"""CPU+GPU Hogbatch and Adaptive Hogbatch: the batch-size policy, config, and real MPI ranks.

The multi-rank runs use configs/tiny.yaml with 1,000 labels and 256 hidden units, so an
update's cost grows with its batch: with tiny's own sizes the fixed cost of an update (about
100 rows' worth here) dominates, and since the simulated slowdown multiplies it too, the fast
rank would need batches near the bounds to slow down to the slow one's pace. Rank 1 is the slow
"CPU" worker (4x slowdown).
"""
import numpy as np
import pytest

from hvd_adaptive.config import ConfigError, load_config
from mpirun import mpirun, records, train_many

# ---- the pure policy ----------------------------------------------------------------------------
from hvd_adaptive.train.algorithms import worker_threads
from hvd_adaptive.train.algorithms.hogbatch import worker_batch
from hvd_adaptive.train.balance import adapt_batch, update_shares
from hvd_adaptive.parallel.distributed import require_one_node


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


# ---- real ranks ---------------------------------------------------------------------------------
HETERO = ("data.synth.n_labels=1000", "model.hidden=[256]", "hetero.slowdown={1: 4.0}",
          "hogbatch.cpu_ranks=[1]", "hogbatch.cpu_batch=64", "hogbatch.b_min=4", "hogbatch.b_max=1024")


def updates_late(run) -> np.ndarray:
    """Updates per rank, summed over the second half of the rounds."""
    rounds = records(run, "round")
    return np.array([[r["batches"] for r in rec["ranks"]] for rec in rounds[len(rounds) // 2:]]).sum(0)


THRESHOLD = 0.2
ADAPTIVE = ("train.algorithm=adaptive_hogbatch", *HETERO, f"hogbatch.threshold={THRESHOLD}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """hogbatch and adaptive_hogbatch, one after the other in one 2-rank job:
    {name: (run folder, summary)}."""
    root = tmp_path_factory.mktemp("hogbatch")
    sets = {"plain": ("train.algorithm=hogbatch", *HETERO), "adaptive": ADAPTIVE}
    summaries = train_many(2, {name: (root / name, s) for name, s in sets.items()})
    return {name: (root / name, summaries[name]) for name in sets}


@pytest.fixture(scope="module")
def plain(runs):
    return runs["plain"]


@pytest.mark.mpi
def test_hogbatch_async_workers_both_progress_learn_and_use_every_row_once(plain):
    run, s = plain
    st = s["algorithm_state"]
    assert st["kinds"] == ["gpu", "cpu"] and min(st["updates"]) > 0, st
    assert s["final"]["p_at_1"] > max(2 * s["baseline_p_at_1"], s["baseline_p_at_1"] + 0.15), s
    assert s["samples"] == sum(st["samples"]) == 10 * 2000  # tiny: 10 epochs of 2,000 rows
    rounds = records(run, "round")
    assert [r["samples"] for r in rounds][-1] == 10 * 2000
    assert sum(sum(x["batches"] for x in r["ranks"]) for r in rounds) == sum(st["updates"])
    assert 0 < st["cpu_update_share"] < 1 and all("cpu_update_share" in x for x in rounds[-1]["ranks"])
    assert max(st["skipped_nonfinite"]) == 0
    fp = np.array(s["replica_fingerprints"])  # every rank evaluated the same shared snapshot
    np.testing.assert_array_equal(fp[0], fp[1])


@pytest.fixture(scope="module")
def adaptive(runs):
    return runs["adaptive"]


@pytest.mark.mpi
def test_adaptive_hogbatch_resizes_by_its_rule(adaptive):
    """Every resizing decision a worker took (logged with the rates it read from the shared
    table) is balance.adapt_batch's for those figures, and each starts from the batch the
    worker's previous decision left."""
    run, _ = adaptive
    cfg, _ = load_config("configs/tiny.yaml", ADAPTIVE)
    seen = {"resized": 0, "kept": 0}
    for rank in (0, 1):
        _, b, b_min, b_max = worker_batch(cfg, rank)
        adjusting = False
        for rec in records(run, "round"):
            for d in rec["ranks"][rank]["decisions"]:
                assert (d["b"], d["adjusting"]) == (b, adjusting), (rank, rec["round"], d)
                want = adapt_batch(b, np.array(d["rates"]), rank, THRESHOLD, b_min, b_max, adjusting)
                assert (d["to"], d["then"]) == want, (rank, rec["round"], d, want)
                seen["resized" if d["to"] != b else "kept"] += 1
                b, adjusting = d["to"], d["then"]
            assert rec["ranks"][rank]["batch_size"] == b, (rank, rec["round"])
    assert all(seen.values()), seen  # both outcomes of the rule were exercised


@pytest.mark.mpi
def test_adaptive_hogbatch_balances_update_counts_plain_does_not(plain, adaptive):
    threshold = THRESHOLD
    run, s = adaptive
    plain_u, adapt_u = updates_late(plain[0]), updates_late(run)
    assert plain_u.max() / plain_u.min() > 2, plain_u
    assert np.abs(adapt_u / adapt_u.mean() - 1).max() <= threshold, adapt_u
    sizes = s["algorithm_state"]["batch_sizes"]
    assert sizes[0] > sizes[1], sizes  # the fast worker took the larger batch
    assert s["samples"] == 10 * 2000


@pytest.mark.mpi
def test_shared_model_survives_concurrent_updates():
    p = mpirun(3, ["tests/parallel/check_hogbatch.py"], timeout=240)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "hogbatch shared model ok on 3 ranks" in p.stdout
