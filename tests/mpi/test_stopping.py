"""When a run stops early (README, "Config": train.target_p_at_1, train.time_budget_s) and what
a fresh run does with an old run's folder ("When things go wrong"): 2 real ranks, tiny config.
"""
import json

import pytest

from tests.harness.mpirun import train_many_job


# Sync on the tiny config is deterministic: its P@1 at the evaluations every half epoch was
# 0.254, 0.346, 0.42 (epoch 1.5), ... 0.758 at epoch 10, so this target stops it at epoch 1.5.
TARGET = 0.4
BUDGET = 1.0  # seconds of training; 10 epochs (40 rounds) took 3.6 s on one host, 1.0 s on another
BUDGET_EPOCHS = 40  # the budget run's length: far more than BUDGET allows on either host


def events(recs, event) -> list[dict]:
    return [r for r in recs if r["event"] == event]


def checkpoints(run_dir) -> dict:
    """{name: time written} of the folder's checkpoints."""
    return {p.parent.name: json.loads(p.read_text())["time"]
            for p in (run_dir / "checkpoints").glob("ckpt-*/COMPLETE")}


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """Two runs in one folder, one after another in one 2-rank job (train_many): a run with a
    target P@1 and a checkpoint every 4 rounds, then a run with a time budget and without
    --resume. Returns (folder, each run's records, each run's lines of output)."""
    run = tmp_path_factory.mktemp("stopping") / "run"
    _, out = train_many_job(2, {
        "target": (run, ("train.eval_every=0.5", f"train.target_p_at_1={TARGET}", "checkpoint.every=4")),
        "budget": (run, (f"train.time_budget_s={BUDGET}", f"train.epochs={BUDGET_EPOCHS}")),
    })
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    starts = [i for i, r in enumerate(recs) if r["event"] == "start"]
    assert len(starts) == 2, starts
    cut = out.index("data: ", out.index("done: P@1"))  # the second run's first line
    return run, (recs[:starts[1]], recs[starts[1]:]), (out[:cut], out[cut:])


def test_target_p_at_1_stops_at_the_first_evaluation_reaching_it(stopped):
    _, (recs, _), (out, _) = stopped
    p1 = [e["p_at_1"] for e in events(recs, "eval")]
    assert len(p1) >= 3 and p1[-1] >= TARGET and max(p1[:-1]) < TARGET, p1
    rounds = events(recs, "round")
    assert rounds[-1]["epoch"] == events(recs, "eval")[-1]["epoch"] < 10, "trained past the target"
    assert f"target P@1 {TARGET} reached" in out, out[-2000:]


def test_time_budget_stops_the_run_after_the_round_that_reaches_it(stopped):
    run, (_, recs), (_, out) = stopped
    walls = [r["wall_s"] for r in events(recs, "round")]
    assert len(walls) >= 2 and walls[-1] >= BUDGET > walls[-2], walls
    assert events(recs, "round")[-1]["epoch"] < BUDGET_EPOCHS
    # The stopped run is still evaluated and checkpointed where it stopped.
    assert events(recs, "eval")[-1]["epoch"] == events(recs, "round")[-1]["epoch"]
    assert f"time budget of {BUDGET} s reached" in out, out[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["train_wall_s"] == pytest.approx(walls[-1], abs=1e-3)


def test_a_run_without_resume_deletes_the_old_runs_checkpoints(stopped):
    run, (first, second), (out_first, out) = stopped
    written = [line.split("/")[-1] for line in out_first.splitlines() if line.startswith("checkpoint ")]
    assert len(written) >= 2, out_first[-2000:]  # the target run left several
    assert "removed the checkpoints of an earlier run" in out, out[-2000:]
    now = checkpoints(run)
    assert list(now) == [f"ckpt-{len(events(second, 'round'))}"], now  # only this run's final one
    started = events(second, "start")[0]["time"]
    assert all(t > started for t in now.values()), ("an old checkpoint survived", now, started)
    assert not events(second, "resume")
