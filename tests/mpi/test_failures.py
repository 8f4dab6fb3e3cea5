"""Fail fast, never hang: an exception on one rank, bad input files and settings, NaN loss.

Each case runs the real CLI (under mpirun where ranks matter) on small files written here and
asserts the one line that tells the user what went wrong. Input errors the CLI sees before MPI
starts are tested in one process (here, and in tests/test_cli.py), which must end before it
imports TensorFlow; one of them runs here under mpirun.
"""
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from hvd_adaptive.data import preset, synthesize, write_xc
from mpirun import REPO, before_tf, job_group, mpi_env, mpirun, run

def cli(args: list[str], ranks: int = 2, **env: str) -> subprocess.CompletedProcess:
    """`hvd-adaptive train --config configs/tiny.yaml ARGS` on `ranks` ranks (1: no launcher;
    0: one process that must end before TensorFlow starts, see mpirun.before_tf)."""
    argv = ["train", "--config", "configs/tiny.yaml", *args]
    if ranks > 1:
        return mpirun(ranks, ["-m", "hvd_adaptive.cli", *argv], timeout=120, **env)
    if ranks == 0:
        return before_tf(argv, **env)
    return run([sys.executable, "-m", "hvd_adaptive.cli", *argv], 120, mpi_env(**env))


def sets(**kv) -> list[str]:
    return [a for k, v in kv.items() for a in ("--set", f"{k.replace('__', '.')}={v}")]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Small XC files: a train/test pair, a test file with other features, a 2-row train file."""
    d = tmp_path_factory.mktemp("data")
    spec = dict(scale=0.1, n_train=200, n_test=50, n_labels=20, nnz_mean=10, labels_mean=2)
    train, test = synthesize(preset("eurlex4k", n_features=300, **spec))
    _, other = synthesize(preset("eurlex4k", n_features=250, **spec))
    for name, ds in (("train", train), ("test", test), ("test250", other),
                     ("two", train.subset(np.arange(2)))):
        write_xc(d / f"{name}.txt", ds)
    return d


@pytest.mark.mpi
def test_exception_on_rank1_ends_the_job_fast(tmp_path):
    """Timed from the line printed just before the training loop, so start-up under a busy
    machine does not count; a hang would run into the 120 s timeout instead."""
    argv = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", sys.executable, "-m",
            "hvd_adaptive.cli", "train", "--config", "configs/tiny.yaml", "--run-dir",
            str(tmp_path / "r")]
    env = mpi_env(HVD_ADAPTIVE_FAIL_AT_ROUND="3", HVD_ADAPTIVE_FAIL_RANK="1")
    lines = []  # (time seen, line); a thread reads so that a hang still meets the timeout
    with job_group(argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                   text=True) as job:
        reader = threading.Thread(target=lambda: lines.extend((time.time(), x) for x in job.stdout))
        reader.start()
        try:
            job.wait(timeout=120)
        finally:  # the reader ends once every process holding the pipe is gone
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.pid, signal.SIGKILL)
            reader.join()
    t_end = time.time()
    out = "".join(x for _, x in lines)
    t_loop = next((t for t, x in lines if "standalone rows/s" in x), None)
    assert t_loop is not None and job.returncode != 0, out[-2000:]
    assert t_end - t_loop < 30, f"took {t_end - t_loop:.0f} s after training started"
    assert "[rank 1] error: RuntimeError: injected failure at round 3" in out, out[-2000:]


@pytest.mark.mpi
def test_an_input_error_before_mpi_ends_a_two_rank_job_cleanly(tmp_path, files):
    # Both ranks stop before MPI starts (run.check_inputs): mpirun must end the job with their
    # one line each, no traceback and no hang (the timeout is 120 s).
    p = cli(["--run-dir", str(tmp_path / "r")]
            + sets(data__train=tmp_path / "nope.txt", data__test=files / "test.txt"))
    assert p.returncode != 0
    line = f"hvd-adaptive: error: {tmp_path / 'nope.txt'}: data file not found (data.train)"
    assert p.stderr.count(line) == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert not (tmp_path / "r").exists()  # no rank got as far as the run folder


def test_test_file_with_other_feature_count(tmp_path, files):
    # Seen in the files' headers before MPI and TensorFlow start (data.check_sources).
    p = cli(["--run-dir", str(tmp_path / "r")]
            + sets(data__train=files / "train.txt", data__test=files / "test250.txt"), ranks=0)
    assert p.returncode == 2, p.stderr[-2000:]
    assert (f"{files / 'test250.txt'}:1: header says n_features=250 but 300 was expected"
            in p.stderr), p.stderr[-2000:]


@pytest.mark.mpi
def test_more_ranks_than_rows(tmp_path, files):
    p = cli(["--run-dir", str(tmp_path / "r")]
            + sets(data__train=files / "two.txt", data__test=files / "test.txt", train__batch_size=1),
            ranks=3)
    # Seen before MPI and TensorFlow start: the header's rows against mpirun's job size
    # (run.launched_ranks), in one line (mpirun may end the other ranks before they print
    # theirs), no run folder. After MPI starts the line would read "[rank r] error: ...".
    assert p.returncode != 0
    line = f"hvd-adaptive: error: {files / 'two.txt'}: only 2 training rows for 3 ranks; run at most 2 ranks"
    assert line in p.stderr and "Traceback" not in p.stderr and "[rank" not in p.stderr, p.stderr[-2000:]
    assert not (tmp_path / "r").exists()


def test_more_ranks_than_synthetic_rows_where_the_launcher_says_the_size():
    from hvd_adaptive.config import load_config
    from hvd_adaptive.data import DataError, check_sources

    cfg, _ = load_config("configs/tiny.yaml", ["data.synth.n_train=2"])
    assert check_sources(cfg, ranks=2) == 2 and check_sources(cfg) == 2
    with pytest.raises(DataError, match="the synthetic training set: only 2 training rows for 3 ranks"):
        check_sources(cfg, ranks=3)


def test_batch_larger_than_data(tmp_path, files):
    p = cli(["--run-dir", str(tmp_path / "r")] + sets(
        data__train=files / "train.txt", data__test=files / "test.txt", train__batch_size=500),
        ranks=0)  # the training file's header has the row count: before TensorFlow starts
    assert p.returncode == 2, p.stderr[-2000:]
    assert "train.batch_size: 500 is larger than the 200 training rows" in p.stderr, p.stderr


@pytest.mark.mpi
def test_nan_loss_stops_with_a_clear_message_and_no_bad_checkpoint(tmp_path):
    run = tmp_path / "r"
    p = cli(["--run-dir", str(run)] + sets(optim__lr="1.0e+30", checkpoint__every=1))
    assert p.returncode != 0
    assert "FloatingPointError: loss became" in p.stderr and "lower optim.lr" in p.stderr, p.stderr


@pytest.mark.mpi
def test_a_model_gone_nan_keeps_the_last_good_checkpoints(tmp_path):
    # The test hook writes NaN into the model at the start of round 6: rounds 0-5 ended with a
    # checkpoint each (the newest 3 kept), round 6's loss is NaN and no checkpoint follows it.
    run = tmp_path / "r"
    p = cli(["--run-dir", str(run)] + sets(checkpoint__every=1), HVD_ADAPTIVE_FAIL_AT_ROUND="6",
            HVD_ADAPTIVE_FAIL_KIND="nan")
    assert p.returncode != 0
    assert "FloatingPointError: loss became nan" in p.stderr and "(round 6)" in p.stderr, p.stderr
    from hvd_adaptive.train import checkpoint as ck

    kept = sorted(c.name for c in (run / "checkpoints").glob("ckpt-*"))
    assert kept == ["ckpt-4", "ckpt-5", "ckpt-6"], kept
    for c in (run / "checkpoints").glob("ckpt-*"):
        assert ck.all_finite(ck.load(c)[0])
