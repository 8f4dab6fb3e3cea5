"""When a run stops early (README, "Config": train.target_p_at_1, train.time_budget_s) and what
a fresh run does with an old run's folder ("When things go wrong"): 2 real ranks, tiny config.
"""
import json
import shutil

import pytest

from mpirun import mpirun, train_args

pytestmark = pytest.mark.mpi  # every test here starts real MPI ranks

# Sync on the tiny config is deterministic: its P@1 at the evaluations every half epoch was
# 0.254, 0.346, 0.42 (epoch 1.5), ... 0.758 at epoch 10, so this target stops it at epoch 1.5.
TARGET = 0.4
BUDGET = 1.0  # seconds of training; all 10 epochs took 3.6 s here (40 rounds)


def last_run(run_dir) -> list[dict]:
    """The records of the folder's latest run (a fresh run appends to metrics.jsonl)."""
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    starts = [i for i, r in enumerate(recs) if r["event"] == "start"]
    return recs[starts[-1]:]


def events(recs, event) -> list[dict]:
    return [r for r in recs if r["event"] == event]


def checkpoints(run_dir) -> dict:
    """{name: time written} of the folder's checkpoints."""
    return {p.parent.name: json.loads(p.read_text())["time"]
            for p in (run_dir / "checkpoints").glob("ckpt-*/COMPLETE")}


@pytest.fixture(scope="module")
def target_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("target") / "run"
    p = mpirun(2, train_args(run, "train.eval_every=0.5", f"train.target_p_at_1={TARGET}",
                             "checkpoint.every=4"))
    assert p.returncode == 0, p.stderr[-3000:]
    return run, p.stdout


@pytest.fixture(scope="module")
def budget_run(tmp_path_factory, target_run):
    """A run with a time budget, without --resume, in a copy of the target run's folder."""
    old, _ = target_run
    run = shutil.copytree(old, tmp_path_factory.mktemp("budget") / "run")
    before = checkpoints(run)
    p = mpirun(2, train_args(run, f"train.time_budget_s={BUDGET}"))
    assert p.returncode == 0, p.stderr[-3000:]
    return run, p.stdout, before


def test_target_p_at_1_stops_at_the_first_evaluation_reaching_it(target_run):
    run, out = target_run
    recs = last_run(run)
    p1 = [e["p_at_1"] for e in events(recs, "eval")]
    assert len(p1) >= 3 and p1[-1] >= TARGET and max(p1[:-1]) < TARGET, p1
    rounds = events(recs, "round")
    assert rounds[-1]["epoch"] == events(recs, "eval")[-1]["epoch"] < 10, "trained past the target"
    assert f"target P@1 {TARGET} reached" in out, out[-2000:]


def test_time_budget_stops_the_run_after_the_round_that_reaches_it(budget_run):
    run, out, _ = budget_run
    recs = last_run(run)
    walls = [r["wall_s"] for r in events(recs, "round")]
    assert len(walls) >= 2 and walls[-1] >= BUDGET > walls[-2], walls
    assert events(recs, "round")[-1]["epoch"] < 10
    # The stopped run is still evaluated and checkpointed where it stopped.
    assert events(recs, "eval")[-1]["epoch"] == events(recs, "round")[-1]["epoch"]
    assert f"time budget of {BUDGET} s reached" in out, out[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["train_wall_s"] == pytest.approx(walls[-1], abs=1e-3)


def test_a_run_without_resume_deletes_the_old_runs_checkpoints(budget_run):
    run, out, before = budget_run
    assert len(before) >= 2, before  # the target run left several
    assert "removed the checkpoints of an earlier run" in out, out[-2000:]
    rounds = events(last_run(run), "round")
    now = checkpoints(run)
    assert list(now) == [f"ckpt-{len(rounds)}"], now  # only this run's final one
    assert not set(now.items()) & set(before.items()), "an old checkpoint survived"
    assert len(events(last_run(run), "start")) == 1 and not events(last_run(run), "resume")
