"""The tiers' markers, and the session fixtures shared across files: one real Slurm cluster
for every Slurm test, one uninterrupted sync run, the trained runs on files, the small and the
noisy data files.

A test's tier is its folder, and its markers follow from it here (registered in
pyproject.toml): tests/mpi and tests/cluster start MPI ranks (`mpi`), tests/cluster also needs
root and the machine's Slurm or network namespaces (`cluster`); tests/unit has neither.
"""
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from hvd_adaptive.data import preset, synth_to_files, synthesize, write_xc
from tests.harness.mpirun import train
from tests.harness.slurm_cluster import SlurmCluster, slurm_available
from tests.harness.trained_run import FILE_RUNS, TINY, trained_runs

TIERS = {"mpi": ("mpi",), "cluster": ("mpi", "cluster")}


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).resolve().parent
    for item in items:
        tier = Path(item.fspath).resolve().relative_to(here).parts[0]
        for marker in TIERS.get(tier, ()):
            item.add_marker(marker)


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


@pytest.fixture(scope="session")
def small_files(tmp_path_factory):
    """The bad-input tests' small XC files (test_failures.py): a train/test pair, a test file
    with other features, a 2-row train file."""
    d = tmp_path_factory.mktemp("data")
    spec = dict(scale=0.1, n_train=200, n_test=50, n_labels=20, nnz_mean=10, labels_mean=2)
    train, test = synthesize(preset("eurlex4k", n_features=300, **spec))
    _, other = synthesize(preset("eurlex4k", n_features=250, **spec))
    for name, ds in (("train", train), ("test", test), ("test250", other),
                     ("two", train.subset(np.arange(2)))):
        write_xc(d / f"{name}.txt", ds)
    return d


@pytest.fixture(scope="session")
def noisy_files(tmp_path_factory):
    """For test_validation.py: the tiny data with half of its rows' labels noise, as XC files:
    (train, test)."""
    return synth_to_files(preset("eurlex4k", label_noise=0.5, **TINY),
                          tmp_path_factory.mktemp("noisy"))
