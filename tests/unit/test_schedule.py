"""A time-varying slowdown (hetero.schedule): the phase each window takes, the slowed phase's
sleep, and its config checks."""
import time

import pytest

from hvd_adaptive.config import ConfigError, HeteroConfig, PhaseConfig, load_config
from hvd_adaptive.train.hetero import Heterogeneity


def test_each_window_takes_the_phase_its_first_row_falls_in():
    cfg = HeteroConfig(slowdown={1: 1.5}, schedule=[PhaseConfig(0.2, {1: 2.0}),
                                                     PhaseConfig(0.4, {})])
    slow, fast = Heterogeneity(cfg, rank=1), Heterogeneity(cfg, rank=0)
    want = [(0.0, 1.5), (0.19, 1.5), (0.2, 2.0), (0.39, 2.0), (0.4, 1.0), (3.0, 1.0)]
    for epoch, factor in want:
        slow.at_epoch(epoch)
        fast.at_epoch(epoch)
        assert (slow.factor, fast.factor) == (factor, 1.0), epoch


def test_the_slowed_phase_sleeps_and_the_others_do_not(monkeypatch):
    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    h = Heterogeneity(HeteroConfig(schedule=[PhaseConfig(0.5, {0: 3.0})]), rank=0)
    h.at_epoch(0.1)
    h.compute(lambda: (1,))
    assert slept == []
    h.at_epoch(0.5)
    h.compute(lambda: (1,))
    assert len(slept) == 1


@pytest.mark.parametrize("schedule,mode,message", [
    ("[{from_epoch: 0.4, slowdown: {1: 2}}, {from_epoch: 0.2}]", "sleep",
     "hetero.schedule: phases must start at epochs >= 0 in increasing order, got [0.4, 0.2]"),
    ("[{from_epoch: 0.4, slowdown: {1: 0.5}}]", "sleep",
     "hetero.schedule[0].slowdown: needs rank >= 0 and factor >= 1, got 1: 0.5"),
    ("[{from_epoch: 0.4, slowdown: {1: 2}}]", "cpu_quota",
     "hetero.schedule: a time-varying slowdown needs hetero.mode=sleep"),
    ("[{from: 0.4}]", "sleep", "hetero.schedule[0].from: unknown key"),
])
def test_bad_schedules_name_the_key(schedule, mode, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config("configs/tiny.yaml", [f"hetero.schedule={schedule}", f"hetero.mode={mode}"])


