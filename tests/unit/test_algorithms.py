"""How a window's rows are cut into batches (algorithms/base.py's chunks), without MPI."""
import pytest

from hvd_adaptive.train.algorithms.base import chunks


@pytest.mark.parametrize("total, size", [(10, 4), (9, 4), (8, 4), (3, 4), (0, 4), (1617, 512), (1, 1)])
def test_chunks_cover_every_row_once_without_tiny_tails(total, size):
    parts = chunks(total, size)
    assert [x for lo, hi in parts for x in range(lo, hi)] == list(range(total))
    if len(parts) > 1:
        assert all(hi - lo >= size / 2 for lo, hi in parts)
        assert all(hi - lo < 1.5 * size for lo, hi in parts)


