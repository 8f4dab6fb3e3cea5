"""The validation split, the best model kept and read, the early stop, and the tree method beside
the network: the split's rows against the training and test files, 2-rank runs on tiny data
whose labels are half noise (data.synth.label_noise 0.5: the validation P@1 falls and rises
between evaluations), and napkinXC's PLT on the same rows."""
import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from hvd_adaptive.config import ConfigError, load_config
from hvd_adaptive.data import load_dataset, preset, split_validation, synth_to_files, synthesize
from mpirun import REPO, before_tf, mpi_env, records, train, train_many
from trained_run import TINY, cli


def _config(tmp_path, *sets):
    return load_config("configs/tiny.yaml", list(sets))[0]


def _rows(ds) -> set:
    """Each row as (features, values, labels) bytes: a row's content, wherever it sits."""
    f, y = ds.features, ds.labels
    return {(f[r].indices.tobytes(), f[r].data.tobytes(), np.sort(y[r].indices).tobytes())
            for r in range(ds.n_rows)}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The tiny data with half of its rows' labels noise, as XC files: (train, test)."""
    return synth_to_files(preset("eurlex4k", label_noise=0.5, **TINY),
                          tmp_path_factory.mktemp("noisy"))


def test_the_split_is_carved_from_the_training_rows_only(files, tmp_path):
    train_txt, test_txt = files
    cfg = _config(tmp_path, f"data.train={train_txt}", f"data.test={test_txt}",
                  "data.validation=0.1")
    full, test = load_dataset(train_txt, use_cache=False), load_dataset(test_txt, use_cache=False)
    kept, val = split_validation(cfg, full)
    assert (kept.n_rows, val.n_rows) == (1800, 200)
    everything, mine, held = _rows(full), _rows(kept), _rows(val)
    assert len(everything) == full.n_rows  # the synthetic rows are all different
    assert mine | held == everything and not mine & held
    assert not held & _rows(test)
    # Seeded: the same rows again; another seed, other rows; a count takes that many.
    assert _rows(split_validation(cfg, full)[1]) == held
    other = _config(tmp_path, f"data.train={train_txt}", f"data.test={test_txt}",
                    "data.validation=0.1", "data.validation_seed=1")
    assert _rows(split_validation(other, full)[1]) != held
    count = _config(tmp_path, f"data.train={train_txt}", f"data.test={test_txt}", "data.validation=37")
    assert split_validation(count, full)[1].n_rows == 37
    none = _config(tmp_path, f"data.train={train_txt}", f"data.test={test_txt}")
    assert split_validation(none, full) == (full, None)


@pytest.mark.parametrize("sets, message", [
    (("data.validation=2000",), "data.validation: 2000 takes 2000 of the 2000 training rows of the synthetic training set"),
    (("data.validation=-0.1",), "data.validation: a fraction in [0, 1) or a whole count"),
    (("data.validation=2.5",), "data.validation: a fraction in [0, 1) or a whole count"),
    (("train.patience=2",), "train.patience: 2 needs a validation split"),
    (("data.synth.label_noise=1.5",), "data.synth.label_noise: must be in [0, 1]"),
])
def test_impossible_settings_name_the_key(sets, message, tmp_path):
    p = before_tf(["train", "--config", "configs/tiny.yaml", "--run-dir", str(tmp_path / "r"),
                   *[a for s in sets for a in ("--set", s)]])
    assert p.returncode == 2, p.stderr[-2000:]
    assert message in p.stderr
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


def test_label_noise_redraws_that_fraction_of_the_labels_and_nothing_else():
    spec = preset("eurlex4k", **TINY)
    clean, _ = synthesize(spec)
    noisy, _ = synthesize(preset("eurlex4k", label_noise=0.5, **TINY))
    for name in ("indptr", "indices", "values"):  # the same features, row for row
        assert np.array_equal(getattr(clean, name), getattr(noisy, name))
    changed = np.mean([set(clean.labels[r].indices) != set(noisy.labels[r].indices)
                       for r in range(clean.n_rows)])
    assert 0.42 <= changed <= 0.5  # half redrawn; a few from the same topic by chance
    # label_noise 0 draws exactly what the generator always drew.
    again, _ = synthesize(preset("eurlex4k", label_noise=0.0, **TINY))
    assert np.array_equal(again.label_indices, clean.label_indices)


def test_noisy_rows_take_their_new_labels_in_place_and_the_others_keep_theirs():
    """synth's _replace_rows on flat per-row labels: rows 0 and 3 replaced, 1 (empty) and 2 kept."""
    from hvd_adaptive.data.synth import _replace_rows

    k, labels = np.array([2, 0, 3, 1]), np.array([1, 2, 3, 4, 5, 6])
    k_out, out = _replace_rows(k, labels, np.array([True, False, False, True]),
                               np.array([1, 3]), np.array([9, 7, 8, 6]))
    assert k_out.tolist() == [1, 0, 3, 3]
    assert out.tolist() == [9, 3, 4, 5, 7, 8, 6]


@pytest.fixture(scope="module")
def runs(files, tmp_path_factory):
    """Two 2-rank sync runs on the noisy files, evaluated every epoch with a tenth of the
    training rows held out: 5 epochs ("keep"), and 12 with a patience of 2 ("early")."""
    root = tmp_path_factory.mktemp("validation")
    train_txt, test_txt = files
    data = (f"data.train={train_txt}", f"data.test={test_txt}", "data.validation=0.1",
            "train.eval_every=1")
    spec = {"keep": (root / "keep", (*data, "train.epochs=5")),
            "early": (root / "early", (*data, "train.epochs=12", "train.patience=2"))}
    return {name: (path, s) for (name, (path, _)), s in zip(spec.items(), train_many(2, spec).values())}


@pytest.mark.mpi
def test_the_best_model_is_kept_and_read_by_default(runs, files, tmp_path):
    run_dir, summary = runs["keep"]
    evals = records(run_dir, "eval")
    val = [e["val_p_at_1"] for e in evals]
    best = int(np.argmax(val))
    assert best < len(evals) - 1 and val[-1] < val[best], (
        f"the run's validation P@1 must fall after its best for this test to mean anything: {val}")
    assert summary["kept"]["epoch"] == evals[best]["epoch"]
    kept = list((run_dir / "checkpoints" / "best").iterdir())
    assert [p.name for p in kept] == [f"ckpt-{4 * (best + 1)}"]  # 4 rounds an epoch
    _, test_txt = files
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


@pytest.mark.mpi
def test_the_early_stop_stops_after_its_patience(runs):
    run_dir, summary = runs["early"]
    val = [e["val_p_at_1"] for e in records(run_dir, "eval")]
    best = int(np.argmax(val))
    assert len(val) == best + 1 + 2, val  # two evaluations without gain, then no more
    assert summary["final"]["epoch"] < 12
    assert summary["kept"]["val_p_at_1"] == max(val)


@pytest.mark.mpi
def test_a_fresh_run_in_the_folder_drops_the_old_best(runs, tmp_path):
    run_dir, _ = runs["keep"]
    again = tmp_path / "again"
    shutil.copytree(run_dir, again)
    assert (again / "checkpoints" / "best").is_dir()
    summary = train(2, again, "train.epochs=1")  # the tiny synthetic data, no split
    assert summary["kept"] is None
    assert not (again / "checkpoints" / "best").exists()
    assert [p.name for p in (again / "checkpoints").iterdir()] == ["ckpt-4"]


def test_the_tree_method_trains_on_the_same_rows(files, tmp_path):
    train_txt, test_txt = files
    out = tmp_path / "trees.json"
    p = cli("trees", "--config", "configs/tiny.yaml", "--set", f"data.train={train_txt}",
            "--set", f"data.test={test_txt}", "--set", "data.validation=0.1", "--out", out)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(out.read_text())
    assert (got["train_rows"], got["test_rows"]) == (1800, 500)
    test = load_dataset(test_txt, use_cache=False)
    frequent = np.bincount(load_dataset(train_txt, use_cache=False).label_indices).argmax()
    baseline = np.mean([frequent in test.labels[r].indices for r in range(test.n_rows)])
    assert got["metrics"]["p_at_1"] > baseline + 0.05, (got["metrics"], baseline)
    assert f"P@1 {got['metrics']['p_at_1']:.4f}" in p.stdout


@pytest.mark.mpi
def test_the_accuracy_benchmark_sets_the_kept_model_beside_the_tree(files, tmp_path):
    train_txt, test_txt = files
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
