"""A time-varying slowdown on a real 2-rank run: the slowed rank sleeps only in its phase."""
from tests.harness.mpirun import records, train


def test_a_run_slows_rank_1_only_in_its_phase(tmp_path):
    run = tmp_path / "vary"
    train(2, run, "train.algorithm=auto", "train.epochs=3",
          "hetero.schedule=[{from_epoch: 1.0, slowdown: {1: 3.0}}, {from_epoch: 2.0, slowdown: {}}]")
    rounds = records(run, "round")
    slept = {}
    for r in rounds:
        phase = int(r["epoch"] - 1e-9)  # epoch at the round's end: rounds of epoch k end in (k, k+1]
        for rank in r["ranks"]:
            slept.setdefault((phase, rank["rank"]), []).append(rank["slowdown_s"])
    assert all(s == 0 for k, v in slept.items() if k != (1, 1) for s in v), slept
    assert all(s > 0 for s in slept[(1, 1)]), slept
