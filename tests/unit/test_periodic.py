"""The one rule for periodic work (train/periodic.py), in the three units the loop uses it in."""
from hvd_adaptive.train.periodic import itstime


def test_evaluations_every_half_epoch_fall_where_a_multiple_is_crossed():
    assert itstime(0.51, 0.5, 0.49) and itstime(1.0, 0.5, 0.75)
    assert not itstime(0.74, 0.5, 0.51)
    assert itstime(0.3, 0.1, 0.2)  # float steps that land on a multiple count (0.3 / 0.1 < 3)


def test_checkpoints_every_eight_rounds_fall_on_its_multiples_only():
    due = [r for r in range(1, 33) if itstime(r, 8, r - 1)]
    assert due == [8, 16, 24, 32]


def test_progress_lines_start_at_once_then_follow_the_seconds():
    said, lines = -10.0, []
    for now in (0.2, 3.0, 9.9, 10.1, 12.0, 31.0):
        if itstime(now, 10.0, said):
            said = now
            lines.append(now)
    assert lines == [0.2, 10.1, 31.0]
