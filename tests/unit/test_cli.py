"""The real CLI in one process, ending before MPI and TensorFlow start: bad configs and missing
files are one clear line, and commands exit with their handlers run and MPI finalized."""
import subprocess
import sys

import pytest

from tests.harness.mpirun import REPO, mpi_env
from tests.harness.trained_run import cli


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
    # main in one process. Under mpirun every rank stops the same way (tests/mpi/test_failures.py).
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
