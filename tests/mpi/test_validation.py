"""The best model kept and read, and the early stop, on 2-rank runs on tiny data whose labels are
half noise (data.synth.label_noise 0.5: the validation P@1 falls and rises between
evaluations); the accuracy benchmark sets the kept model beside the tree."""
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.harness.mpirun import REPO, mpi_env, records, train, train_many
from tests.harness.trained_run import cli


@pytest.fixture(scope="module")
def runs(noisy_files, tmp_path_factory):
    """Two 2-rank sync runs on the noisy noisy_files, evaluated every epoch with a tenth of the
    training rows held out: 5 epochs ("keep"), and 12 with a patience of 2 ("early")."""
    root = tmp_path_factory.mktemp("validation")
    train_txt, test_txt = noisy_files
    data = (f"data.train={train_txt}", f"data.test={test_txt}", "data.validation=0.1",
            "train.eval_every=1")
    spec = {"keep": (root / "keep", (*data, "train.epochs=5")),
            "early": (root / "early", (*data, "train.epochs=12", "train.patience=2"))}
    return {name: (path, s) for (name, (path, _)), s in zip(spec.items(), train_many(2, spec).values())}


def test_the_best_model_is_kept_and_read_by_default(runs, noisy_files, tmp_path):
    run_dir, summary = runs["keep"]
    evals = records(run_dir, "eval")
    val = [e["val_p_at_1"] for e in evals]
    best = int(np.argmax(val))
    assert best < len(evals) - 1 and val[-1] < val[best], (
        f"the run's validation P@1 must fall after its best for this test to mean anything: {val}")
    assert summary["kept"]["epoch"] == evals[best]["epoch"]
    kept = list((run_dir / "checkpoints" / "best").iterdir())
    assert [p.name for p in kept] == [f"ckpt-{4 * (best + 1)}"]  # 4 rounds an epoch
    _, test_txt = noisy_files
    p = cli("evaluate", run_dir, "--data", test_txt, "--out", tmp_path / "best.json")
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads((tmp_path / "best.json").read_text())
    assert "checkpoints/best/" in got["checkpoint"]
    for k in ("p_at_1", "p_at_5", "psp_at_5"):  # the best evaluation's model, not the last's
        assert got["metrics"][k] == pytest.approx(evals[best][k], abs=1e-5), k
    p = cli("evaluate", run_dir, "--data", test_txt, "--checkpoint", "last",
            "--out", tmp_path / "last.json")
    assert p.returncode == 0, p.stderr[-3000:]
    last = json.loads((tmp_path / "last.json").read_text())
    assert last["metrics"]["p_at_1"] == pytest.approx(evals[-1]["p_at_1"], abs=1e-5)
    assert last["checkpoint"].endswith("checkpoints/ckpt-20")


def test_the_early_stop_stops_after_its_patience(runs):
    run_dir, summary = runs["early"]
    val = [e["val_p_at_1"] for e in records(run_dir, "eval")]
    best = int(np.argmax(val))
    assert len(val) == best + 1 + 2, val  # two evaluations without gain, then no more
    assert summary["final"]["epoch"] < 12
    assert summary["kept"]["val_p_at_1"] == max(val)


def test_a_fresh_run_in_the_folder_drops_the_old_best(runs, tmp_path):
    run_dir, _ = runs["keep"]
    again = tmp_path / "again"
    shutil.copytree(run_dir, again)
    assert (again / "checkpoints" / "best").is_dir()
    summary = train(2, again, "train.epochs=1")  # the tiny synthetic data, no split
    assert summary["kept"] is None
    assert not (again / "checkpoints" / "best").exists()
    assert [p.name for p in (again / "checkpoints").iterdir()] == ["ckpt-4"]


def test_the_accuracy_benchmark_sets_the_kept_model_beside_the_tree(noisy_files, tmp_path):
    train_txt, test_txt = noisy_files
    p = subprocess.run([sys.executable, "-m", "hvd_adaptive.bench.accuracy", "--config", "configs/tiny.yaml",
                        "--name", "t", "--seeds", "1", "--epochs", "4", "--eval-every", "1",
                        "--validation", "0.1", "--set", f"data.train={train_txt}",
                        "--set", f"data.test={test_txt}", "--out", str(tmp_path)],
                       cwd=REPO, env=mpi_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    (row,) = json.loads((tmp_path / "accuracy-t.json").read_text())["rows"]
    evals = records(tmp_path / "t-r0", "eval")
    best = max(evals, key=lambda e: e["val_p_at_1"])
    assert row["kept_p1"] == best["p_at_1"] and row["best_p1"] == max(e["p_at_1"] for e in evals)
    assert row["gap_points"] == pytest.approx(100 * (row["best_p1"] - row["kept_p1"]), abs=0.01)
    tree = json.loads((tmp_path / "t-r0" / "trees.json").read_text())
    assert row["tree_p1"] == tree["metrics"]["p_at_1"] and tree["train_rows"] == 1800
    reached = [e["wall_s"] for e in evals if e["p_at_1"] >= row["tree_p1"]]
    assert row["net_s_to_tree_p1"] == (reached[0] if reached else None)
