"""The dense weighted merge and the shared counter on 2 and 3 real MPI ranks."""
import pytest

from tests.harness.mpirun import mpirun


@pytest.mark.parametrize("ranks", [2, 3])
def test_weighted_merge_and_counter(ranks):
    p = mpirun(ranks, ["tests/mpi/ranks/collectives_ranks.py"], timeout=180)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert f"collectives ok on {ranks} ranks" in p.stdout
