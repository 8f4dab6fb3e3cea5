"""Shared fixtures: one real Slurm cluster for every Slurm test of the session."""
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# The harness (tests/harness: MPI jobs, namespaced nodes, the Slurm cluster, trained runs) is
# imported by module name from the tests; the ranks' programs live in tests/parallel.
sys.path.insert(0, str(Path(__file__).resolve().parent / "harness"))

from mpirun import train  # noqa: E402
from trained_run import FILE_RUNS, trained_runs  # noqa: E402
from slurm_cluster import SlurmCluster, slurm_available  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "multinode: runs ranks on several namespaced nodes "
                            "(tests/harness/nodes.py; root, iproute2)")


@pytest.fixture(scope="session")
def cluster():
    if not slurm_available():
        # A missing cluster is a set-up error to fix, never a reason to pass quietly.
        pytest.fail("Slurm, munge or root is missing: run `bash launch/setup.sh --slurm` as root",
                    pytrace=False)
    # Not pytest's tmp_path: its 0700 parent keeps out munged and slurmctld, which drop root.
    workdir = Path(tempfile.mkdtemp(prefix="hvd-slurm-"))
    try:
        with SlurmCluster(workdir, cpus=2) as running:
            yield running
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def sync_reference(tmp_path_factory):
    """One uninterrupted 2-rank sync run of the tiny config, shared by the tests that read it
    (test_sync: it learns; test_checkpoint: resumed runs must end exactly there): 10 epochs,
    40 rounds, a checkpoint every 8 (24, 32 and 40 kept). Returns (run folder, summary)."""
    run = tmp_path_factory.mktemp("sync_reference") / "run"
    return run, train(2, run, "checkpoint.every=8")


@pytest.fixture(scope="session")
def file_runs(tmp_path_factory):
    """The runs the predict, evaluate and export tests read (trained_run.FILE_RUNS), trained on
    the tiny data as files in one 2-rank job: ({name: run folder}, test file)."""
    return trained_runs(tmp_path_factory.mktemp("file_runs"), 2, FILE_RUNS)
