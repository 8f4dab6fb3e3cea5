"""Fail fast, never hang, on real ranks: an exception on one rank, an input error under mpirun,
more ranks than rows, NaN loss and weights; each asserts the one line that tells the user."""
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

from tests.harness.mpirun import REPO, job_group, mpi_env, mpirun, set_args, train_tiny

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


def test_an_input_error_before_mpi_ends_a_two_rank_job_cleanly(tmp_path, small_files):
    # Both ranks stop before MPI starts (run.check_inputs): mpirun must end the job with their
    # one line each, no traceback and no hang (the timeout is 120 s).
    p = train_tiny(["--run-dir", str(tmp_path / "r")]
            + set_args(data__train=tmp_path / "nope.txt", data__test=small_files / "test.txt"))
    assert p.returncode != 0
    line = f"hvd-adaptive: error: {tmp_path / 'nope.txt'}: data file not found (data.train)"
    assert p.stderr.count(line) == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert not (tmp_path / "r").exists()  # no rank got as far as the run folder


def test_more_ranks_than_rows(tmp_path, small_files):
    p = train_tiny(["--run-dir", str(tmp_path / "r")]
            + set_args(data__train=small_files / "two.txt", data__test=small_files / "test.txt", train__batch_size=1),
            ranks=3)
    # Seen before MPI and TensorFlow start: the header's rows against mpirun's job size
    # (run.launched_ranks), in one line (mpirun may end the other ranks before they print
    # theirs), no run folder. After MPI starts the line would read "[rank r] error: ...".
    assert p.returncode != 0
    line = f"hvd-adaptive: error: {small_files / 'two.txt'}: only 2 training rows for 3 ranks; run at most 2 ranks"
    assert line in p.stderr and "Traceback" not in p.stderr and "[rank" not in p.stderr, p.stderr[-2000:]
    assert not (tmp_path / "r").exists()


def test_nan_loss_stops_with_a_clear_message_and_no_bad_checkpoint(tmp_path):
    run = tmp_path / "r"
    p = train_tiny(["--run-dir", str(run)] + set_args(optim__lr="1.0e+30", checkpoint__every=1))
    assert p.returncode != 0
    assert "FloatingPointError: loss became" in p.stderr and "lower optim.lr" in p.stderr, p.stderr


def test_a_model_gone_nan_keeps_the_last_good_checkpoints(tmp_path):
    # The test hook writes NaN into the model at the start of round 6: rounds 0-5 ended with a
    # checkpoint each (the newest 3 kept), round 6's loss is NaN and no checkpoint follows it.
    run = tmp_path / "r"
    p = train_tiny(["--run-dir", str(run)] + set_args(checkpoint__every=1), HVD_ADAPTIVE_FAIL_AT_ROUND="6",
            HVD_ADAPTIVE_FAIL_KIND="nan")
    assert p.returncode != 0
    assert "FloatingPointError: loss became nan" in p.stderr and "(round 6)" in p.stderr, p.stderr
    from hvd_adaptive.train import checkpoint as ck

    kept = sorted(c.name for c in (run / "checkpoints").glob("ckpt-*"))
    assert kept == ["ckpt-4", "ckpt-5", "ckpt-6"], kept
    for c in (run / "checkpoints").glob("ckpt-*"):
        assert ck.all_finite(ck.load(c)[0])


def test_runs_of_one_job_that_ask_a_rank_for_other_threads_are_refused(tmp_path):
    """Thread pools are sized once, when TensorFlow starts (run.start_ranks): several runs in one
    job (the harness's train_runs.py) that resolve to other threads for a rank stop before it."""
    specs = []
    for threads in (1, 2):
        spec = tmp_path / f"t{threads}.run.json"
        spec.write_text(json.dumps({"config": "configs/tiny.yaml", "run_dir": str(tmp_path / f"r{threads}"),
                                    "sets": [f"train.threads={threads}"]}))
        specs.append(str(spec))
    p = mpirun(2, ["tests/harness/train_runs.py", *specs], timeout=120)
    assert p.returncode != 0
    assert "runs in one job must give rank 0 the same threads and Horovod cycle, got threads [1, 2]" in p.stderr, \
        p.stderr[-2000:]
    assert not (tmp_path / "r1" / "metrics.jsonl").exists()  # nothing trained
