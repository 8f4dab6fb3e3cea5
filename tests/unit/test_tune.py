"""optim.lr auto (hvd_adaptive/train/tune.py) without ranks: the rate a probe chooses, past the
edges of its search, moving with the rows' norm, judged on held-out rows; a number pins it."""
import math

import numpy as np
import pytest

from hvd_adaptive.train import tune
from hvd_adaptive.config import ConfigError, load_config

def test_the_lowest_held_out_loss_wins_and_no_learning_is_an_error():
    assert tune.pick([0.1, 0.2, 0.4], [2.0, 1.5, 1.7], 3.0, "adagrad") == 0.2
    assert tune.pick([0.1, 0.2, 0.4], [2.0, float("nan"), 1.9], 3.0, "adagrad") == 0.4
    with pytest.raises(ConfigError, match=r"optim.lr=auto: no candidate rate of adagrad learned .* "
                                          r"from 3 to 0.1: 3, 0.2: nan.*pin optim.lr"):
        tune.pick([0.1, 0.2], [3.0, float("nan")], 3.0, "adagrad")


def test_the_search_goes_past_the_edges_and_stops_at_the_best():
    """A held-out loss lowest at 0.3 x 2^-3, one rank: rounds -1, 0, 1; then -2; -3; -4, and
    the choice inside what was tried."""
    rounds = []

    def allgather(x):
        if isinstance(x, dict):  # a round's losses (the last call shares the seconds)
            rounds.append(sorted(x))
        return [x]

    def loss(lr):
        return (math.log2(lr / 0.3) + 3) ** 2 + 1.0

    c = tune.choose(0.3, loss, lambda: 100.0, rank=0, size=1, allgather=allgather, optimizer="adagrad")
    assert c.lr == pytest.approx(0.3 / 8, rel=1e-3)
    assert c.candidates == pytest.approx([0.3 * 2.0 ** j for j in range(-4, 2)], rel=1e-3)
    assert rounds == [[-1, 0, 1], [-2], [-3], [-4]]


def test_the_centre_follows_the_rows_l1_norm():
    class Rows:  # two rows of L1 norm 6 and one of 120 (CSR)
        indptr = np.array([0, 2, 4, 6])
        values = np.array([3.0, 3.0, 2.0, 4.0, 60.0, 60.0])

    assert tune.centre("rowwise_adagrad", Rows, np.arange(3)) == pytest.approx(tune.ADAGRAD_STEP / 6 ** 0.5)
    assert tune.centre("rowwise_adagrad", Rows, np.array([2])) == pytest.approx(tune.ADAGRAD_STEP / 120 ** 0.5)
    assert tune.centre("sgd", Rows, np.arange(3)) == tune.CENTRES["sgd"]


def test_the_probe_judges_on_rows_it_did_not_train():
    for n, batch in ((100_000, 256), (2000, 64), (40, 64)):
        trained, held = tune.probe_rows(n, batch)
        assert len(held) == min(tune.HELD_OUT_ROWS, n // 4) and len(trained) > 0
        assert len(trained) <= tune.PROBE_STEPS * min(batch, tune.PROBE_BATCH)
        assert not set(trained) & set(held)
        again = tune.probe_rows(n, batch)  # the same rows on every rank
        assert (again[0] == trained).all() and (again[1] == held).all()


def test_auto_is_the_default_rate_and_a_number_pins_it():
    assert load_config(None)[0].optim.lr == "auto"
    assert load_config("configs/tiny.yaml", ["optim.lr=0.3"])[0].optim.lr == 0.3
    with pytest.raises(ConfigError, match=r"optim.lr: expected a number, got 'fast' or must be one of \['auto'\]"):
        load_config("configs/tiny.yaml", ["optim.lr=fast"])


