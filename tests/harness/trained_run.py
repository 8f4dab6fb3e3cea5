"""Harness of the predict/evaluate/export tests: a tiny trained run on files, and a numpy
forward pass of a checkpoint as the independent reference for labels and scores."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from hvd_adaptive.data import preset, synth_to_files
from tests.harness.mpirun import REPO, mpi_env, mpirun, records, train_many

# configs/tiny.yaml's data (2,000 train / 500 test rows, 2,000 features, 100 labels) as files.
TINY = dict(scale=0.1, n_train=2000, n_test=500, n_features=2000, n_labels=100, nnz_mean=30,
            labels_mean=2)


# The runs the predict, evaluate and export tests read (conftest's `file_runs`), each on 2 ranks
# (sync unless named), which must learn:
FILE_RUNS = {
    # with the proportional split (LB-BSP), which must learn like the others (test_resume)
    "predict": ("sync.partition=proportional",),
    # with the sampled output layer: three row-sparse gradients (input layer, output layer,
    # output bias) in its allreduce
    "export": ("model.output=sampled", "model.negatives=20", "model.sampler=frequency"),
    # a linear model under the sigmoid loss, trained by adaptive SGD (its merges carry the
    # [features x labels] layer's touched rows) with row-wise Adagrad from its weights' own
    # start at the rate optim.lr auto chooses (the shipped configs' optimizer)
    "linear": ("model.hidden=[]", "model.loss=sigmoid", "train.algorithm=adaptive",
               "optim.name=rowwise_adagrad", "optim.lr=auto"),
}


def trained_runs(root: Path, ranks: int, runs: dict[str, tuple[str, ...]]) -> tuple[dict[str, Path], Path]:
    """Writes the tiny data as XC files once and trains every run on them, one after another
    in one job; returns ({name: run folder}, test file)."""
    train_txt, test_txt = synth_to_files(preset("eurlex4k", **TINY), root / "data")
    data = (f"data.train={train_txt}", f"data.test={test_txt}", "train.epochs=4")
    train_many(ranks, {name: (root / name / "run", (*data, *sets)) for name, sets in runs.items()})
    return {name: root / name / "run" for name in runs}, test_txt


def learned_run(file_runs, name: str) -> tuple[Path, Path, str]:
    """One of the session's trained runs (conftest.file_runs), checked to have learned: (its
    folder, the test file, the folder's hash before anything reads it)."""
    runs, test_txt = file_runs
    run_dir = runs[name]
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["final"]["p_at_1"] > s["baseline_p_at_1"] + 0.2, s["final"]
    return run_dir, test_txt, folder_hash(run_dir)


def last_eval(run: Path) -> dict:
    return records(run, "eval")[-1]


def cli(*args: str, ranks: int = 0, timeout: float = 240) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess, or under mpirun on `ranks` ranks."""
    argv = ["-m", "hvd_adaptive.cli", *map(str, args)]
    if ranks:
        return mpirun(ranks, argv, timeout=timeout)
    return subprocess.run([sys.executable, *argv], cwd=REPO, env=mpi_env(), capture_output=True,
                          text=True, timeout=timeout)


def folder_hash(path: Path) -> str:
    """sha256 over every file's relative name and bytes (and every folder's name)."""
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        h.update(str(p.relative_to(path)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def read_predictions(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """A predict output file as ([rows x k] labels, [rows x k] scores)."""
    pairs = [[tok.split(":") for tok in line.split()] for line in path.read_text().splitlines()]
    return (np.array([[int(a) for a, _ in row] for row in pairs]),
            np.array([[float(b) for _, b in row] for row in pairs]))


def numpy_scores(run: Path, ds) -> np.ndarray:
    """Every label's score for every row of `ds` from the newest checkpoint's arrays, in
    float64 numpy: the softmax over all labels of a one-hidden-layer network (model.0 ..
    model.3: input kernel, bias, output kernel, bias), or under model.loss sigmoid each
    label's sigmoid of a linear model (model.hidden [], model.0, model.1: kernel, bias)."""
    ckpt = max((run / "checkpoints").glob("ckpt-*"), key=lambda p: int(p.name.split("-")[1]))
    config = json.loads((run / "config.json").read_text())
    linear = not config["model"]["hidden"]
    arrays = [np.load(ckpt / f"model.{i}.npy").astype(np.float64) for i in range(2 if linear else 4)]
    x = np.zeros((ds.n_rows, ds.n_features))
    rows = np.repeat(np.arange(ds.n_rows), np.diff(ds.indptr))
    np.add.at(x, (rows, ds.indices), ds.values)
    if linear:
        w, b = arrays
        z = x @ w + b
    else:
        w0, b0, w1, b1 = arrays
        if config["model"]["output"] == "sampled":
            w1 = w1.T  # stored [labels x hidden]
        z = np.maximum(x @ w0 + b0, 0) @ w1 + b1
    if config["model"]["loss"] == "sigmoid":
        return 1.0 / (1.0 + np.exp(-z))
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=1, keepdims=True)


def check_against_numpy(labels: np.ndarray, scores: np.ndarray, probs: np.ndarray) -> None:
    """Predicted scores are the reference probabilities of the predicted labels, and no label
    left out scores higher than the k-th (ties within float32 noise allowed)."""
    picked = np.take_along_axis(probs, labels, axis=1)
    np.testing.assert_allclose(scores, picked, rtol=1e-4, atol=1e-7)
    kth = np.sort(probs, axis=1)[:, -labels.shape[1]]
    np.testing.assert_allclose(picked[:, -1], kth, rtol=1e-4, atol=1e-7)
    assert (np.diff(scores, axis=1) <= 0).all()  # best first
