"""The real CLI end to end: synthetic files written by `data synth`, then trained on. The default
config's run is test_launch.py's."""
import json
import subprocess
import sys

from tests.harness.mpirun import REPO, mpi_env
from tests.harness.trained_run import cli


def test_train_on_files_written_by_data_synth(tmp_path):
    p = cli("data", "synth", "--preset", "eurlex4k", "--scale", "0.05", "--n-train", "1500",
            "--n-test", "300", "--n-features", "1000", "--n-labels", "60", "--out", str(tmp_path / "d"))
    assert p.returncode == 0, p.stderr
    train_txt = tmp_path / "d" / "train.txt"
    assert train_txt.read_text().splitlines()[0] == "1500 1000 60"  # XC header
    run = tmp_path / "run"
    p = cli("train", "--config", "configs/tiny.yaml", "--run-dir", str(run),
            "--set", f"data.train={train_txt}", "--set", f"data.test={tmp_path / 'd' / 'test.txt'}")
    assert p.returncode == 0, p.stderr[-3000:]
    s = json.loads((run / "summary.json").read_text())
    assert s["ranks"] == 1 and s["final"]["p_at_1"] > s["baseline_p_at_1"] + 0.1
    assert (tmp_path / "d" / "train.txt.hvdcache" / "meta.json").is_file()  # parsed once, cached
    used = json.loads((run / "config.json").read_text())  # what the run used, not None
    assert used["train"]["threads"] >= 1 and used["hogbatch"]["cpu_threads"] == used["train"]["threads"]
    assert used["adaptive"]["b_max"] == used["hogbatch"]["gpu_batch"] == 64  # tiny's batch size
    assert "eval  epoch" in p.stdout and "done: P@1" in p.stdout


def test_hidden_auto_trains_and_records_a_linear_model_where_it_fits(tmp_path):
    """model.hidden auto (the default) on tiny's 2,000 features x 100 labels with rows of 8
    non-zeros: the run trains a linear model with the sigmoid loss, says so, and its config.json
    records it (predict, evaluate and export build the model from it); the plain Horovod script
    takes the same."""
    import numpy as np
    from hvd_adaptive.config import LINEAR_ROWS_START

    auto = ("--set", "model.hidden=auto", "--set", "train.epochs=0.25",
            "--set", "data.synth.nnz_mean=8")
    run = tmp_path / "run"
    p = cli("train", "--config", "configs/tiny.yaml", "--run-dir", str(run), *auto)
    assert p.returncode == 0, p.stderr[-3000:]
    used = json.loads((run / "config.json").read_text())["model"]
    assert (used["hidden"], used["loss"], used["output"]) == ([], "sigmoid", "full")
    assert ("model.hidden auto: [] (a linear model: 2,000 features x 100 labels = 200,000 "
            "weights") in p.stdout and "model.loss auto: sigmoid" in p.stdout
    assert "non-zeros in mean, at most 16)" in p.stdout
    # Its weights start their accumulators above zero (optim.initial_accumulator_rows auto).
    assert (f"optim.initial_accumulator_rows auto: a linear model's weights start their "
            f"accumulators at {LINEAR_ROWS_START:g}") in p.stdout
    head = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert head["event"] == "start" and head["rows_start"] == LINEAR_ROWS_START
    ckpt = next((run / "checkpoints").glob("ckpt-*"))
    assert np.load(ckpt / "model.0.npy", mmap_mode="r").shape == (2000, 100)
    p = subprocess.run([sys.executable, "-m", "hvd_adaptive.bench.plain_horovod", "--config",
                        "configs/tiny.yaml", "--run-dir", str(tmp_path / "plain"), *auto],
                       cwd=REPO, env=mpi_env(), capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    start = json.loads((tmp_path / "plain" / "metrics.jsonl").read_text().splitlines()[0])
    assert (start["hidden"], start["loss"], start["output"]) == ([], "sigmoid", "full")


def test_output_auto_trains_and_records_the_sampled_loss_at_many_labels(tmp_path):
    """model.output auto (the default) at SAMPLED_FROM_LABELS labels: the run trains the sampled
    loss with negatives by frequency and its config.json says so (predict, evaluate and export
    read the model's layout from it); the plain Horovod script takes the same loss."""
    from hvd_adaptive.config import SAMPLED_FROM_LABELS
    import numpy as np

    many = ("--set", f"data.synth.n_labels={SAMPLED_FROM_LABELS}", "--set", "model.negatives=64",
            "--set", "train.epochs=0.25", "--set", "optim.lr=0.1")
    run = tmp_path / "run"
    p = cli("train", "--config", "configs/tiny.yaml", "--run-dir", str(run), *many)
    assert p.returncode == 0, p.stderr[-3000:]
    used = json.loads((run / "config.json").read_text())["model"]
    assert (used["output"], used["sampler"]) == ("sampled", "frequency")
    assert f"model.output auto: sampled (64 negatives by frequency a batch) for {SAMPLED_FROM_LABELS} labels" in p.stdout
    ckpt = next((run / "checkpoints").glob("ckpt-*"))
    assert np.load(ckpt / "model.2.npy", mmap_mode="r").shape == (SAMPLED_FROM_LABELS, 64)
    p = subprocess.run([sys.executable, "-m", "hvd_adaptive.bench.plain_horovod", "--config",
                        "configs/tiny.yaml", "--run-dir", str(tmp_path / "plain"), *many],
                       cwd=REPO, env=mpi_env(), capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    start = json.loads((tmp_path / "plain" / "metrics.jsonl").read_text().splitlines()[0])
    assert start["event"] == "start" and start["output"] == "sampled"
