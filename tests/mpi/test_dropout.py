"""model.dropout_after on real ranks (README, the config table): dropout applies to training
from that many epochs on, and not before. 2 ranks, the tiny config, whose sync runs repeat
their losses exactly from the same seeds."""
import pytest

from tests.harness.mpirun import records, train_many_job

AFTER = 1.0  # epochs without dropout


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same sync run of 2 epochs without dropout and with dropout 0.5 from epoch AFTER, then
    the latter resumed to 3 epochs, one 2-rank job; returns (each run's round records to epoch
    2, the job's output)."""
    root = tmp_path_factory.mktemp("dropout")
    late = ("model.dropout=0.5", f"model.dropout_after={AFTER}")
    _, out = train_many_job(2, {
        "plain": (root / "plain", ("train.epochs=2",)),
        "late": (root / "late", ("train.epochs=2", *late)),
        "resumed": (root / "late", ("train.epochs=3", *late, "checkpoint.resume=auto")),
    })
    return {name: [r for r in records(root / name, "round") if r["epoch"] <= 2]
            for name in ("plain", "late")}, out


def test_dropout_starts_at_model_dropout_after(runs):
    rounds, out = runs
    plain, late = rounds["plain"], rounds["late"]
    assert [r["epoch"] for r in plain] == [r["epoch"] for r in late]
    # Rounds that start before AFTER epochs train without dropout: the same losses as the plain run.
    before = [i for i, r in enumerate(plain) if i == 0 or plain[i - 1]["epoch"] < AFTER]
    after = [i for i in range(len(plain)) if i not in before]
    assert len(before) >= 2 and len(after) >= 2, (before, after)
    assert [plain[i]["loss"] for i in before] == [late[i]["loss"] for i in before]
    assert all(plain[i]["loss"] != late[i]["loss"] for i in after)
    assert f"model.dropout 0.5 from epoch {AFTER:.2f} on (model.dropout_after {AFTER:g})" in out, out[-2000:]


def test_a_resumed_run_past_it_trains_with_dropout_from_its_first_round(runs):
    _, out = runs
    assert "model.dropout 0.5 from epoch 2.00 on" in out, out[-2000:]
