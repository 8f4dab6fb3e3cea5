"""Real training jobs through slurm/train.sbatch and slurm/sweep.sbatch on a real Slurm cluster.

Run (as root, after `bash launch/setup.sh --slurm`):

    .venv/bin/python -m pytest tests/cluster/test_slurm_jobs.py

Jobs are submitted from the repository root, as the scripts' headers say, so they find the
venv as $SLURM_SUBMIT_DIR/.venv (or HVD_ADAPTIVE_VENV when set) and the relative config paths.
Every job is the tiny config on 2 tasks, the cluster's 2 CPUs: about 20 s a job here.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hvd_adaptive.cli import main as cli_main
from hvd_adaptive.bench.sweep import expand
from tests.harness.mpirun import REPO
from tests.harness.slurm_cluster import SlurmCluster


JOB_TIMEOUT = 240


def _venv_args() -> list[str]:
    # The scripts default to $SLURM_SUBMIT_DIR/.venv; a venv set elsewhere must reach the job.
    venv = os.environ.get("HVD_ADAPTIVE_VENV")
    return [f"--export=ALL,HVD_ADAPTIVE_VENV={venv}"] if venv else []


def _submit(cluster: SlurmCluster, args: list[str]):
    return cluster.sbatch_wait([*_venv_args(), *args], timeout=JOB_TIMEOUT, cwd=REPO)


def _explain(cluster: SlurmCluster, result, *outs: Path) -> str:
    parts = [f"sbatch rc={result.returncode} stdout={result.stdout!r} stderr={result.stderr!r}"]
    for out in outs:
        text = out.read_text(errors="replace") if out.exists() else "(missing)"
        parts.append(f"job output {out.name}:\n{text[-3000:]}")
    parts.append("slurmd log tail:\n" + "\n".join(cluster.slurmd_log().splitlines()[-20:]))
    return "\n".join(parts)


def _records(run: Path, event: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == event]


def test_train_sbatch_two_ranks(cluster):
    run = cluster.workdir / "runs" / "tiny"
    out = cluster.workdir / "jobs" / "train-tiny.out"
    result = _submit(cluster, ["--ntasks=2", f"--output={out}", "slurm/train.sbatch",
                               "--config", "configs/tiny.yaml", "--run-dir", str(run)])
    assert result.returncode == 0, _explain(cluster, result, out)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["ranks"] == 2 and len(summary["per_rank"]) == 2, summary
    assert summary["final"]["p_at_1"] > summary["baseline_p_at_1"], summary
    assert _records(run, "start")[0]["ranks"] == 2
    assert all(len(r["ranks"]) == 2 for r in _records(run, "round"))


def test_sweep_array_runs_every_point(cluster):
    root = cluster.workdir / "runs" / "sweep"
    out = cluster.workdir / "jobs" / "sweep-%a.out"
    outs = [Path(str(out).replace("%a", str(i))) for i in (0, 1)]
    # One task an element, so the two elements run side by side on the cluster's 2 CPUs
    # (two-rank jobs under srun: test_train_sbatch_two_ranks).
    result = _submit(cluster, ["--array=0-1", "--ntasks=1", f"--output={out}",
                               "slurm/sweep.sbatch", "configs/sweep_tiny.yaml", "--root", str(root),
                               "--set", "train.epochs=4"])
    assert result.returncode == 0, _explain(cluster, result, *outs)
    names = [p.name for p in expand(REPO / "configs" / "sweep_tiny.yaml")]
    assert names == ["train.algorithm=sync", "train.algorithm=local"]
    for index, name in enumerate(names):
        summary_path = root / "sweep_tiny" / name / "summary.json"
        assert summary_path.is_file(), _explain(cluster, result, *outs)
        summary = json.loads(summary_path.read_text())
        assert summary["algorithm"] == name.split("=")[1] and summary["ranks"] == 1, summary
        assert summary["final"]["epoch"] == 4.0  # --set reaches every point
        assert summary["final"]["p_at_1"] > summary["baseline_p_at_1"]
        text = outs[index].read_text(errors="replace")
        assert text.count(f"sweep point {index} of 2: {name}") == 1, text[-2000:]  # rank 0 only
    # The report reads a sweep's folders as they are.
    figure = root / "sweep.png"
    folders = sorted(str(f) for f in (root / "sweep_tiny").iterdir())
    assert cli_main(["report", *folders, "--out", str(figure)]) == 0
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("case, extra, needle", [
    # Rejected while parsing the config, before MPI or TensorFlow start.
    ("unknown-key", ["--set", "train.epochz=1"], "train.epochz: unknown key"),
    # Fails inside the job's MPI world (after TensorFlow and Horovod started on both ranks).
    ("missing-data", ["--set", "data.train=/nonexistent/train.txt",
                      "--set", "data.test=/nonexistent/test.txt"], "/nonexistent/train.txt"),
])
def test_failing_job_exits_non_zero(cluster, case, extra, needle):
    run = cluster.workdir / "runs" / case
    out = cluster.workdir / "jobs" / f"fail-{case}.out"
    result = _submit(cluster, ["--ntasks=2", f"--output={out}", "slurm/train.sbatch",
                               "--config", "configs/tiny.yaml", "--run-dir", str(run), *extra])
    assert result.returncode != 0, _explain(cluster, result, out)
    assert needle in out.read_text(errors="replace"), _explain(cluster, result, out)
    assert not (run / "summary.json").exists()
