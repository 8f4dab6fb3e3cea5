"""Shared fixtures: one real Slurm cluster for every Slurm test of the session."""
import shutil
import tempfile
from pathlib import Path

import pytest

from slurm_cluster import SlurmCluster, slurm_available


def pytest_configure(config):
    config.addinivalue_line("markers", "multinode: runs ranks on several namespaced nodes "
                            "(tests/nodes.py; root, iproute2)")


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
