"""The validation split, label noise and rare features without ranks: the split's rows against
the training and test files, impossible settings, noisy labels in place, rare features added to
every row, and napkinXC's tree on the same rows."""
import json

import numpy as np
import pytest

from hvd_adaptive.config import load_config
from hvd_adaptive.data import load_dataset, preset, split_validation, synthesize
from tests.harness.mpirun import before_tf
from tests.harness.trained_run import TINY, cli


def _config(tmp_path, *sets):
    return load_config("configs/tiny.yaml", list(sets))[0]


def _rows(ds) -> set:
    """Each row as (features, values, labels) bytes: a row's content, wherever it sits."""
    f, y = ds.features, ds.labels
    return {(f[r].indices.tobytes(), f[r].data.tobytes(), np.sort(y[r].indices).tobytes())
            for r in range(ds.n_rows)}


def test_the_split_is_carved_from_the_training_rows_only(noisy_files, tmp_path):
    train_txt, test_txt = noisy_files
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
    (("data.synth.rare_features=-1",), "data.synth.rare_features: must be >= 0, got -1"),
    (("optim.plateau=0",), "optim.plateau: a factor in (0, 1] (1: no cut), got 0"),
    (("optim.plateau=1.5",), "optim.plateau: a factor in (0, 1] (1: no cut), got 1.5"),
    (("optim.plateau_epochs=0",), "optim.plateau_epochs: must be > 0, got 0"),
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


def test_rare_features_add_features_of_few_rows_to_every_row_and_nothing_else():
    """Every row keeps its features and labels and gains as many features again, each in a row
    or two of the data set, where its own are shared by many."""
    spec = dict(TINY, n_features=200_000)  # room for features of a row or two
    clean, _ = synthesize(preset("eurlex4k", **spec))
    rare, _ = synthesize(preset("eurlex4k", rare_features=1.0, **spec))
    assert np.array_equal(rare.label_indptr, clean.label_indptr)
    assert np.array_equal(rare.label_indices, clean.label_indices)
    added = []
    for r in range(clean.n_rows):
        old, new = set(clean.features[r].indices), set(rare.features[r].indices)
        assert old <= new, r  # every row keeps its features and gains as many again
        added += sorted(new - old)
    assert 1.95 <= rare.indptr[-1] / clean.indptr[-1] <= 2.0
    rows_with = np.bincount(rare.indices, minlength=spec["n_features"])
    assert np.median(rows_with[added]) <= 2 < 10 <= np.median(rows_with[clean.indices])


def test_noisy_rows_take_their_new_labels_in_place_and_the_others_keep_theirs():
    """synth's _replace_rows on flat per-row labels: rows 0 and 3 replaced, 1 (empty) and 2 kept."""
    from hvd_adaptive.data.synth import _replace_rows

    k, labels = np.array([2, 0, 3, 1]), np.array([1, 2, 3, 4, 5, 6])
    k_out, out = _replace_rows(k, labels, np.array([True, False, False, True]),
                               np.array([1, 3]), np.array([9, 7, 8, 6]))
    assert k_out.tolist() == [1, 0, 3, 3]
    assert out.tolist() == [9, 3, 4, 5, 7, 8, 6]


@pytest.mark.parametrize("method, model", [("plt", "PLT"), ("br", "BR")])
def test_the_tree_method_trains_on_the_same_rows(noisy_files, tmp_path, method, model):
    train_txt, test_txt = noisy_files
    out = tmp_path / "trees.json"
    p = cli("trees", "--config", "configs/tiny.yaml", "--set", f"data.train={train_txt}",
            "--set", f"data.test={test_txt}", "--set", "data.validation=0.1", "--out", out,
            "--method", method)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(out.read_text())
    assert (got["method"], got["model"]) == (f"napkinxc-{method}", model)
    assert (got["train_rows"], got["test_rows"]) == (1800, 500)
    test = load_dataset(test_txt, use_cache=False)
    frequent = np.bincount(load_dataset(train_txt, use_cache=False).label_indices).argmax()
    baseline = np.mean([frequent in test.labels[r].indices for r in range(test.n_rows)])
    assert got["metrics"]["p_at_1"] > baseline + 0.05, (got["metrics"], baseline)
    assert f"P@1 {got['metrics']['p_at_1']:.4f}" in p.stdout




def test_the_rate_is_cut_after_the_plateau_s_epochs_without_a_gain_and_again_after_as_many():
    """optim.plateau's rule on recorded evaluations every half epoch, a plateau of 1 epoch:
    no cut half an epoch after the best, a cut a whole epoch after it, the next a whole epoch
    after that cut, none once the validation P@1 rises again; records without it count not."""
    from hvd_adaptive.train.trainer import plateau_cut

    val = {0.5: 0.30, 1.0: 0.40, 1.5: 0.39, 2.0: 0.40, 2.5: 0.38, 3.0: 0.39, 3.5: 0.41,
           4.0: 0.41, 4.5: 0.30}
    evals, cut_at = [], []
    for epoch, v in val.items():
        evals.append({"epoch": epoch - 0.25})  # a record without a split's P@1: not counted
        evals.append({"epoch": epoch, "val_p_at_1": v})
        if plateau_cut(evals, 1.0):
            cut_at.append(epoch)
    assert cut_at == [2.0, 3.0, 4.5]
    assert not plateau_cut(evals[:-2], 1.0) and plateau_cut(evals, 0.5)
    assert not plateau_cut([*evals, {"epoch": 5.0}], 1.0)  # the last record has none
    assert not plateau_cut([], 1.0)


def test_data_synth_writes_rare_features_and_refuses_a_negative_factor(tmp_path):
    size = ("--preset", "eurlex4k", "--n-train", "300", "--n-test", "50", "--n-features", "50000",
            "--n-labels", "40")
    for name, extra in (("clean", ()), ("rare", ("--rare-features", "2"))):
        p = cli("data", "synth", *size, *extra, "--out", tmp_path / name)
        assert p.returncode == 0, p.stderr[-2000:]
    clean, rare = (load_dataset(tmp_path / n / "train.txt", use_cache=False) for n in ("clean", "rare"))
    assert np.array_equal(rare.label_indices, clean.label_indices)
    assert 2.8 <= rare.indptr[-1] / clean.indptr[-1] <= 3.0
    p = cli("data", "synth", *size, "--rare-features", "-1", "--out", tmp_path / "bad")
    assert p.returncode == 2 and "--rare-features -1.0: must be >= 0" in p.stderr
    assert not (tmp_path / "bad").exists()
