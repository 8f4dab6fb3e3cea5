"""Sweeps: expansion, names, listing, each bad sweep's message, and one real 2-point run."""
import subprocess
import sys

import pytest

from hvd_adaptive.cli import main as cli_main
from hvd_adaptive.config import ConfigError
from hvd_adaptive.bench.sweep import expand, point_name, resolve_index
from tests.harness.mpirun import REPO

BASE = "train:\n  epochs: 1\n"


def write(tmp_path, sweep_text, base=BASE, name="s.yaml"):
    p = tmp_path / name
    p.write_text(base + sweep_text)
    return p


GRID = "sweep:\n  grid:\n    train.algorithm: [sync, adaptive]\n    optim.lr: [0.05, 0.1]\n"


def test_grid_times_seeds_in_order_with_names(tmp_path):
    points = expand(write(tmp_path, GRID + "  seeds: [0, 1]\n"))
    assert [p.index for p in points] == list(range(8))
    assert points[0].name == "train.algorithm=sync,optim.lr=0.05,seed=0"
    assert points[1].name == "train.algorithm=sync,optim.lr=0.05,seed=1"
    assert points[7].name == "train.algorithm=adaptive,optim.lr=0.1,seed=1"
    assert len({p.name for p in points}) == 8
    last = points[7].config
    assert (last.train.algorithm, last.optim.lr, last.train.seed) == ("adaptive", 0.1, 1)
    assert last.train.epochs == 1  # the base config is kept


def test_without_seeds_the_configs_seed_is_kept(tmp_path):
    points = expand(write(tmp_path, GRID, base="train:\n  seed: 7\n"))
    assert len(points) == 4
    assert all(p.config.train.seed == 7 and "seed" not in p.name for p in points)


def test_set_applies_to_every_point(tmp_path):
    points = expand(write(tmp_path, GRID), ["train.epochs=2"])
    assert {p.config.train.epochs for p in points} == {2.0}


def test_names_are_filesystem_safe():
    name = point_name([("data.train", "data/a b.txt"), ("model.hidden", [64, 32]),
                       ("hetero.slowdown", {1: 2.0}), ("train.eval_rows", None)])
    assert name == ("data.train=data_a_b.txt,model.hidden=64-32,hetero.slowdown=1_2.0,"
                    "train.eval_rows=null")
    long = point_name([(f"adaptive.key{i}", "x" * 30) for i in range(10)])
    assert len(long) <= 200 and "/" not in long
    assert long != point_name([(f"adaptive.key{i}", "x" * 30) for i in range(9)] + [("a", "y")])


def test_cli_list_and_count(tmp_path, capsys):
    path = write(tmp_path, GRID)
    assert cli_main(["sweep", "list", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "0\ttrain.algorithm=sync,optim.lr=0.05"
    assert lines[3] == "3\ttrain.algorithm=adaptive,optim.lr=0.1"
    assert len(lines) == 4
    assert cli_main(["sweep", "list", str(path), "--count"]) == 0
    assert capsys.readouterr().out == "4\n"


@pytest.mark.parametrize("sweep_text, needle", [
    ("sweep:\n  grid:\n    train.algoritm: [sync]\n", "train.algoritm: unknown key"),
    ("sweep:\n  grid:\n    trian.epochs: [1]\n", "trian: unknown key"),
    ("sweep:\n  grid:\n    train.algorithm: [sync, fastest]\n",
     "sweep point 1 (train.algorithm=fastest)"),
    ("sweep:\n  grid:\n    data.synth.preset: [eurlex4k, imagenet]\n",
     "data.synth.preset: unknown preset 'imagenet'"),
    ("sweep:\n  grid:\n    optim.lr: [0.1, -1]\n", "optim.lr: must be > 0"),
    ("sweep:\n  grid: {}\n", "sweep.grid: needs at least one"),
    ("sweep:\n  seeds: [0, 1]\n", "sweep.grid: needs at least one"),
    ("sweep:\n  grid:\n    optim.lr: []\n", "sweep.grid.optim.lr: empty list of values"),
    ("sweep:\n  grid:\n    optim.lr: 0.1\n", "sweep.grid.optim.lr: expected a list of values"),
    ("sweep:\n  grid:\n    optim.lr: [0.1]\n  sedes: [0]\n", "sweep.sedes: unknown key"),
    ("sweep:\n  grid:\n    optim.lr: [0.1]\n  seeds: 3\n", "sweep.seeds: expected a non-empty list"),
    ("sweep:\n  grid:\n    train.seed: [1]\n  seeds: [0]\n", "train.seed is also in the grid"),
    ("sweep:\n  grid:\n    sweep.seeds: [[1]]\n", "cannot vary its own section"),
    ("sweep:\n  grid:\n    optim.lr: [0.1, 0.1]\n", "share the folder name"),
    ("sweep: [1, 2]\n", "sweep: expected a mapping"),
    ("", "no sweep: section"),
])
def test_bad_sweeps_name_the_problem(tmp_path, sweep_text, needle):
    with pytest.raises(ConfigError) as e:
        expand(write(tmp_path, sweep_text))
    assert needle in str(e.value)


def test_set_of_a_swept_key_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="--set optim.lr: the sweep in .* varies this key"):
        expand(write(tmp_path, GRID), ["optim.lr=1.0"])


def test_index_from_flag_or_slurm_and_range(monkeypatch):
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID", raising=False)
    assert resolve_index(3, 4, "c.yaml") == 3
    with pytest.raises(ConfigError, match="no --index and no SLURM_ARRAY_TASK_ID"):
        resolve_index(None, 4, "c.yaml")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "2")
    assert resolve_index(None, 4, "c.yaml") == 2
    for bad in (4, -1):
        with pytest.raises(ConfigError, match=r"c.yaml has 4 point\(s\), valid indices are 0-3"):
            resolve_index(bad, 4, "c.yaml")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "x")
    with pytest.raises(ConfigError, match="not an integer"):
        resolve_index(None, 4, "c.yaml")


def test_cli_errors_exit_2_before_any_mpi(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID", raising=False)
    path = write(tmp_path, GRID)
    assert cli_main(["sweep", "run", str(path), "--index", "9"]) == 2
    assert "valid indices are 0-3" in capsys.readouterr().err
    assert cli_main(["sweep", "run", str(path)]) == 2
    assert "SLURM_ARRAY_TASK_ID" in capsys.readouterr().err
    bad = write(tmp_path, "sweep:\n  grid:\n    optim.lrr: [1]\n", name="bad.yaml")
    assert cli_main(["sweep", "run", str(bad), "--index", "0"]) == 2
    assert "optim.lrr: unknown key" in capsys.readouterr().err


def test_bad_sweep_fails_without_importing_mpi_or_tensorflow(tmp_path):
    # A fresh interpreter: this test process may have imported them for other tests.
    bad = write(tmp_path, "sweep:\n  grid:\n    optim.lrr: [1]\n")
    code = ("import sys; from hvd_adaptive.cli import main; "
            f"rc = main(['sweep', 'run', {str(bad)!r}, '--index', '0']); "
            "print(rc, 'mpi4py.MPI' in sys.modules, 'tensorflow' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       timeout=60)
    assert p.stdout.split() == ["2", "False", "False"], p.stdout + p.stderr
    assert "optim.lrr: unknown key" in p.stderr
