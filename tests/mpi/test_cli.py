"""The real CLI end to end in one process (no launcher): synthetic files on disk, training on
them; and the input errors it refuses before MPI and TensorFlow start. The default config's
run is test_launch.py's."""
import json
import subprocess
import sys

import pytest

from mpirun import REPO, mpi_env


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "hvd_adaptive.cli", *args], cwd=REPO,
                          env=mpi_env(), capture_output=True, text=True, timeout=timeout)


@pytest.mark.mpi
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


def test_bad_config_and_missing_file_are_one_clear_line(tmp_path):
    p = cli("train", "--set", "train.bogus=1")
    assert p.returncode == 2 and "train.bogus: unknown key" in p.stderr
    assert "Traceback" not in p.stderr
    p = cli("train", "--config", str(tmp_path / "nope.yaml"))
    assert p.returncode == 2 and "nope.yaml: config file not found" in p.stderr


@pytest.mark.parametrize("sets, needle", [
    (["train.algorithm=fastest"], "train.algorithm: must be one of ['sync', 'auto', 'local', "),
    (["data.synth.preset=imagenet"], "data.synth.preset: unknown preset 'imagenet'; known: "),
    (["data.train=/nonexistent/train.txt", "data.test=/nonexistent/test.txt"],
     "/nonexistent/train.txt: data file not found (data.train)"),
])
def test_input_errors_end_train_before_mpi_and_tensorflow_start(sets, needle):
    # A fresh interpreter (this one may have loaded TensorFlow for other tests) runs the CLI's
    # main in one process. Under mpirun every rank stops the same way (tests/test_failures.py).
    argv = ["train", "--config", "configs/tiny.yaml", *(a for s in sets for a in ("--set", s))]
    code = ("import sys; from hvd_adaptive.cli import main; "
            f"rc = main({argv!r}); "
            "print(rc, 'mpi4py.MPI' in sys.modules, 'tensorflow' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=mpi_env(), capture_output=True,
                       text=True, timeout=60)
    assert p.stdout.split() == ["2", "False", "False"], p.stdout + p.stderr[-3000:]
    assert p.stderr.startswith("hvd-adaptive: error: ") and needle in p.stderr, p.stderr[-3000:]


EXITING = """
import atexit, sys
from mpi4py import MPI
from hvd_adaptive.parallel.distributed import exit_process

class Teardown:
    def __del__(self):
        print("torn down", flush=True)

keep = Teardown()  # a normal exit's teardown would delete it
atexit.register(lambda: open(sys.argv[1], "w").write(f"handler ran, MPI finalized: {MPI.Is_finalized()}"))
sys.stdout.write("buffered line")  # no newline: still in the buffer at exit
exit_process(3)
"""


def test_commands_exit_with_atexit_handlers_run_mpi_finalized_and_no_teardown(tmp_path):
    """distributed.exit_process, which the CLI and the ranks' programs end with: its status,
    the atexit handlers (cgroups, Horovod's shut-down) before MPI is finalized, buffered output
    written, and no interpreter teardown (about a second once TensorFlow is loaded)."""
    marker = tmp_path / "atexit.txt"
    p = subprocess.run([sys.executable, "-c", EXITING, str(marker)], capture_output=True, text=True,
                       cwd=REPO, env=mpi_env(), timeout=60)
    assert p.returncode == 3, p.stderr
    assert marker.read_text() == "handler ran, MPI finalized: False"
    assert p.stdout == "buffered line", p.stdout
    assert "Finalize" not in p.stderr and "finalize" not in p.stderr, p.stderr
