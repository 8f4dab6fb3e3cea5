"""Runs a rank-side check once per command-line case, all in one set of ranks.

The ranks' programs (tests/mpi/ranks, tests/cluster/ranks) import it as tests.harness.cases
(the harness's mpi_env puts the repository on PYTHONPATH). TensorFlow and Horovod start once
for all the cases, which is most of a short job's time.
"""
import sys
from typing import Callable


def each_case(check: Callable[[str, object], None]) -> int:
    """Initializes this rank (one TensorFlow thread), calls `check(case, cluster)` for every
    argument in turn, shuts down; returns the exit code (an assertion ends the job first)."""
    from hvd_adaptive.parallel import distributed

    c = distributed.init(threads=1)
    for case in sys.argv[1:]:
        check(case, c)
    distributed.shutdown()
    return 0
