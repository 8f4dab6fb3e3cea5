"""Runs commands as real MPI ranks (OpenMPI's mpirun) for the multi-rank tests."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def mpi_env(**extra: str) -> dict:
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
               PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""))
    env.update(extra)
    return env


def mpirun(n: int, args: list[str], timeout: float = 240, **env: str) -> subprocess.CompletedProcess:
    """`mpirun -np n python ARGS...`; more ranks than cores are allowed (oversubscribed)."""
    cmd = ["mpirun", "-np", str(n), "--oversubscribe", "--bind-to", "none",
           sys.executable, *args]
    return subprocess.run(cmd, env=mpi_env(**env), cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def train(n: int, run_dir: Path, *sets: str, config: str = "configs/tiny.yaml",
          timeout: float = 240) -> dict:
    """Trains through the real CLI on n ranks; returns summary.json (asserts success)."""
    args = ["-m", "hvd_adaptive.cli", "train", "--config", config, "--run-dir", str(run_dir)]
    for s in sets:
        args += ["--set", s]
    p = mpirun(n, args, timeout=timeout)
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"
    return json.loads((run_dir / "summary.json").read_text())


def records(run_dir: Path, event: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == event]
