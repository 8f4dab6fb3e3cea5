"""Horovod synchronous SGD on 2 real MPI ranks, through the real CLI."""
import numpy as np
import pytest

from tests.harness.mpirun import explain, mpirun, records


def test_sync_two_ranks_learns_and_keeps_replicas_identical(sync_reference):
    run, s = sync_reference
    assert s["ranks"] == 2
    # well above always predicting the most frequent label
    assert s["final"]["p_at_1"] > max(2 * s["baseline_p_at_1"], s["baseline_p_at_1"] + 0.15), s
    fp = np.array(s["replica_fingerprints"])
    np.testing.assert_allclose(fp[0], fp[1], rtol=1e-6)
    evals = records(run, "eval")
    assert len(evals) >= 4
    for e in evals:
        for key in ("wall_s", "epoch", "samples", "p_at_1", "p_at_3", "p_at_5", "ndcg_at_5"):
            assert key in e
    assert evals[-1]["p_at_1"] > evals[0]["p_at_1"] + 0.05, [e["p_at_1"] for e in evals]
    # every training row once per epoch: 10 epochs of 2000 rows
    assert records(run, "round")[-1]["samples"] == 10 * 2000
    assert (run / "config.json").is_file()


CASES = [("equal", "sgd"), ("timed", "sgd"), ("proportional", "sgd"), ("sharded", "adagrad"),
         ("sharded", "rowwise_adagrad")]


@pytest.fixture(scope="module")
def equivalence():
    """sync_ranks.py's cases, one after another in one 2-rank job."""
    return mpirun(2, ["tests/mpi/ranks/sync_ranks.py", *(f"{p}:{o}" for p, o in CASES)],
                  timeout=300)


@pytest.mark.parametrize("partition,optimizer", CASES)
def test_sync_equals_one_process_sgd_and_distributed_eval_equals_one_process(equivalence, partition,
                                                                            optimizer):
    """Sync's fused step (the default) and its timed step both equal one process, and only the
    timed one counts communication; the sharded output-layer update (auto's gradient windows)
    with Adagrad, whose state the shards must keep, equals one process too, also under row-wise
    Adagrad (whose input layer has row accumulators and whose sharded output layer keeps
    Adagrad's); proportional splits follow their rule."""
    p = equivalence
    assert f"sync equivalence ok ({partition}, {optimizer})" in p.stdout and p.returncode == 0, explain(p)
