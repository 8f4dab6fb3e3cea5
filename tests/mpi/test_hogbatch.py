"""CPU+GPU Hogbatch and Adaptive Hogbatch on real MPI ranks.

The multi-rank runs use configs/tiny.yaml with 1,000 labels and 256 hidden units, so an
update's cost grows with its batch: with tiny's own sizes the fixed cost of an update
dominates, and since the simulated slowdown multiplies it too, the fast rank would need
batches near the bounds to slow down to the slow one's pace. Rank 1 is the slow "CPU" worker
(4x slowdown)."""
import json

import numpy as np
import pytest

from hvd_adaptive.config import config_from_dict
from hvd_adaptive.train.algorithms.hogbatch import worker_batch
from hvd_adaptive.train.balance import adapt_batch
from tests.harness.mpirun import mpirun, records, train_many

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


def test_adaptive_hogbatch_resizes_by_its_rule(adaptive):
    """Every resizing decision a worker took (logged with the rates it read from the shared
    table) is balance.adapt_batch's for those figures, and each starts from the batch the
    worker's previous decision left."""
    run, _ = adaptive
    cfg = config_from_dict(json.loads((run / "config.json").read_text()))  # as the run resolved it
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


def test_adaptive_hogbatch_balances_update_counts_plain_does_not(plain, adaptive):
    threshold = THRESHOLD
    run, s = adaptive
    plain_u, adapt_u = updates_late(plain[0]), updates_late(run)
    assert plain_u.max() / plain_u.min() > 2, plain_u
    assert np.abs(adapt_u / adapt_u.mean() - 1).max() <= threshold, adapt_u
    sizes = s["algorithm_state"]["batch_sizes"]
    assert sizes[0] > sizes[1], sizes  # the fast worker took the larger batch
    assert s["samples"] == 10 * 2000


def test_shared_model_survives_concurrent_updates():
    p = mpirun(3, ["tests/mpi/ranks/hogbatch_ranks.py"], timeout=240)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "hogbatch shared model ok on 3 ranks" in p.stdout
