"""A cluster profile on one machine: `hetero.cores` gives every rank its own real cgroup CPU
quota (hvd_adaptive/train/hetero.py), removed again even when ranks are killed."""
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from hvd_adaptive.train.run import mpirun_command
from tests.harness.mpirun import REPO, explain, job_group, mpi_env, mpirun, records, train, train_args

CPU = Path("/sys/fs/cgroup/cpu")
PROFILE = "hetero.cores=[0.25, 0.25, 0.25, 0.0625]"
QUOTA = ("hetero.mode=cpu_quota", "train.threads=1")


def left_behind() -> list[Path]:
    return sorted(CPU.glob("hvd_adaptive-rank*"))


# Steps of about 10 ms of one core: the tiny config's steps (under 1 ms) are shorter than a
# sixteenth core's 1 ms slice of its quota, so that rank's throttling, not its share, set its pace.
STEP_WORK = ("train.batch_size=256", "model.hidden=[256]", "data.synth.n_labels=1000")


def test_every_rank_of_a_profile_gets_its_own_quota_and_runs_at_its_speed(tmp_path):
    s = train(4, tmp_path / "run", PROFILE, *QUOTA, *STEP_WORK, "train.algorithm=adaptive",
              "train.epochs=1", "train.calibrate_s=2", timeout=300)
    # The ranks' Horovod cycle follows the slowest quota (5 ms / 0.0625 cores, capped at 50)
    # unless HOROVOD_CYCLE_TIME says otherwise.
    start = records(tmp_path / "run", "start")[0]
    assert start["horovod_cycle_ms"] == 50.0
    assert start["calibration_s"] >= 2.0, start  # train.calibrate_s is honoured
    got = [r["quota_cores"] for r in s["per_rank"]]
    assert got == [0.25, 0.25, 0.25, 0.0625], f"quotas read back from the ranks' cgroups: {got}"
    rates = np.array([r["standalone_rate"] for r in s["per_rank"]])
    # Standalone rates leave out the CPU time Horovod's thread spends in each rank's quota
    # waiting for the throttled ranks (Algorithm.training_seconds): counted in, it took the
    # quarter-core ranks 1.1-1.7x apart and their ratio to the slow rank to 1.7-3.2.
    # The machine's other load reaches the ranks unequally too: 1.29x apart was seen once in a
    # fresh clone's suite. Against the slow rank's 4x below, that is still equal.
    fast = rates[:3]
    assert fast.max() / fast.min() < 1.4, f"standalone rows/s {rates}: equal quotas, unequal rates"
    ratio = np.median(fast) / rates[3]
    assert 3.0 < ratio < 5.5, f"standalone rows/s {rates}: the slow rank at 1/{ratio:.2f}, quotas 1/4"
    assert not left_behind(), "the run left its cgroups behind"


def test_a_profile_larger_than_the_node_is_refused_before_training(tmp_path):
    node = len(os.sched_getaffinity(0))
    p = mpirun(2, train_args(tmp_path / "run", f"hetero.cores=[{node}, 1]", *QUOTA), timeout=120)
    assert p.returncode != 0
    assert f"hetero.cores: the ranks on rank 0's node ask for {node + 1} cores" in p.stdout + p.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or "round" not in \
        (tmp_path / "run" / "metrics.jsonl").read_text()
    assert not left_behind()


def test_the_cgroups_of_killed_ranks_are_removed(tmp_path):
    cmd, _ = mpirun_command(2, train_args(tmp_path / "run", "hetero.cores=[0.5, 0.5]", *QUOTA,
                                          "train.epochs=1000"))
    with job_group(cmd, env=mpi_env(), cwd=REPO, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL):
        def members() -> list[int]:
            return [int(p) for g in left_behind() for p in (g / "cgroup.procs").read_text().split()]

        # A cgroup is made, then its rank enters it: wait for both ranks inside.
        deadline = time.time() + 120
        while (len(left_behind()) < 2 or len(members()) < 2) and time.time() < deadline:
            time.sleep(0.2)
        groups, ranks = left_behind(), members()
        assert len(groups) == 2 and len(ranks) >= 2, f"the ranks never entered their cgroups: {groups} {ranks}"
        for pid in ranks:  # as the OOM killer or a node failure would: no exit handler runs
            os.kill(pid, signal.SIGKILL)
        deadline = time.time() + 10
        while left_behind() and time.time() < deadline:
            time.sleep(0.2)
        assert not left_behind(), f"killed ranks left their cgroups: {left_behind()}"


def test_the_merge_cost_benchmark_times_both_wire_types_inside_real_quotas_and_removes_them():
    """`python -m hvd_adaptive.bench.merge_cost --touched --core --dtypes`: the sparse merge as adaptive
    SGD makes it, each rank in its own cgroup quota (read back), float16 moving half the bytes."""
    p = mpirun(2, ["-m", "hvd_adaptive.bench.merge_cost", "--config", "configs/tiny.yaml",
                   "--touched", "0.3", "--core", "0.5", "--dtypes", "float32", "float16",
                   "--repeats", "1"], timeout=180)
    assert p.returncode == 0, explain(p)
    assert "rank 0's quota as its cgroup holds it: 0.5 cores" in p.stdout, p.stdout
    sent = {d: float(re.search(rf"{d}: weighted merge .* a rank [0-9.]+ MB \(([0-9]+)\)", p.stdout).group(1))
            for d in ("float32", "float16")}
    assert sent["float16"] == pytest.approx(sent["float32"] / 2, rel=0.1), sent
    assert "sparse merge, each rank marking 0.3 of the rows" in p.stdout, p.stdout
    assert not list(CPU.glob("hvd_adaptive-merge*")), "cgroups left behind"


def test_the_merge_cost_benchmark_runs_on_a_sampled_loss_that_samples_by_frequency(tmp_path):
    """configs/bench.yaml's loss (model.output auto at 67,009 labels: sampled, by frequency)
    needs label counts to build the model; the benchmark gives it some and times the merge of
    the sampled output layer's rows. Its model.hidden auto is resolved for the preset's shape
    first, as a run on that data resolves it (the model is built only once chosen)."""
    cfg = tmp_path / "sampled.yaml"
    cfg.write_text((REPO / "configs" / "tiny.yaml").read_text().replace(
        "model:\n  hidden: [64]\n",
        "model:\n  hidden: auto\n  output: sampled\n  sampler: frequency\n  negatives: 20\n"))
    assert "sampler: frequency" in cfg.read_text()
    p = mpirun(2, ["-m", "hvd_adaptive.bench.merge_cost", "--config", str(cfg),
                   "--touched", "0.3", "--repeats", "1"], timeout=180)
    assert p.returncode == 0, explain(p)
    assert re.search(r"float32: weighted merge [0-9.]+, plain allreduce [0-9.]+", p.stdout), p.stdout



def test_the_step_cost_benchmark_interleaves_both_steps_and_times_the_row_operations():
    """`python -m hvd_adaptive.bench.step_cost --parts --ops`: the project's sync step and the
    plain Horovod script's in alternating blocks on real ranks, their ratio block by block, the
    timed step's parts, and the row-sparse operations on a real batch; model.hidden auto
    resolved from the training rows first, as a run resolves it."""
    p = mpirun(2, ["-m", "hvd_adaptive.bench.step_cost", "--config", "configs/tiny.yaml",
                   "--steps", "2", "--blocks", "3", "--parts", "--ops",
                   "--set", "model.hidden=auto"], timeout=240)
    assert p.returncode == 0, explain(p)
    assert "3 blocks of 2 steps each, interleaved" in p.stdout, p.stdout
    ms = {name: float(re.search(rf"^  {name} +([0-9.]+) \(quartiles", p.stdout, re.M).group(1))
          for name in ("sync", "sync, timed", "plain script")}
    assert all(v > 0 for v in ms.values()), ms
    ratio = float(re.search(r"sync / plain script, block by block: ([0-9.]+)", p.stdout).group(1))
    assert ratio > 0, p.stdout
    parts = dict(re.findall(r"(gradient|allreduce|update|batch building) ([0-9.]+)", p.stdout))
    assert set(parts) == {"gradient", "allreduce", "update", "batch building"}, p.stdout
    assert float(parts["gradient"]) > 0 and float(parts["update"]) > 0, parts
    ops = re.findall(r"^  (scatter-subtract|row write|unsorted segment sum|sorted segment sum)"
                     r"[^0-9]*([0-9.]+) ms$", p.stdout, re.M)
    assert len(ops) == 4 and all(float(v) > 0 for _, v in ops), p.stdout
