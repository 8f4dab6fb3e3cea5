"""The benchmark's yardstick, the plain Horovod script (hvd_adaptive/bench/plain_horovod.py), on 2
real MPI ranks: its step is the project's sync step (same weights after the same global batches),
it learns on its own and writes run folders the report and the benchmark read, and a CPU quota
reaches it as it reaches the project's runs."""
import json

import pytest

from tests.harness.mpirun import explain, mpirun, records, train


CASES = ["sgd", "momentum", "adagrad", "rowwise_adagrad", "rowwise_adagrad:deep", "rowwise_adagrad:acc",
         "rowwise_adagrad:smooth", "rowwise_adagrad:timed", "rowwise_adagrad:sampled",
         "rowwise_adagrad:linear"]


@pytest.fixture(scope="module")
def reference():
    """horovod_reference_ranks.py's cases, one after another in one 2-rank job."""
    return mpirun(2, ["tests/mpi/ranks/horovod_reference_ranks.py", *CASES], timeout=300)


@pytest.mark.parametrize("case", CASES)
def test_plain_horovod_step_equals_the_projects_sync_step(reference, case):
    """From the same initial weights (the plain script's own initialisation must equal the
    project's), 8 steps on the same global batches leave the same weights and optimizer state
    as the project's sync algorithm, and every step's loss is the same; importing the script
    pulls in none of the project's training modules."""
    p = reference
    assert f"horovod reference ok ({case})" in p.stdout and p.returncode == 0, explain(p)


def plain(run_dir, *sets, timeout=240):
    """`mpirun -np 2 python -m hvd_adaptive.bench.plain_horovod` on the tiny config (asserts success)."""
    args = ["-m", "hvd_adaptive.bench.plain_horovod", "--config", "configs/tiny.yaml", "--run-dir", str(run_dir)]
    for s in sets:
        args += ["--set", s]
    p = mpirun(2, args, timeout=timeout)
    assert p.returncode == 0, explain(p)
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("plain_horovod") / "run"
    return run, plain(run)


def test_plain_horovod_learns_and_its_run_folder_reads_like_the_projects(plain_run):
    from hvd_adaptive.bench.measure import measures
    from hvd_adaptive.bench.measure import time_to_target
    from hvd_adaptive.train.records import load_run

    run, s = plain_run
    assert s["algorithm"] == "horovod" and s["ranks"] == 2
    # well above always predicting the most frequent label, and rising
    assert s["final"]["p_at_1"] > max(2 * s["baseline_p_at_1"], s["baseline_p_at_1"] + 0.15), s
    evals = records(run, "eval")
    assert evals[-1]["p_at_1"] > evals[0]["p_at_1"] + 0.05, [e["p_at_1"] for e in evals]
    # every 2 epochs (train.eval_every), every training row once an epoch on the ranks together
    assert [e["epoch"] for e in evals] == [2.0, 4.0, 6.0, 8.0, 10.0]
    assert [e["samples"] for e in evals] == [4000, 8000, 12000, 16000, 20000]
    assert [r["samples"] for r in s["per_rank"]] == [10000, 10000]
    walls = [e["wall_s"] for e in evals]
    assert 0 < walls[0] < walls[-1] and walls == sorted(walls)
    assert walls[-1] == pytest.approx(s["train_wall_s"], abs=1e-3)
    start = records(run, "start")[0]
    assert start["ranks"] == 2 and start["train_rows"] == 2000 and start["horovod_cycle_ms"] == 5.0
    assert len(start["standalone_rates"]) == 2 and min(start["standalone_rates"]) > 0
    assert [r["standalone_rate"] for r in s["per_rank"]] == [round(x, 1) for x in start["standalone_rates"]]
    # what the report and the benchmark read
    loaded = load_run(run)
    assert loaded.algorithm == "horovod" and loaded.train_s == s["train_wall_s"]
    target = 0.9 * s["final"]["p_at_1"]
    t = time_to_target(loaded.evals, target)
    assert t is not None and 0 < t <= s["train_wall_s"]
    m = measures({"summary": s, "evals": loaded.evals}, target)
    assert m["t"] == t and m["rate"] > 0 and m["compute_s"] is None  # no time breakdown: "-"


def test_plain_horovod_matches_the_projects_sync_run_on_the_same_batches(plain_run, sync_reference):
    """Both cut every epoch's shuffle into the same global batches (the tiny config's windows
    hold whole global batches, and its epoch's last step splits evenly), so the two runs'
    accuracy curves agree (identical here; 0.01 is 5 of the 500 test rows)."""
    _, s = plain_run
    run, sync = sync_reference
    ours = [e["p_at_1"] for e in records(plain_run[0], "eval")]
    theirs = [e["p_at_1"] for e in records(run, "eval") if e["epoch"] in (2.0, 4.0, 6.0, 8.0, 10.0)]
    assert len(theirs) == len(ours) and max(abs(a - b) for a, b in zip(ours, theirs)) <= 0.01, (ours, theirs)


def test_both_are_evaluated_at_the_same_rows(tmp_path):
    """Evaluations every 0.3 epochs (600 of the tiny config's 2,000 rows): the plain script and
    the project's sync evaluate at the first 128-row step after each mark (640, 1,280, 1,920)
    and at the end, whatever the 512-row window: read at other rows, the same curve interpolates
    to other rows and seconds to a target. Adaptive SGD's replicas are one model only after a
    merge, so it is evaluated at the first end of a window after each mark."""
    sets = ("train.eval_every=0.3", "train.epochs=1")
    plain(tmp_path / "plain", *sets)
    train(2, tmp_path / "sync", *sets)
    train(2, tmp_path / "adaptive", *sets, "train.algorithm=adaptive")
    ours = [(e["samples"], e["p_at_1"]) for e in records(tmp_path / "plain", "eval")]
    theirs = [(e["samples"], e["p_at_1"]) for e in records(tmp_path / "sync", "eval")]
    assert [s for s, _ in ours] == [640, 1280, 1920, 2000], ours
    assert ours == theirs
    # sync's rounds end there too: the windows are cut, every row still trained once
    rounds = records(tmp_path / "sync", "round")
    assert [r["samples"] for r in rounds] == [512, 640, 1024, 1280, 1536, 1920, 2000], rounds
    merged = [e["samples"] for e in records(tmp_path / "adaptive", "eval")]
    assert merged == [1024, 1536, 2000], merged


def test_the_plain_script_drops_out_from_model_dropout_after_on(tmp_path):
    """As the project's model (tests/mpi/test_dropout.py): the evaluations before the switch
    are the dropout-free run's, those after it not."""
    sets = ("train.eval_every=0.5", "train.epochs=2")
    plain(tmp_path / "plain", *sets)
    plain(tmp_path / "late", *sets, "model.dropout=0.5", "model.dropout_after=1")

    def curve(run):
        return [(e["epoch"], e["p_at_1"], e["p_at_5"], e["ndcg_at_5"]) for e in records(run, "eval")]
    ours, late = curve(tmp_path / "plain"), curve(tmp_path / "late")
    assert [e[0] for e in ours] == [e[0] for e in late] == [0.512, 1.0, 1.512, 2.0], ours
    assert late[:2] == ours[:2] and late[2] != ours[2] and late[3] != ours[3], (late, ours)


def test_under_the_sampled_loss_both_draw_alike_and_train_alike(tmp_path):
    """From the same seeds the plain script draws the project's negatives, batch by batch
    (hvd_adaptive.model.negatives), its calibration's steps (as many as fit their seconds)
    put back like the project's, so the two runs' evaluations agree."""
    sets = ("model.output=sampled", "model.negatives=20", "train.threads=1", "train.epochs=1",
            "train.eval_every=0.25", "train.calibrate_s=0.3")
    plain(tmp_path / "plain", *sets)
    train(2, tmp_path / "sync", *sets)
    ours = [(e["samples"], e["p_at_1"], e["p_at_5"]) for e in records(tmp_path / "plain", "eval")]
    theirs = [(e["samples"], e["p_at_1"], e["p_at_5"]) for e in records(tmp_path / "sync", "eval")]
    assert len(ours) == 4 and ours == theirs, (ours, theirs)


def test_a_cpu_quota_reaches_the_plain_script_and_sleep_mode_is_refused(tmp_path):
    """The project's quota (hetero.mode: cpu_quota) on rank 1's whole process: its cgroup holds
    half a core (one thread, 2x), and its standalone speed drops about as much."""
    s = plain(tmp_path / "quota", "hetero.mode=cpu_quota", "hetero.slowdown={1: 2.0}",
              "train.threads=1", "train.epochs=2", "train.calibrate_s=1.0")
    assert [r["quota_cores"] for r in s["per_rank"]] == [None, 0.5]
    fast, slow = (r["standalone_rate"] for r in s["per_rank"])
    assert 1.4 < fast / slow < 3.0, (fast, slow)
    start = records(tmp_path / "quota", "start")[0]
    assert start["horovod_cycle_ms"] == 10.0  # the project's cycle for a half-core rank
    # The sleep slowdown cannot reach a plain script: refused, with the way out named.
    p = mpirun(1, ["-m", "hvd_adaptive.bench.plain_horovod", "--config", "configs/tiny.yaml",
                   "--run-dir", str(tmp_path / "sleep"), "--set", "hetero.slowdown={1: 2.0}"])
    assert p.returncode == 2 and "use hetero.mode=cpu_quota" in p.stderr, explain(p)
