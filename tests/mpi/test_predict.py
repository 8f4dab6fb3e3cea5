"""predict and evaluate on one run trained on 2 ranks (full softmax): the trainer's numbers, a
numpy forward pass of the checkpoint, 1 against 2 ranks, the run folder untouched, and each bad
input's message."""
import json
import shutil

import pytest

from hvd_adaptive.cli import main
from hvd_adaptive.data import parse_file
from hvd_adaptive.model.metrics import finalize, metric_sums
from tests.harness.trained_run import (check_against_numpy, cli, folder_hash, last_eval, learned_run,
                                       numpy_scores, read_predictions)


@pytest.fixture(scope="module")
def run(tmp_path_factory, file_runs):
    """(run folder, test file, folder hash after training, 1-process prediction file)."""
    run_dir, test_txt, before = learned_run(file_runs, "predict")
    out = tmp_path_factory.mktemp("predict") / "pred-1.txt"
    # 128 rows a step: 4 steps over the 500 rows, so 2 ranks below really split them.
    p = cli("predict", run_dir, "--data", test_txt, "--out", out, "--batch-rows", 128,
            "--progress-every", 0)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "predict: 500 rows" in p.stderr and "predicted 500 rows" in p.stderr
    return run_dir, test_txt, before, out


def test_predictions_are_the_models_and_the_runs_top_k(run):
    run_dir, test_txt, before, out = run
    labels, scores = read_predictions(out)
    test = parse_file(test_txt)
    assert labels.shape == (test.n_rows, 5)
    # The trainer's last evaluation ranked the same top 5: its P@k and nDCG@k follow from ours.
    ours = finalize(metric_sums(labels, test.label_indptr, test.label_indices))
    want = last_eval(run_dir)
    for name, value in ours.items():
        assert round(value, 5) == pytest.approx(want[name], abs=1e-5), name
    check_against_numpy(labels, scores, numpy_scores(run_dir, test))
    assert folder_hash(run_dir) == before


def test_predict_on_two_ranks_writes_the_same_file(run, tmp_path):
    run_dir, test_txt, before, out = run
    two = tmp_path / "pred-2.txt"
    p = cli("predict", run_dir, "--data", test_txt, "--out", two, "--batch-rows", 128, ranks=2)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "on 2 rank(s)" in p.stderr
    assert two.read_bytes() == out.read_bytes()
    assert folder_hash(run_dir) == before


def test_evaluate_equals_the_runs_last_evaluation(run, tmp_path):
    run_dir, test_txt, before, _ = run
    p = cli("evaluate", run_dir, "--data", test_txt, "--out", tmp_path / "m.json")
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads((tmp_path / "m.json").read_text())
    want = last_eval(run_dir)
    names = [f"{m}_at_{k}" for m in ("p", "ndcg", "psp", "psndcg") for k in (1, 3, 5)]
    assert got["rows"] == 500
    assert {n: got["metrics"][n] for n in names} == pytest.approx({n: want[n] for n in names}, abs=1e-5)
    assert f"P@1 {want['p_at_1']:.4f}" in p.stdout
    assert folder_hash(run_dir) == before


def test_feature_beyond_the_model_names_the_line(run, tmp_path):
    run_dir, *_ = run
    bad = tmp_path / "bad.txt"
    bad.write_text("3 5:1.0 7:0.5\n1,2 1999:1.0 2000:0.5\n")  # LIBSVM; the model has 2,000 features
    p = cli("predict", run_dir, "--data", bad, "--out", tmp_path / "o.txt")
    assert p.returncode == 2
    assert f"hvd-adaptive: error: {bad}:2: feature index 2000 out of range (must be < n_features=2000)" in p.stderr
    assert not (tmp_path / "o.txt").exists() and not list(tmp_path.glob("o.txt.tmp-*"))


def _error(capsys, *argv) -> str:
    """Runs the CLI in this process (these errors come before TensorFlow starts)."""
    assert main([str(a) for a in argv]) == 2
    return capsys.readouterr().err


def test_run_errors_come_before_tensorflow(run, tmp_path, capsys):
    run_dir, test_txt, *_ = run
    out = tmp_path / "o.txt"
    err = _error(capsys, "predict", run_dir, "--data", test_txt, "--out", out, "--k", 101)
    assert "hvd-adaptive: error: --k 101: must be between 1 and the model's 100 labels" in err
    err = _error(capsys, "predict", run_dir, "--data", tmp_path / "none.txt", "--out", out)
    assert "none.txt: data file not found (--data)" in err
    # A run folder without a complete checkpoint.
    empty = tmp_path / "empty"
    (empty / "checkpoints").mkdir(parents=True)
    shutil.copy(run_dir / "config.json", empty)
    err = _error(capsys, "evaluate", empty, "--data", test_txt)
    assert f"hvd-adaptive: error: {empty / 'checkpoints'}: no checkpoint" in err
    # A damaged checkpoint: an error naming it, and nothing renamed (resume would quarantine it).
    copy = tmp_path / "damaged"
    shutil.copytree(run_dir, copy)
    ckpt = next((copy / "checkpoints").glob("ckpt-*"))
    arr = ckpt / "model.2.npy"
    data = bytearray(arr.read_bytes())
    data[-1] ^= 0xFF
    arr.write_bytes(bytes(data))
    before = folder_hash(copy)
    err = _error(capsys, "export", copy, "--out", tmp_path / "model")
    assert f"hvd-adaptive: error: {ckpt}: model.2.npy does not match its checksum (damaged)" in err
    assert folder_hash(copy) == before
    assert not (tmp_path / "model").exists()
