"""The sampled output layer ([labels x hidden]), and a linear model under the sigmoid loss,
through predict and evaluate, and the exported SavedModel loaded by a process that never imports
hvd_adaptive; runs trained on 2 ranks (trained_run.FILE_RUNS "export" and "linear")."""
import json
import subprocess
import sys

import numpy as np
import pytest

from hvd_adaptive.data import parse_file
from tests.harness.mpirun import mpi_env, records
from tests.harness.trained_run import (check_against_numpy, cli, folder_hash, last_eval, learned_run,
                                       numpy_scores, read_predictions)


# Reads XC rows with plain Python and serves them through the SavedModel's signature.
LOADER = r"""
import json, sys
import numpy as np
import tensorflow as tf
ids, vals, seg = [], [], []
lines = open(sys.argv[2]).read().splitlines()[1:]  # past the XC header
for r, line in enumerate(lines):
    toks = line.split()
    for t in toks[1:] if toks and ":" not in toks[0] else toks:
        i, v = t.split(":")
        ids.append(int(i)); vals.append(float(v)); seg.append(r)
serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
out = serve(feat_ids=tf.constant(ids, tf.int64), feat_vals=tf.constant(vals, tf.float32),
            row_ids=tf.constant(seg, tf.int32), n_rows=tf.constant(len(lines), tf.int32))
# The same request with its non-zeros in reverse order (rows interleaved).
back = serve(feat_ids=tf.constant(ids[::-1], tf.int64), feat_vals=tf.constant(vals[::-1], tf.float32),
             row_ids=tf.constant(seg[::-1], tf.int32), n_rows=tf.constant(len(lines), tf.int32))
assert not any(m.startswith("hvd_adaptive") for m in sys.modules)
print(json.dumps({**{k: v.numpy().tolist() for k, v in out.items()},
                  **{"reversed_" + k: v.numpy().tolist() for k, v in back.items()}}))
"""


@pytest.fixture(scope="module", params=["export", "linear"], ids=["sampled", "linear-sigmoid"])
def run(request, tmp_path_factory, file_runs):
    run_dir, test_txt, before = learned_run(file_runs, request.param)
    out = tmp_path_factory.mktemp("export") / "pred.txt"
    p = cli("predict", run_dir, "--data", test_txt, "--out", out, "--k", 3)
    assert p.returncode == 0, p.stderr[-3000:]
    return run_dir, test_txt, before, out


def test_the_model_predicts_and_evaluates_like_its_run(run, tmp_path):
    run_dir, test_txt, before, out = run
    labels, scores = read_predictions(out)
    check_against_numpy(labels, scores, numpy_scores(run_dir, parse_file(test_txt)))
    p = cli("evaluate", run_dir, "--data", test_txt, "--out", tmp_path / "m.json")
    assert p.returncode == 0, p.stderr[-3000:]
    got, want = json.loads((tmp_path / "m.json").read_text())["metrics"], last_eval(run_dir)
    assert got == pytest.approx({k: want[k] for k in got}, abs=1e-5)
    assert folder_hash(run_dir) == before


def test_export_serves_what_predict_writes(run, tmp_path):
    run_dir, test_txt, before, out = run
    p = cli("export", run_dir, "--out", tmp_path / "model", "--k", 3)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads((tmp_path / "model" / "assets.extra" / "hvd_adaptive.json").read_text())["k"] == 3
    served = subprocess.run([sys.executable, "-c", LOADER, str(tmp_path / "model"), str(test_txt)],
                            cwd=tmp_path, env=dict(mpi_env(), PYTHONPATH=""), capture_output=True,
                            text=True, timeout=120)
    assert served.returncode == 0, served.stderr[-3000:]
    got = json.loads(served.stdout)
    labels, scores = read_predictions(out)
    np.testing.assert_array_equal(np.array(got["labels"]), labels)
    np.testing.assert_allclose(np.array(got["scores"]), scores, rtol=1e-5)
    # A request's non-zeros may come in any order.
    np.testing.assert_array_equal(np.array(got["reversed_labels"]), labels)
    np.testing.assert_allclose(np.array(got["reversed_scores"]), scores, rtol=1e-5)
    assert folder_hash(run_dir) == before


def test_a_linear_run_records_its_weights_start_and_its_rate(file_runs):
    """The linear run (optim.initial_accumulator_rows and optim.lr auto) starts its weights'
    accumulators at LINEAR_ROWS_START and trains at LINEAR_RATE, both in its start record; the
    sampled network's run starts its row-sparse layers at 0."""
    from hvd_adaptive.config import LINEAR_ROWS_START
    from hvd_adaptive.train.tune import LINEAR_RATE

    runs, _ = file_runs
    start = records(runs["linear"], "start")[0]
    assert start["rows_start"] == pytest.approx(LINEAR_ROWS_START)
    assert start["lr"] == pytest.approx(LINEAR_RATE) and start["lr_choice"]["linear"]
    assert records(runs["export"], "start")[0]["rows_start"] == 0.0
