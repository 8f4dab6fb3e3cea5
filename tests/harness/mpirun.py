"""Runs commands as real MPI ranks (OpenMPI's mpirun) for the multi-rank tests."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from hvd_adaptive.train.run import mpirun_command

REPO = Path(__file__).resolve().parents[2]

# Pieces of the lines TensorFlow (through absl) prints at start-up in every process that imports
# it: the ranks, and horovodrun itself (it imports TensorFlow to check Horovod's build).
START_UP = ("absl::InitializeLog", "cpu_feature_guard", "This TensorFlow binary is optimized",
            "oneDNN custom operations", "rebuild TensorFlow with the appropriate compiler flags")


def start_up_lines(stderr: str) -> list[str]:
    """The lines of `stderr` that are TensorFlow's start-up messages."""
    return [line for line in stderr.splitlines() if any(s in line for s in START_UP)]


def mpi_env(**extra: str) -> dict:
    env = dict(os.environ)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
               # The ranks' programs (tests/*/ranks) import the harness as the package tests.harness.
               PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


@contextmanager
def job_group(argv: list[str], **popen) -> Iterator[subprocess.Popen]:
    """Starts a job in its own process group and ends the whole group afterwards.

    Killing mpirun (or a launcher script) alone can leave its Python ranks running, eating the
    machine's two cores for the tests after it; the group takes them all.
    """
    job = subprocess.Popen(argv, start_new_session=True, **popen)
    try:
        yield job
    finally:
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        job.wait()


def run(argv: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """subprocess.run with captured text output, in its own process group (see job_group)."""
    with job_group(argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                   text=True) as job:
        out, err = job.communicate(timeout=timeout)
    return subprocess.CompletedProcess(argv, job.returncode, out, err)


def mpirun(n: int, args: list[str], timeout: float = 240, **env: str) -> subprocess.CompletedProcess:
    """`mpirun -np n python ARGS...`; more ranks than cores are allowed (oversubscribed)."""
    cmd, _ = mpirun_command(n, args)
    return run(cmd, timeout, mpi_env(**env))


# The CLI in one process that exits 99 if it got as far as importing TensorFlow.
_BEFORE_TF = ("import sys\nfrom hvd_adaptive.cli import main\nrc = main(sys.argv[1:])\n"
              "sys.exit(99 if 'tensorflow' in sys.modules else rc)")


def before_tf(args: list[str], timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    """`hvd-adaptive ARGS` in one process for an error that must end it before TensorFlow
    starts: its exit status is 99 if TensorFlow was imported."""
    return run([sys.executable, "-c", _BEFORE_TF, *args], timeout, mpi_env(**env))


def train_args(run_dir: Path, *sets: str, config: str = "configs/tiny.yaml",
               resume: bool = False) -> list[str]:
    """The arguments of `python -m hvd_adaptive.cli train` into run_dir, each set a --set."""
    args = ["-m", "hvd_adaptive.cli", "train", "--config", config, "--run-dir", str(run_dir)]
    if resume:
        args.append("--resume")
    for s in sets:
        args += ["--set", s]
    return args


def train(n: int, run_dir: Path, *sets: str, config: str = "configs/tiny.yaml",
          timeout: float = 240) -> dict:
    """Trains through the real CLI on n ranks; returns summary.json (asserts success)."""
    p = mpirun(n, train_args(run_dir, *sets, config=config), timeout=timeout)
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout[-3000:]}\nstderr:\n{p.stderr[-3000:]}"
    return json.loads((run_dir / "summary.json").read_text())


def train_many(n: int, runs: dict[str, tuple[Path, tuple[str, ...]]],
               config: str = "configs/tiny.yaml", timeout: float = 300) -> dict[str, dict]:
    """Several runs, {name: (run folder, sets)}, one after another in one job of n ranks
    (tests/harness/train_runs.py); returns {name: summary.json} (asserts success)."""
    return train_many_job(n, runs, config, timeout)[0]


def train_many_job(n: int, runs: dict[str, tuple[Path, tuple[str, ...]]],
                   config: str = "configs/tiny.yaml", timeout: float = 300) -> tuple[dict[str, dict], str]:
    """train_many, and the job's stdout (the runs' lines, in order)."""
    specs = []
    for name, (run_dir, sets) in runs.items():
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        spec = run_dir.parent / f"{run_dir.name}.{name}.run.json"  # runs may share a folder
        spec.write_text(json.dumps({"config": config, "run_dir": str(run_dir), "sets": list(sets)}))
        specs.append(str(spec))
    p = mpirun(n, ["tests/harness/train_runs.py", *specs], timeout=timeout)
    assert p.returncode == 0, explain(p)
    return ({name: json.loads((run_dir / "summary.json").read_text()) for name, (run_dir, _) in runs.items()},
            p.stdout)


def records(run_dir: Path, event: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == event]


def explain(p: subprocess.CompletedProcess) -> str:
    """A failed job's output for an assertion message: the tail of stdout, the first traceback
    on stderr (where a rank's own error is; other ranks then report Horovod's shut-down), and
    the tail of stderr."""
    err = p.stderr
    first = err.find("Traceback")
    head = err[first:first + 4000] if first >= 0 else ""
    return (f"exit {p.returncode}\nstdout:\n{p.stdout[-2000:]}\nfirst traceback:\n{head}\n"
            f"stderr tail:\n{err[-2000:]}")


def train_tiny(args: list[str], ranks: int = 2, **env: str) -> subprocess.CompletedProcess:
    """`hvd-adaptive train --config configs/tiny.yaml ARGS` on `ranks` ranks (1: no launcher;
    0: one process that must end before TensorFlow starts, see mpirun.before_tf)."""
    argv = ["train", "--config", "configs/tiny.yaml", *args]
    if ranks > 1:
        return mpirun(ranks, ["-m", "hvd_adaptive.cli", *argv], timeout=120, **env)
    if ranks == 0:
        return before_tf(argv, **env)
    return run([sys.executable, "-m", "hvd_adaptive.cli", *argv], 120, mpi_env(**env))


def set_args(**kv) -> list[str]:
    """`--set key=value` arguments; a double underscore in a keyword stands for a dot."""
    return [a for k, v in kv.items() for a in ("--set", f"{k.replace('__', '.')}={v}")]
