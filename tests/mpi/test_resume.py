"""Resume for every algorithm, on another rank count, and refusals (issue: central claims).

Sync's resume is compared bit for bit in test_checkpoint.py. The others schedule dynamically
or asynchronously, so a resumed run cannot repeat an uninterrupted one exactly: it must
continue from the checkpoint (every round once in the log, every row of every epoch, the
model's loss going on from where it stopped instead of starting over) and learn. These runs
also show that each algorithm learns (sync with the proportional split: test_predict.py; sync
with the sampled output layer's row-sparse gradients: test_export.py).
"""
import json
import shutil

import pytest

from hvd_adaptive.train.balance import MODES, choose_mode
from tests.harness.mpirun import before_tf, mpirun, records, train_many


# 4 epochs of the tiny config: 16 rounds of 512 rows (hogbatch: 8 rounds of half an epoch).
BASE = ("train.epochs=4", "train.eval_every=2", "hogbatch.round_epochs=0.5")
ALGOS = {"adaptive": 16, "local": 16, "sma": 16, "hogbatch": 8, "auto": 16, "overlap": 16,
         "sma_sampled": 16}
# Names that are an algorithm with settings (FIXED).
ALGORITHM = {"overlap": "adaptive", "sma_sampled": "sma"}
# The sampled loss by label frequency: a second model (the central one) needs the frequencies too.
SAMPLED = ("model.output=sampled", "model.sampler=frequency", "model.negatives=8")
# auto's choice follows measured speeds. An averaging cost no measurement can beat leaves only
# the rule's probes: grad, avg, grad x 4, avg at window 6, grad x 4, avg at 11. A resumed run
# (from window 8) that lost the last probes would probe avg at once; one that lost the rates
# would measure both modes again (grad, avg at 8 and 9).
FIXED = {"auto": ("auto.averaging_cost=1000", "auto.probe_every=4"),
         # Adaptive SGD with each merge landing a window later: its checkpoints and its end
         # land the merge in flight first (Algorithm.settle).
         # Evaluations every quarter epoch: the first one after resuming reads the merged copy.
         "overlap": ("merge.overlap=true", *SAMPLED, "train.eval_every=0.25"),
         "sma_sampled": SAMPLED}


def interrupted(run, n, sets, fail_at) -> None:
    """A run that fails on rank 1 at round `fail_at` (the fail-fast test hook)."""
    args = ["-m", "hvd_adaptive.cli", "train", "--config", "configs/tiny.yaml", "--run-dir", str(run)]
    for s in sets:
        args += ["--set", s]
    p = mpirun(n, args, timeout=180, HVD_ADAPTIVE_FAIL_AT_ROUND=str(fail_at), HVD_ADAPTIVE_FAIL_RANK="1")
    assert p.returncode != 0 and "injected failure" in p.stderr, p.stderr[-2000:]
    assert not (run / "summary.json").exists()


CUT = ("train.algorithm=adaptive", *BASE, "checkpoint.every=4")


@pytest.fixture(scope="module")
def adaptive_cut(tmp_path_factory):
    """One adaptive run on 2 ranks that failed in round 9 (checkpoint ckpt-8 is its newest);
    each test resumes a copy of it (adaptive's own resume test too)."""
    run = tmp_path_factory.mktemp("cut") / "run"
    interrupted(run, 2, CUT, fail_at=9)
    return run


def _sets(name: str) -> tuple[str, ...]:
    rounds = ALGOS[name]
    return (f"train.algorithm={ALGORITHM.get(name, name)}", *BASE, f"checkpoint.every={rounds // 4}", *FIXED.get(name, ()))


@pytest.fixture(scope="module")
def resumed(tmp_path_factory, adaptive_cut):
    """Every algorithm's run cut at its middle checkpoint, then all resumed in one job of
    train_many (the CLI's --resume is the set checkpoint.resume=auto). Returns {name: (run
    folder, summary)}.

    Adaptive's cut is the module's run that failed on rank 1 in round 9. The others run to
    the end in one job, with checkpoints at the middle and at the end; the end's checkpoint
    and summary.json are then removed: the folder of a job that died while writing its last
    checkpoint (before the rename that completes it), whose metrics.jsonl holds every round
    and must be cut back to the middle. (One job instead of one failing job each.)"""
    base = tmp_path_factory.mktemp("resumed")
    # The later set of checkpoint.every wins: checkpoints at the middle and the end only.
    first = {name: (base / name, (*_sets(name), f"checkpoint.every={rounds // 2}"))
             for name, rounds in ALGOS.items() if _sets(name) != CUT}
    train_many(2, first)
    runs = {}
    for name, rounds in ALGOS.items():
        run = base / name
        if _sets(name) == CUT:  # adaptive: the module's interrupted run is this one
            shutil.copytree(adaptive_cut, run)
        else:
            shutil.rmtree(run / "checkpoints" / f"ckpt-{rounds}")
            (run / "summary.json").unlink()
            assert len(records(run, "round")) == rounds
        runs[name] = (run, (*_sets(name), "checkpoint.resume=auto"))
    summaries = train_many(2, runs)
    return {name: (run, summaries[name]) for name, (run, _) in runs.items()}


@pytest.mark.parametrize("name", list(ALGOS))
def test_every_algorithm_resumes_where_it_stopped_and_learns(resumed, name):
    rounds = ALGOS[name]
    cut = rounds // 2  # the newest checkpoint when rank 1 fails in the round after it
    run, s = resumed[name]
    rounds_log = records(run, "round")
    assert [r["round"] for r in rounds_log] == list(range(rounds))
    assert records(run, "resume")[0]["round"] == cut
    assert s["samples"] == 4 * 2000
    # The model came back: the first resumed round's loss goes on from the interrupted run's
    # instead of starting over near round 0's (a fresh model's).
    loss = [r["loss"] for r in rounds_log]
    assert loss[cut] < loss[0] - 0.5 * (loss[0] - loss[cut - 1]), (name, loss)
    base = s["baseline_p_at_1"]
    # It learns (uninterrupted runs: 0.54-0.69 here from a baseline of 0.25).
    assert s["final"]["p_at_1"] > base + 0.2, (name, s["final"], base)
    if name in ("adaptive", "local", "auto", "overlap"):  # they end with equal replicas
        fp = s["replica_fingerprints"]
        assert all(f == fp[0] for f in fp), (name, fp)
    if name == "overlap":
        # Every round recorded its wait for the merge it landed. The evaluation after the last
        # round read the model merged a window before; the run's final one, at the same epoch,
        # the merged end, after the last merge landed.
        waits = [r["ranks"][0].get("merge_wait_s") for r in rounds_log]
        assert all(w is not None and w >= 0 for w in waits), waits
        evals = records(run, "eval")
        assert [e["epoch"] for e in evals[-2:]] == [4.0, 4.0], evals
        assert evals[-1]["p_at_1"] == s["final"]["p_at_1"]
        # The merged copy came back with the checkpoint: the first evaluation after resuming
        # is no worse than the last one before it (a fresh copy scored near the baseline).
        before = [e for e in evals if e["epoch"] <= 2.0][-1]
        after = next(e for e in evals if e["epoch"] > 2.0)
        assert after["p_at_1"] >= before["p_at_1"] - 0.05, (before, after)
    if name == "auto":
        probe_every = json.loads((run / "config.json").read_text())["auto"]["probe_every"]
        rates, last, want = {m: None for m in MODES}, {}, []
        for i in range(rounds):
            mode = choose_mode(i, rates, last, 1000.0, probe_every)
            rates[mode], last[mode] = 1.0, i
            want.append(mode)
        got = [r["ranks"][0]["mode"] for r in rounds_log]
        assert got == want and "avg" in got[cut:], (got, want)


def test_adaptive_resumes_on_another_rank_count(tmp_path, adaptive_cut):
    run = shutil.copytree(adaptive_cut, tmp_path / "run")
    args = ["-m", "hvd_adaptive.cli", "train", "--config", "configs/tiny.yaml", "--run-dir", str(run),
            "--resume", *[a for s in CUT for a in ("--set", s)]]
    p = mpirun(3, args, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "warning: checkpoint written by 2 ranks, resuming on 3" in p.stdout, p.stdout[-2000:]
    assert [r["round"] for r in records(run, "round")] == list(range(16))
    assert len(records(run, "round")[-1]["ranks"]) == 3
    assert records(run, "round")[-1]["samples"] == 4 * 2000


@pytest.mark.parametrize("change, needle, ranks", [
    ("train.algorithm=sma", "checkpoint was written by train.algorithm=adaptive, this run uses sma", 2),
    ("train.seed=5", "checkpoint was taken with [train.seed, rows a window, training rows] "
                     "= [0, 512, 2000], this run has [5, 512, 2000]", 2),
    ("data.synth.n_train=1500", "= [0, 512, 2000], this run has [0, 512, 1500]", 2),
    # Five ranks of 64-row batches raise the 512-row windows to two batches a rank (640 rows):
    # another window stream, refused as mpirun launches the job (OMPI_COMM_WORLD_SIZE).
    ("train.seed=0", "= [0, 512, 2000], this run has [0, 640, 2000] (rows a window: "
                     "train.window_samples, at least 2 batches of train.batch_size a rank)", 5),
])
def test_resume_refuses_a_checkpoint_of_another_run_before_tensorflow(tmp_path, adaptive_cut, change,
                                                                      needle, ranks):
    # Refused from the newest checkpoint's state.json before MPI and TensorFlow start
    # (run.check_inputs), in one line naming it; the folder is left as it was.
    run = shutil.copytree(adaptive_cut, tmp_path / "run")
    before = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    args = ["train", "--config", "configs/tiny.yaml", "--run-dir", str(run), "--resume",
            *[a for s in (*CUT, change) for a in ("--set", s)]]
    p = before_tf(args, OMPI_COMM_WORLD_SIZE=str(ranks))
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    line = f"hvd-adaptive: error: {run / 'checkpoints' / 'ckpt-8'}: "
    assert line in p.stderr and needle in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*")) == before
