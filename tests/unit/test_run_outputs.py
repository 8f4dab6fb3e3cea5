"""Run outputs without ranks: TensorFlow's start-up lines filtered (and shown with --verbose),
and TensorBoard events of a new and a resumed run."""
import subprocess
import sys

import pytest

from tests.harness.mpirun import REPO, mpi_env, start_up_lines
from tests.harness.events import read_events

def test_verbose_shows_them():
    # What `--verbose` does before TensorFlow loads, in one process (no ranks needed), even
    # where the environment asks for quiet (mpi_env sets TF_CPP_MIN_LOG_LEVEL=2).
    code = ("from hvd_adaptive.train.run import quiet_tensorflow; quiet_tensorflow(verbose=True); "
            "import tensorflow as tf; tf.constant(1.0) + 1")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=mpi_env(), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert start_up_lines(p.stderr), p.stderr[-3000:]


def test_start_up_filter_drops_absl_info_lines_and_keeps_the_rest():
    """What hvd_adaptive.tfload keeps of the first TensorFlow import's stderr where quiet is asked
    for (on hosts where TensorFlow prints its start-up lines whatever TF_CPP_MIN_LOG_LEVEL says),
    and launch/train.sh of horovodrun's."""
    from hvd_adaptive.tflines import start_up_filter

    notice = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    info = (b"I0000 00:00:1795553424.558654    6481 port.cc:153] oneDNN custom operations are on. "
            b"You may see slightly different numerical results.\n")
    info_dated = b"I1124 20:37:25.123456  812 cpu_feature_guard.cc:227] This TensorFlow binary\n"
    keep = [b"W0000 00:00:1795553424.6    6481 loader.cc:12] a warning stays\n",
            b"E1124 20:37:25.5  812 op.cc:9] an error stays\n",
            b"Traceback (most recent call last):\n", b"ImportError: I0000 is not a prefix here\n",
            b"some INFO text that is not absl's\n"]
    text = notice + info + keep[0] + notice + info_dated + b"".join(keep[1:])
    assert start_up_filter(text) == b"".join(keep)
    assert start_up_filter(b"") == b""


def test_start_up_lines_filtered_also_when_matplotlib_came_first():
    """A program that imported matplotlib before the package loads TensorFlow (pyplot's import
    is then its own business) still gets TensorFlow's start-up lines filtered."""
    code = "import matplotlib\nfrom hvd_adaptive.tfload import tf\ntf.constant(1.0) + 1"
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=mpi_env(), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert start_up_lines(p.stderr) == [], p.stderr[-3000:]


def test_new_run_replaces_old_events_resumed_run_adds(tmp_path):
    from hvd_adaptive.train.records import RunLog

    def session(first: str, p1: float, samples: int):
        log = RunLog(tmp_path, active=True)
        log.record(event=first, wall_s=1.0)
        log.record(event="eval", wall_s=2.0, epoch=1.0, samples=samples, p_at_1=p1)
        log.close()

    session("start", 0.1, 100)
    session("start", 0.2, 100)  # a new run in the same folder: the first run's curve goes
    files, tags = read_events(tmp_path / "tb")
    assert len(files) == 1 and tags["eval/p_at_1"] == [(100, pytest.approx(0.2))]
    session("resume", 0.3, 200)  # a resumed run continues the curve
    files, tags = read_events(tmp_path / "tb")
    assert len(files) == 2
    assert sorted(tags["eval/p_at_1"]) == [(100, pytest.approx(0.2)), (200, pytest.approx(0.3))]
    assert not RunLog(tmp_path / "other", active=False).dir.exists()  # other ranks write nothing
