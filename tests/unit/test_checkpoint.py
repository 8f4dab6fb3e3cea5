"""Checkpoints without ranks: the file format and finder, damaged and non-finite checkpoints,
the training checkpoint's keys and the window stream it belongs to."""
import os

import numpy as np
import pytest

from hvd_adaptive.train import checkpoint as ck


class OneRank:
    """The few mpi4py calls checkpoint.py makes, for a single process."""

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1

    def Barrier(self):
        pass

    def gather(self, x, root=0):
        return [x]

    def allgather(self, x):
        return [x]

    def bcast(self, x, root=0):
        return x


def _state(step: int) -> dict:
    return {"w": np.full((3, 2), float(step), np.float32), "round": step, "evals": [{"p": 0.5}],
            "rank.slot": np.arange(4.0) * step, "rank.rng": {"state": 2**70 + step}}


def test_save_load_roundtrip_and_keep(tmp_path):
    for step in (2, 4, 6, 8):
        ck.save(tmp_path, step, _state(step), keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-6", "ckpt-8"]
    path, skipped = ck.find_latest(tmp_path)
    assert path.name == "ckpt-8" and skipped == []
    state, manifest = ck.load(path, rank=0)
    assert manifest["round"] == 8 and manifest["ranks"] == 1
    np.testing.assert_array_equal(state["w"], np.full((3, 2), 8.0))
    np.testing.assert_array_equal(state["rank.slot"], np.arange(4.0) * 8)
    assert state["rank.rng"] == {"state": 2**70 + 8} and state["evals"] == [{"p": 0.5}]
    # A rank beyond the writer's count takes the per-rank part of rank r mod N.
    assert ck.load(path, rank=3)[0]["rank.slot"][1] == 8


@pytest.mark.parametrize("damage", ["truncate_array", "delete_marker", "flip_byte", "leftover_tmp"])
def test_damaged_newest_checkpoint_is_skipped(tmp_path, damage):
    for step in (4, 8):
        ck.save(tmp_path, step, _state(step), keep=3)
    newest = tmp_path / "ckpt-8"
    if damage == "truncate_array":
        with open(newest / "w.npy", "r+b") as f:
            f.truncate(60)
    elif damage == "delete_marker":
        (newest / ck.MARKER).unlink()
    elif damage == "flip_byte":
        data = bytearray((newest / "rank-0" / "slot.npy").read_bytes())
        data[-1] ^= 0xFF
        (newest / "rank-0" / "slot.npy").write_bytes(bytes(data))
    else:  # a crash before the rename: only the temporary folder exists
        os.rename(newest, tmp_path / ".tmp-ckpt-8")
    warnings = []
    path, skipped = ck.find_latest(tmp_path, warnings.append)
    assert path.name == "ckpt-4"
    if damage == "leftover_tmp":
        assert skipped == [] and warnings == []
    else:
        assert skipped == [newest] and len(warnings) == 1 and "ckpt-8" in warnings[0], warnings
    np.testing.assert_array_equal(ck.load(path)[0]["w"], np.full((3, 2), 4.0))


def test_checkpointer_refuses_a_non_finite_model(tmp_path):
    from hvd_adaptive.config import CheckpointConfig

    c = ck.Checkpointer(tmp_path, CheckpointConfig(every=1), OneRank(), say=print)
    c.save(1, _state(1))
    bad = _state(2)
    bad["rank.slot"][2] = np.nan
    with pytest.raises(FloatingPointError, match="last good one: ckpt-1"):
        c.save(2, bad)
    assert ck.find_latest(tmp_path / "checkpoints")[0].name == "ckpt-1"


class FakeAlgo:
    """What Checkpointer.save_training and restore use of an Algorithm."""

    def __init__(self, seed=5, rows=100, ranks=1, cuts=False, eval_every=0.5):
        from types import SimpleNamespace as NS

        from hvd_adaptive.config import TrainConfig

        self.cfg = NS(train=TrainConfig(seed=seed, window_samples=64, batch_size=16, eval_every=eval_every))
        self.rounds_end_at_evaluations = cuts  # sync's rounds also end at evaluations
        self.cluster = NS(size=ranks)
        self.ctx = NS(train=NS(n_rows=rows), cluster=self.cluster)
        self.resized, self.model_differs_by_rank, self.optimizer_differs_by_rank = False, False, True
        self.loaded = None

    def state_dict(self):
        return {"algorithm": "fake", "model.0": np.ones((2, 2), np.float32)}

    def load_state_dict(self, d):
        self.loaded = d


class FakeLog:
    def __init__(self, size):
        self.bytes, self.cut = size, None

    def size(self):
        return self.bytes

    def truncate(self, size):
        self.cut = size


def test_training_checkpoint_keeps_the_loops_keys_and_refuses_another_stream(tmp_path):
    from hvd_adaptive.config import CheckpointConfig, ConfigError

    loop = {"wall": 1.5, "samples": 640.0, "totals": np.ones((1, 7)), "evals": [{"p_at_1": 0.3}],
            "last_progress": 0.64}
    saver = ck.Checkpointer(tmp_path, CheckpointConfig(), OneRank(), say=print)
    saver.save_training(FakeAlgo(), FakeLog(123), 10, loop)
    state, _ = ck.load(tmp_path / "checkpoints" / "ckpt-10")
    # The format resumed runs rely on: the algorithm's keys plus the loop's under "trainer.".
    assert sorted(k for k in state if k.startswith("trainer.")) == sorted(
        ["trainer.round", "trainer.stream", "trainer.metrics_bytes", *(f"trainer.{k}" for k in loop)])
    assert state["trainer.stream"] == [5, 64, 100] and state["trainer.metrics_bytes"] == 123

    algo, log = FakeAlgo(), FakeLog(999)
    cfg = CheckpointConfig(resume="auto")
    back = ck.Checkpointer(tmp_path, cfg, OneRank(), say=print).restore(algo, log)
    assert back["round"] == 10 and back["wall"] == 1.5 and back["evals"] == loop["evals"]
    np.testing.assert_array_equal(back["totals"], loop["totals"])
    assert algo.loaded["algorithm"] == "fake" and log.cut == 123  # metrics.jsonl cut back
    with pytest.raises(ConfigError, match=r"train.seed, rows a window"):
        ck.Checkpointer(tmp_path, cfg, OneRank(), say=print).restore(FakeAlgo(seed=6), FakeLog(0))
    # The same window_samples on 3 ranks: 64-row windows are raised to two batches of 16 a rank,
    # another stream, refused also where the rank count was not known before MPI (srun).
    with pytest.raises(ConfigError, match=r"this run has \[5, 96, 100\]"):
        ck.Checkpointer(tmp_path, cfg, OneRank(), say=print).restore(FakeAlgo(ranks=3), FakeLog(0))


def test_where_rounds_end_at_evaluations_another_eval_every_is_another_stream(tmp_path):
    """Sync's windows are also cut at each train.eval_every mark, so resuming skips rounds
    counted on those marks: another eval_every is refused, and so is a checkpoint whose stream
    does not say which marks cut it."""
    from hvd_adaptive.config import CheckpointConfig, ConfigError

    cfg = CheckpointConfig(resume="auto")
    loop = {"wall": 1.0, "samples": 64.0, "totals": np.ones((1, 7)), "evals": [], "last_progress": 0.64}
    ck.Checkpointer(tmp_path, CheckpointConfig(), OneRank(), say=print).save_training(
        FakeAlgo(cuts=True), FakeLog(1), 3, loop)
    state, _ = ck.load(tmp_path / "checkpoints" / "ckpt-3")
    assert state["trainer.stream"] == [5, 64, 100, 0.5]
    assert ck.Checkpointer(tmp_path, cfg, OneRank(), say=print).restore(
        FakeAlgo(cuts=True), FakeLog(1))["round"] == 3
    with pytest.raises(ConfigError, match=r"train.eval_every\] = \[5, 64, 100, 0.5\], this run has "
                                          r"\[5, 64, 100, 0.25\]"):
        ck.Checkpointer(tmp_path, cfg, OneRank(), say=print).restore(
            FakeAlgo(cuts=True, eval_every=0.25), FakeLog(1))
    ck.Checkpointer(tmp_path, CheckpointConfig(), OneRank(), say=print).save_training(
        FakeAlgo(), FakeLog(1), 4, loop)  # a stream without the marks
    with pytest.raises(ConfigError, match=r"= \[5, 64, 100\], this run has \[5, 64, 100, 0.5\]"):
        ck.Checkpointer(tmp_path, cfg, OneRank(), say=print).restore(FakeAlgo(cuts=True), FakeLog(1))


