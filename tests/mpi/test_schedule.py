"""A time-varying slowdown (hetero.schedule): the phase each window takes, its config checks,
and a real 2-rank run whose slowed rank sleeps only in its phase."""
import time

import pytest

from hvd_adaptive.config import ConfigError, HeteroConfig, PhaseConfig, load_config
from hvd_adaptive.train.hetero import Heterogeneity
from mpirun import records, train


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


@pytest.mark.mpi
def test_a_run_slows_rank_1_only_in_its_phase(tmp_path):
    run = tmp_path / "vary"
    train(2, run, "train.algorithm=auto", "train.epochs=3",
          "hetero.schedule=[{from_epoch: 1.0, slowdown: {1: 3.0}}, {from_epoch: 2.0, slowdown: {}}]")
    rounds = records(run, "round")
    slept = {}
    for r in rounds:
        phase = int(r["epoch"] - 1e-9)  # epoch at the round's end: rounds of epoch k end in (k, k+1]
        for rank in r["ranks"]:
            slept.setdefault((phase, rank["rank"]), []).append(rank["slowdown_s"])
    assert all(s == 0 for k, v in slept.items() if k != (1, 1) for s in v), slept
    assert all(s > 0 for s in slept[(1, 1)]), slept
