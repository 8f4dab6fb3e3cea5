"""Shared by the checks that drive a real algorithm under mpirun: build it, spy on its batches.

The ranks' programs import it as tests.harness.real_algorithm: the harness's mpi_env puts the
repository on PYTHONPATH when mpirun starts `python tests/mpi/ranks/<test>_ranks.py`.
"""
import time

import numpy as np

from hvd_adaptive.config import resolve
from hvd_adaptive.train.build import build_algorithm


def build(cfg, c, train, ready: bool = True):
    """The configured algorithm on a fresh model, built as the trainer builds it
    (train/build.py), from the config resolved as a run resolves it.

    Args:
        cfg: The run's config (train.algorithm names the algorithm).
        c: This rank's distributed.Cluster.
        train: The training set (data.load_data).
        ready: Also set it up and trace its steps (the trainer's order), else only construct.
    """
    algo = build_algorithm(resolve(cfg, c.threads), c, train)
    if ready:
        algo.setup()
        algo.trace()
    return algo


class RowSpy:
    """Stands in for `make_batch` in the given modules and records the rows of every batch
    built while `recording` is true (in `used`, one array per batch) and when it was built
    (in `times`, time.perf_counter() seconds)."""

    def __init__(self, *modules):
        self.real = modules[0].make_batch
        self.modules = modules
        self.used: list[np.ndarray] = []
        self.times: list[float] = []
        self.recording = False
        for m in modules:
            m.make_batch = self

    def restore(self) -> None:
        """Puts the real `make_batch` back (the next check installs its own spy)."""
        for m in self.modules:
            m.make_batch = self.real

    def __call__(self, ds, rows):
        if self.recording:
            self.used.append(np.array(rows))
            self.times.append(time.perf_counter())
        return self.real(ds, rows)
