"""checkpoint.average without ranks: the running average's arithmetic, which evaluation's model
is kept when the average competes, and its setting's check."""
import numpy as np
import pytest

from hvd_adaptive.train.average import WeightAverage
from hvd_adaptive.train.trainer import _kept, evals_since_best, kept_view, val_score
from tests.harness.mpirun import before_tf


def test_a_models_share_halves_every_half_life_whatever_the_spacing():
    avg = WeightAverage()  # a half-life of 0.5 epochs below
    assert not avg.due(5.0, 0.5)  # nothing yet: the first sample, an evaluation's, is the average
    avg.add([np.array([4.0, 0.0]), np.array([[1.0]])], 0.1, 0.5)
    assert [a.tolist() for a in avg.arrays] == [[4.0, 0.0], [[1.0]]]
    avg.add([np.array([0.0, 8.0]), np.array([[3.0]])], 0.6, 0.5)  # one half-life later
    np.testing.assert_allclose(avg.arrays[0], [2.0, 4.0])
    np.testing.assert_allclose(avg.arrays[1], [[2.0]])
    avg.add([np.array([0.0, 8.0]), np.array([[3.0]])], 0.6, 0.5)  # the same progress: no change
    np.testing.assert_allclose(avg.arrays[0], [2.0, 4.0])
    avg.add([np.array([10.0, 0.0]), np.array([[0.0]])], 0.85, 0.5)  # half a half-life
    keep = 0.5 ** 0.5
    np.testing.assert_allclose(avg.arrays[0], [2.0 * keep + 10.0 * (1 - keep), 4.0 * keep], rtol=1e-6)
    assert avg.at == 0.85 and not avg.due(1.3, 0.5) and avg.due(1.35, 0.5)
    # Two samples half a half-life apart: the same weights as one sample at the end of both
    # when the model did not change in between.
    a, b = WeightAverage(), WeightAverage()  # a half-life of 1 epoch
    for w in (a, b):
        w.add([np.array([1.0])], 0.0, 1.0)
    a.add([np.array([5.0])], 0.5, 1.0)
    a.add([np.array([5.0])], 1.0, 1.0)
    b.add([np.array([5.0])], 1.0, 1.0)
    np.testing.assert_allclose(a.arrays[0], b.arrays[0], rtol=1e-6)


def _eval(epoch, val, avg_val=None, kept=False, p1=0.5):
    """An evaluation record whose validation P@1, P@3 and P@5 are all `val` (the average's
    all `avg_val`), so its validation score is `val`."""
    e = {"event": "eval", "epoch": epoch, "p_at_1": p1,
         **{f"val_p_at_{k}": val for k in (1, 3, 5)}}
    if avg_val is not None:
        e.update({f"avg_val_p_at_{k}": avg_val for k in (1, 3, 5)})
    if kept:
        e.update(kept="average", avg_p_at_1=p1 + 0.1)
    return e


def test_the_kept_evaluation_is_the_first_best_of_the_model_and_its_average():
    evals = [_eval(1, 0.60, 0.55), _eval(2, 0.70, 0.72, kept=True), _eval(3, 0.72, 0.71),
             _eval(4, 0.65, 0.72)]
    kept = _kept(evals)
    assert kept["epoch"] == 2 and kept["model"] == "average"
    assert val_score(kept) == pytest.approx(0.72) and kept["p_at_1"] == pytest.approx(0.6)
    assert evals_since_best(evals) == 2
    evals.append(_eval(5, 0.73, 0.70))  # the model itself passes the average's best
    kept = _kept(evals)
    assert (kept["epoch"], kept["model"], kept["p_at_1"]) == (5, "trained", 0.5)
    assert "avg_val_p_at_1" not in kept and evals_since_best(evals) == 0
    # Without the average, the model's validation score alone.
    assert _kept([_eval(1, 0.6), _eval(2, 0.5)])["epoch"] == 1
    assert kept_view(_eval(1, 0.6, 0.7))["model"] == "trained"  # not kept there: the model's


def test_the_kept_evaluation_is_chosen_by_the_mean_of_validation_p1_p3_and_p5():
    # The first evaluation has the higher validation P@1, the second the higher mean of the
    # three: the second is kept, for the model and for the average alike.
    first = {"event": "eval", "epoch": 1, "p_at_1": 0.50, "val_p_at_1": 0.70,
             "val_p_at_3": 0.40, "val_p_at_5": 0.30}
    second = {"event": "eval", "epoch": 2, "p_at_1": 0.52, "val_p_at_1": 0.69,
              "val_p_at_3": 0.45, "val_p_at_5": 0.33}
    assert val_score(first) == pytest.approx(0.7 / 3 + 0.4 / 3 + 0.1)
    assert _kept([first, second])["epoch"] == 2 and evals_since_best([first, second]) == 0
    avg = {k.replace("val_", "avg_val_"): v for k, v in second.items() if k.startswith("val_")}
    third = {**_eval(3, 0.40), **avg, "kept": "average", "avg_p_at_1": 0.55}
    assert val_score(third, "avg_val_") == val_score(second)  # a tie: the first of equals
    assert _kept([first, second, third])["epoch"] == 2
    assert val_score({"event": "eval", "p_at_1": 0.5}) == -1.0  # no split: no score


def test_a_negative_half_life_names_the_key(tmp_path):
    p = before_tf(["train", "--config", "configs/tiny.yaml", "--run-dir", str(tmp_path / "r"),
                   "--set", "checkpoint.average=-1"])
    assert p.returncode == 2, p.stderr[-2000:]
    assert "checkpoint.average: a half-life in epochs, >= 0 (0: off), got -1" in p.stderr
    assert not (tmp_path / "r" / "metrics.jsonl").exists()
