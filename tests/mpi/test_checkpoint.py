"""Kill-and-resume on 2 real MPI ranks: a killed rank ends the job, and resumed runs end where
the uninterrupted one did (a damaged newest checkpoint skipped, none, raised epochs, Adagrad)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from hvd_adaptive.train import checkpoint as ck
from tests.harness.mpirun import REPO, job_group, mpi_env, mpirun, records, train, train_args

SETS = ("checkpoint.every=8",)


@pytest.fixture(scope="module")
def reference(sync_reference):
    """An uninterrupted 2-rank sync run: 40 rounds, checkpoints 24, 32 and 40 kept (conftest)."""
    return sync_reference


def _rank_pid(launcher: subprocess.Popen, rank: int) -> int:
    """PID of one rank's python process (a child of mpirun on this node)."""
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            if f"PPid:\t{launcher.pid}\n" not in open(f"/proc/{d}/status").read():
                continue
            env = open(f"/proc/{d}/environ", "rb").read().split(b"\0")
        except OSError:
            continue
        if f"OMPI_COMM_WORLD_RANK={rank}".encode() in env:
            return int(d)
    raise AssertionError(f"no process of rank {rank} under mpirun {launcher.pid}")


def _check_continuous(run, summary):
    rounds = [r["round"] for r in records(run, "round")]
    assert rounds == list(range(40)), rounds  # every round once: the log was cut back on resume
    evals = records(run, "eval")
    assert [e["epoch"] for e in evals] == [2.0, 4.0, 6.0, 8.0, 10.0]
    walls = [r["wall_s"] for r in records(run, "round")]
    assert walls == sorted(walls) and summary["train_wall_s"] >= walls[-1] - 1e-3
    assert records(run, "round")[-1]["samples"] == summary["samples"] == 10 * 2000
    assert len(records(run, "resume")) == 1


def test_killed_rank_ends_the_job_and_resume_matches_uninterrupted(tmp_path, reference):
    _, ref = reference
    run = tmp_path / "run"
    # Slowing rank 1 (sleeps only; sync's numbers do not change) leaves time to kill it.
    sets = ["checkpoint.every=4", "hetero.slowdown={1: 2.0}"]
    args = ["-m", "hvd_adaptive.cli", "train", "--config", "configs/tiny.yaml", "--run-dir", str(run)]
    cmd = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", sys.executable, *args]
    for s in sets:
        cmd += ["--set", s]
    with job_group(cmd, env=mpi_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                   text=True) as job:
        deadline = time.time() + 180
        while not list((run / "checkpoints").glob(f"ckpt-*/{ck.MARKER}")):
            assert job.poll() is None and time.time() < deadline, job.communicate()
            time.sleep(0.02)
        os.kill(_rank_pid(job, 1), signal.SIGKILL)
        t_kill = time.time()
        out, err = job.communicate(timeout=60)
    assert job.returncode != 0, out
    assert time.time() - t_kill < 30
    assert "rank 1" in err and "signal 9" in err, err[-2000:]
    assert not (run / "summary.json").exists()

    s = train(2, run, "checkpoint.every=4", "checkpoint.resume=auto")  # at full speed
    np.testing.assert_allclose(s["replica_fingerprints"], ref["replica_fingerprints"], rtol=1e-6)
    _check_continuous(run, s)
    assert s["final"]["p_at_1"] == ref["final"]["p_at_1"]


def test_resume_skips_a_damaged_newest_checkpoint(tmp_path, reference):
    ref_run, ref = reference
    run = tmp_path / "run"
    shutil.copytree(ref_run, run)
    (run / "summary.json").unlink()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["ckpt-24", "ckpt-32", "ckpt-40"]
    with open(run / "checkpoints" / "ckpt-40" / "model.0.npy", "r+b") as f:
        f.truncate(1000)
    args = ["-m", "hvd_adaptive.cli", "train", "--config", "configs/tiny.yaml", "--run-dir",
            str(run), "--resume", *[a for s in SETS for a in ("--set", s)]]
    p = mpirun(2, args)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "warning: skipping checkpoint" in p.stdout and "ckpt-40" in p.stdout, p.stdout
    assert "resuming from" in p.stdout and "ckpt-32" in p.stdout
    s = json.loads((run / "summary.json").read_text())
    np.testing.assert_allclose(s["replica_fingerprints"], ref["replica_fingerprints"], rtol=1e-6)
    _check_continuous(run, s)
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names[:3] == ["ckpt-24", "ckpt-32", "ckpt-40"] and names[3].startswith("damaged-ckpt-40")


# ---- Adagrad across three jobs ----------------------------------------------------------------
# Adagrad's accumulators are optimizer state that the plain SGD above does not have: a resume
# that lost or mixed them up would take other steps from then on. Sync continues exactly, so
# three jobs that stop and go on must end where one uninterrupted job ends.
ADAGRAD = ("optim.name=adagrad", "optim.lr=0.1", "train.eval_every=2")


@pytest.fixture(scope="module")
def adagrad_reference(tmp_path_factory):
    """4 epochs (16 rounds) of sync with Adagrad in one job; its final checkpoint is ckpt-16."""
    run = tmp_path_factory.mktemp("adagrad_ref") / "run"
    train(2, run, *ADAGRAD, "train.epochs=4")
    return run


@pytest.fixture(scope="module")
def adagrad_chain(tmp_path_factory):
    """The same 16 rounds in three jobs in one folder, all with --resume and a checkpoint every
    3 rounds: 2 epochs in an empty folder (8 rounds; ckpt-8 only because it is the end);
    train.epochs raised to 4, failing on rank 1 at round 13 (ckpt-12 its newest); the rest.
    Returns the folder and each job's stdout."""
    run = tmp_path_factory.mktemp("adagrad_chain") / "run"
    fail = {"HVD_ADAPTIVE_FAIL_AT_ROUND": "13", "HVD_ADAPTIVE_FAIL_RANK": "1"}
    outs = []
    for epochs, env in ((2, {}), (4, fail), (4, {})):
        args = train_args(run, *ADAGRAD, f"train.epochs={epochs}", "checkpoint.every=3", resume=True)
        p = mpirun(2, args, timeout=180, **env)
        if env:
            assert p.returncode != 0 and "injected failure" in p.stderr, p.stderr[-2000:]
        else:
            assert p.returncode == 0, p.stderr[-3000:]
        outs.append(p.stdout)
    return run, outs


def test_resume_without_a_checkpoint_starts_from_scratch(adagrad_chain):
    run, (first, _, _) = adagrad_chain
    assert "resume: no complete checkpoint" in first and "starting from scratch" in first, first
    assert "resuming from" not in first
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["event"] == "start" and [r for r in lines if r["event"] == "start"] == lines[:1]
    assert records(run, "round")[0]["round"] == 0


def test_raised_epochs_train_on_from_the_final_checkpoint(adagrad_chain):
    run, (_, second, last) = adagrad_chain
    # ckpt-8 was written only because the 2-epoch job ended there (checkpoint.every=3).
    assert "ckpt-8 (round 8, written by 2 rank(s))" in second, second[-2000:]
    assert "ckpt-12 (round 12, written by 2 rank(s))" in last, last[-2000:]
    assert [r["round"] for r in records(run, "resume")] == [8, 12]
    assert [r["round"] for r in records(run, "round")] == list(range(16))
    assert [e["epoch"] for e in records(run, "eval")] == [2.0, 4.0]
    assert records(run, "round")[-1]["samples"] == 4 * 2000


def test_resume_restores_adagrads_accumulators(adagrad_chain, adagrad_reference):
    run, _ = adagrad_chain
    got, _ = ck.load(run / "checkpoints" / "ckpt-16")
    want, _ = ck.load(adagrad_reference / "checkpoints" / "ckpt-16")
    opt = sorted(k for k in want if k.startswith("opt."))  # the step count and lr are scalars
    weights = sorted(k for k in want if k.startswith("model."))
    accumulators = [k for k in opt if isinstance(want[k], np.ndarray)]
    assert len(accumulators) == len(weights), sorted(want)  # one a variable
    for key in opt + weights:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-6, atol=1e-7, err_msg=key)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final"]["p_at_1"] == json.loads((adagrad_reference / "summary.json").read_text())["final"]["p_at_1"]
