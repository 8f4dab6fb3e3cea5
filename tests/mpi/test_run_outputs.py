"""What real 2-rank runs leave behind: TensorBoard events beside metrics.jsonl holding the
records' scalars, the clock and calibration around evaluations and quotas, and a stderr
without TensorFlow's start-up messages that still shows errors."""
import json

import pytest

from tests.harness.mpirun import mpirun, records, start_up_lines
from tests.harness.events import read_events

# The environment asks for every message: the run must keep them back unless --verbose.
LOUD = {"TF_CPP_MIN_LOG_LEVEL": "0"}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("outputs") / "run"
    # Rank 1 enters its quota and leaves every evaluation 1.5 s late (test hooks): neither may
    # reach the calibration or the training clock. Windows of 128 rows are raised to two
    # batches of 64 a rank.
    p = mpirun(2, ["-m", "hvd_adaptive.cli", "train", "--config", "configs/tiny.yaml",
                   "--run-dir", str(run_dir), "--set", "train.epochs=2", "--set", "train.eval_every=1",
                   "--set", "train.window_samples=128"],
               HVD_ADAPTIVE_SLOW_EVAL=f"1:{SLOW_EVAL_S}", HVD_ADAPTIVE_SLOW_START=f"1:{SLOW_EVAL_S}",
               **LOUD)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stderr[-3000:]}"
    return run_dir, p


SLOW_EVAL_S = 1.5


def test_a_rank_that_leaves_an_evaluation_late_costs_the_training_clock_nothing(finished):
    # The windows after an evaluation start together (trainer.evaluate ends in a barrier);
    # without it rank 0 waited for rank 1 in the next window's first allreduce, on the clock.
    rounds = records(finished[0], "round")
    walls = [0.0] + [r["wall_s"] for r in rounds]
    longest = max(b - a for a, b in zip(walls, walls[1:]))
    late = finished[1].stderr.count("test hook HVD_ADAPTIVE_SLOW_EVAL: 1.5 s late")
    assert late == len(records(finished[0], "eval")), finished[1].stderr[-2000:]  # every one was late
    assert records(finished[0], "eval")[0]["epoch"] == 1.0  # and rounds followed it:
    assert any(r["epoch"] > 1 for r in rounds), rounds
    assert longest < SLOW_EVAL_S / 2, f"a round took {longest:.2f} s: {walls}"


def test_no_rank_calibrates_before_every_rank_is_in_its_quota(finished):
    # A barrier before the calibration: without it rank 0 calibrated while rank 1 was still
    # starting up (on full cores, where a quota was due) and then waited for it in the rates'
    # allgather, which calibration_s (rank 0's calibration and that allgather) counts.
    start = records(finished[0], "start")[0]
    assert finished[1].stderr.count("test hook HVD_ADAPTIVE_SLOW_START: 1.5 s late") == 1, finished[1].stderr[-2000:]
    assert start["calibration_s"] < SLOW_EVAL_S / 2, start


def test_a_round_holds_two_batches_a_rank_when_the_window_is_smaller(finished):
    start = records(finished[0], "start")[0]
    assert start["window_rows"] == 256, start
    rows = [r["samples"] for r in records(finished[0], "round")]
    steps = [b - a for a, b in zip([0] + rows, rows)]
    assert max(steps) == 256 and all(s <= 256 for s in steps), steps  # less only at an epoch's end
    assert rows[-1] == 2 * 2000


def test_tensorboard_events_hold_the_records_scalars(finished):
    run_dir, _ = finished
    files, tags = read_events(run_dir / "tb")
    assert files, f"no events file in {run_dir / 'tb'}"
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in recs if r["event"] == "eval"]
    rounds = [r for r in recs if r["event"] == "round"]
    assert len(evals) == 2 and rounds
    start = next(r for r in recs if r["event"] == "start")
    assert start["calibration_s"] < 1.0, start  # tiny.yaml's train.calibrate_s, not the 2 s default
    # Every metric of the eval records, at the record's step (rows trained so far).
    metrics = [k for k, v in evals[0].items() if k not in ("event", "wall_s", "epoch", "samples")]
    assert {"p_at_1", "p_at_5", "ndcg_at_5"} <= set(metrics)
    for k in metrics:
        got = tags[f"eval/{k}"]
        assert [s for s, _ in got] == [e["samples"] for e in evals], k
        assert [v for _, v in got] == pytest.approx([e[k] for e in evals], rel=1e-6), k
    # One loss per round; per-rank batch sizes and merge weights; rates after the first round.
    assert [v for _, v in tags["train/loss"]] == pytest.approx([r["loss"] for r in rounds], rel=1e-6)
    for rank in (0, 1):
        assert [v for _, v in tags[f"rank{rank}/batch_size"]] == [r["ranks"][rank]["batch_size"] for r in rounds]
        assert [v for _, v in tags[f"rank{rank}/weight"]] == pytest.approx(
            [r["ranks"][rank]["weight"] for r in rounds], rel=1e-6)
    assert len(tags["train/rows_per_s"]) == len(rounds) and all(v > 0 for _, v in tags["train/rows_per_s"])


def test_no_start_up_messages_on_stderr(finished):
    _, p = finished
    assert start_up_lines(p.stderr) == [], p.stderr[-3000:]


@pytest.fixture(scope="module")
def failed(tmp_path_factory):
    """A 2-rank run whose rank 1 fails in its first round (after the start record), launched
    with OpenMPI told to spin while waiting."""
    run_dir = tmp_path_factory.mktemp("failed") / "run"
    p = mpirun(2, ["-m", "hvd_adaptive.cli", "train", "--config", "configs/tiny.yaml",
                   "--run-dir", str(run_dir)],
               timeout=120, HVD_ADAPTIVE_FAIL_AT_ROUND="0", HVD_ADAPTIVE_FAIL_RANK="1",
               OMPI_MCA_mpi_yield_when_idle="0", **LOUD)
    return run_dir, p


def test_ranks_yield_their_core_while_waiting_in_mpi_unless_told_to_spin(finished, failed):
    # Two ranks on this node's two cores are not oversubscribed, where OpenMPI spins by default;
    # the start record holds the value MPI runs with (read back through MPI_T), not the request.
    assert records(finished[0], "start")[0]["mpi_yield_when_idle"] == 1
    assert records(failed[0], "start")[0]["mpi_yield_when_idle"] == 0  # an exported value wins


def test_errors_still_reach_stderr(failed):
    _, p = failed
    assert p.returncode != 0
    assert "[rank 1] error: RuntimeError: injected failure at round 0" in p.stderr, p.stderr[-3000:]
    assert start_up_lines(p.stderr) == [], p.stderr[-3000:]




def test_progress_lines_come_at_once_then_every_log_every_s(finished):
    """The first round says where training stands at once; later ones only when another
    train.log_every_s (10 s by default) has passed, so this short run's 16 rounds print a line
    or two, not one each."""
    run_dir, p = finished
    lines = [line for line in p.stdout.splitlines() if line.lstrip("[]0-9, rank").startswith("train epoch")]
    rounds = records(run_dir, "round")
    assert len(rounds) >= 10, len(rounds)
    assert 1 <= len(lines) <= 3, lines
    assert lines[0].split("|")[0].split()[-1] == f"{rounds[0]['epoch']:.2f}", (lines[0], rounds[0])
