"""The workstation launcher, launch/train.sh: 2 ranks under horovodrun on the tiny config."""
import json
import os

import pytest

from mpirun import run as run_job

pytestmark = pytest.mark.mpi  # horovodrun starts real MPI ranks


def test_train_sh_two_ranks_under_horovodrun(tmp_path):
    run = tmp_path / "run"
    env = dict(os.environ, CONFIG="configs/tiny.yaml", NP="2", TF_CPP_MIN_LOG_LEVEL="2")
    p = run_job(["bash", "launch/train.sh", "--run-dir", str(run)], 240, env)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["ranks"] == 2 and len(summary["per_rank"]) == 2
    assert summary["final"]["p_at_1"] > summary["baseline_p_at_1"], summary
    # horovodrun makes mpirun tag every chunk of output; train.sh drops rank 0's tag at the
    # start of a line, so its progress lines read as written, and a line split into chunks
    # would still show a tag in its middle.
    progress = [line for line in p.stdout.splitlines() if "P@1" in line]
    assert progress and progress[-1].startswith("done: P@1"), p.stdout[-3000:]
    assert "[1,0]<stdout>:" not in p.stdout, p.stdout[-3000:]
