"""The Slurm test harness itself, checked with real jobs on a real single-node cluster.

Run (as root, after `bash launch/setup.sh --slurm`):

    .venv/bin/python -m pytest tests/cluster/test_slurm_cluster.py

About 15 s: bring-up takes about a second, each job a second or two (polled every 0.1 s).
"""

from __future__ import annotations

import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.mpirun import REPO
from tests.harness.slurm_cluster import SlurmCluster

JOB_TIMEOUT = 120


def _explain(cluster: SlurmCluster, result, out: Path | None = None) -> str:
    parts = [f"sbatch rc={result.returncode} stdout={result.stdout!r} stderr={result.stderr!r}"]
    if out is not None:
        parts.append(f"job output: {out.read_text() if out.exists() else '(missing)'!r}")
    parts.append("slurmd log tail:\n" + "\n".join(cluster.slurmd_log().splitlines()[-20:]))
    return "\n".join(parts)


def test_one_task_job_runs_hostname(cluster):
    out = cluster.workdir / "jobs" / "hostname.out"
    result = cluster.sbatch_wait(["--ntasks=1", f"--output={out}", "--wrap", "hostname"],
                                 timeout=JOB_TIMEOUT)
    assert result.returncode == 0, _explain(cluster, result, out)
    assert result.stdout.strip().split(";")[0].isdigit(), _explain(cluster, result)
    assert out.read_text().split() == [socket.gethostname()], _explain(cluster, result, out)


def test_job_exit_code_is_returned(cluster):
    result = cluster.sbatch_wait(["--ntasks=1", "--wrap", "exit 3"], timeout=JOB_TIMEOUT)
    assert result.returncode == 3, _explain(cluster, result)


def test_two_mpi_ranks_under_srun_pmix(cluster):
    out = cluster.workdir / "jobs" / "mpi.out"
    code = ("from mpi4py import MPI; c = MPI.COMM_WORLD; "
            "print(c.Get_rank(), c.Get_size(), flush=True)")
    command = f"srun --mpi=pmix {shlex.quote(sys.executable)} -c {shlex.quote(code)}"
    result = cluster.sbatch_wait(["--ntasks=2", f"--output={out}", "--wrap", command],
                                 timeout=JOB_TIMEOUT)
    assert result.returncode == 0, _explain(cluster, result, out)
    assert sorted(out.read_text().splitlines()) == ["0 2", "1 2"], _explain(cluster, result, out)


@pytest.fixture(scope="module")
def stand_in_venv(cluster):
    """A venv whose python only reports how each rank was called, so the Slurm scripts can be
    checked without the real CLI: it prints its rank and arguments and exits with $FAKE_EXIT."""
    venv = cluster.workdir / "stand-in-venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    python = venv / "bin" / "python"
    python.write_text('#!/bin/sh\necho "rank=$SLURM_PROCID args=$*"\nexit "${FAKE_EXIT:-0}"\n')
    python.chmod(0o755)
    return venv


@pytest.mark.parametrize("script", ["train.sbatch", "sweep.sbatch"])
def test_sbatch_scripts_parse(script):
    subprocess.run(["bash", "-n", str(REPO / "slurm" / script)], check=True)


def test_train_sbatch_passes_args_and_exit_code(cluster, stand_in_venv):
    out = cluster.workdir / "jobs" / "train.out"
    result = cluster.sbatch_wait(
        ["--ntasks=2", f"--output={out}",
         f"--export=ALL,HVD_ADAPTIVE_VENV={stand_in_venv},FAKE_EXIT=5",
         str(REPO / "slurm" / "train.sbatch"), "--config", "configs/tiny.yaml"],
        timeout=JOB_TIMEOUT)
    assert result.returncode == 5, _explain(cluster, result, out)
    job_id = result.stdout.strip().split(";")[0]
    args = f"-m hvd_adaptive.cli train --run-dir runs/{job_id} --config configs/tiny.yaml"
    ranks = sorted(line for line in out.read_text().splitlines() if line.startswith("rank="))
    assert ranks == [f"rank=0 args={args}", f"rank=1 args={args}"], _explain(cluster, result, out)


def test_sweep_sbatch_runs_one_point_per_array_element(cluster, stand_in_venv):
    out = cluster.workdir / "jobs" / "sweep-%a.out"
    result = cluster.sbatch_wait(
        ["--array=0-1", "--ntasks=1", f"--output={out}",
         f"--export=ALL,HVD_ADAPTIVE_VENV={stand_in_venv}",
         str(REPO / "slurm" / "sweep.sbatch"), "configs/sweep.yaml", "--dry-run"],
        timeout=JOB_TIMEOUT)
    assert result.returncode == 0, _explain(cluster, result)
    for index in (0, 1):
        text = Path(str(out).replace("%a", str(index))).read_text()
        expected = (f"rank=0 args=-m hvd_adaptive.cli sweep run configs/sweep.yaml "
                    f"--index {index} --dry-run")
        assert expected in text.splitlines(), _explain(cluster, result) + "\n" + text


def test_the_clusters_ports_lie_below_the_ephemeral_range():
    """Ports the kernel picks for connections inside the namespaced nodes cannot be the ones a
    node's slurmd must bind there (slurm_cluster._free_port)."""
    from tests.harness.slurm_cluster import _ephemeral_low, _free_port

    lo = _ephemeral_low()
    ports = {_free_port() for _ in range(20)}
    assert all(1024 <= p < lo for p in ports), (sorted(ports), lo)
    for p in ports:  # free here when picked
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", p))
