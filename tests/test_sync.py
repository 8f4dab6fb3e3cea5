"""Horovod synchronous SGD on 2 real MPI ranks, through the real CLI."""
import numpy as np

from mpirun import records, train


def test_sync_two_ranks_learns_and_keeps_replicas_identical(tmp_path):
    run = tmp_path / "sync"
    s = train(2, run)
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
    assert evals[-1]["p_at_1"] > evals[0]["p_at_1"] or evals[0]["p_at_1"] > 0.5
    # every training row once per epoch: 10 epochs of 2000 rows
    assert records(run, "round")[-1]["samples"] == 10 * 2000
    assert (run / "config.json").is_file()
