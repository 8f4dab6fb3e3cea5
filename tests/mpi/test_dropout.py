"""model.dropout_after on real ranks (README, the config table): dropout applies to training
from that many epochs on, and not before. 2 ranks, the tiny config, whose sync runs repeat
their losses exactly from the same seeds."""
import pytest

from tests.harness.mpirun import records, train_many_job

AFTER = 1.0  # epochs without dropout


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same sync run without dropout and with dropout 0.5 from epoch AFTER, one 2-rank job;
    returns (each run's round records, the job's output)."""
    root = tmp_path_factory.mktemp("dropout")
    sets = ("train.epochs=2",)
    _, out = train_many_job(2, {
        "plain": (root / "plain", sets),
        "late": (root / "late", (*sets, "model.dropout=0.5", f"model.dropout_after={AFTER}")),
    })
    return {name: records(root / name, "round") for name in ("plain", "late")}, out


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
